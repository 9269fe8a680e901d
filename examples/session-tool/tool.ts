// A tool paid through x402 payment sessions: express routes behind the stock x402 v2 middleware, with the
// `escrow-session` scheme and the Agent Run Settlement Service as facilitator. `GET /search` has a fixed price;
// `GET /rows?n=N` is metered: its price is a maximum, and the route charges what it served (per row, zero included)
// with the middleware's settlement overrides. Run (SETTLEMENT_URL names the service, default http://127.0.0.1:3000):
// PROVIDER_API_KEY=… PAYEE_AGENT_ID=… X402_NETWORK=agentstl:default node --import tsx examples/session-tool/tool.ts
import express from 'express';
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer, type Network } from '@x402/express';
import { pathToFileURL } from 'node:url';
import { escrowGateFacilitator } from 'agent-settlement/x402/facilitator';
import { EscrowSessionServerScheme } from 'agent-settlement/x402/server';

export interface SessionToolOptions {
  serviceUrl: string;
  /** The provider's API key (x402:write) in the payee's tenant. */
  apiKey: string;
  network: Network;
  payeeAgentId: string;
  /** The price of a search (default "$0.05"). */
  searchPrice?: string;
  /** Minor units per row served by /rows, and the most rows one call serves (its price is their product). */
  rowPrice?: number;
  maxRows?: number;
}

export function createSessionTool(o: SessionToolOptions) {
  const rowPrice = o.rowPrice ?? 2;
  const maxRows = o.maxRows ?? 10;
  const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl: o.serviceUrl, apiKey: o.apiKey })).register(
    o.network,
    new EscrowSessionServerScheme(),
  );
  const accepts = (price: string | { amount: string; asset: string }) => ({
    scheme: 'escrow-session',
    network: o.network,
    payTo: o.payeeAgentId,
    price,
  });
  const app = express();
  app.use(
    paymentMiddleware(
      {
        'GET /search': { accepts: accepts(o.searchPrice ?? '$0.05'), description: 'search' },
        'GET /rows': {
          accepts: accepts({ amount: String(rowPrice * maxRows), asset: 'USD' }),
          description: `up to ${maxRows} rows at ${rowPrice} each`,
        },
      },
      server,
    ),
  );
  app.get('/search', (req, res) => {
    res.json({ query: String(req.query.q ?? ''), results: ['first hit'] });
  });
  app.get('/rows', (req, res) => {
    const n = Math.max(0, Math.min(maxRows, Math.floor(Number(req.query.n ?? 0)) || 0));
    // Metered: charge what was served, not the maximum the payer authorized.
    setSettlementOverrides(res, { amount: String(n * rowPrice) });
    res.json({ rows: Array.from({ length: n }, (_, i) => ({ row: i + 1 })) });
  });
  return app;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const env = (name: string) =>
    process.env[name] ??
    (() => {
      throw new Error(`${name} is required`);
    })();
  const serviceUrl = process.env.SETTLEMENT_URL ?? 'http://127.0.0.1:3000';
  console.log(`settlement service: ${serviceUrl} (SETTLEMENT_URL; default http://127.0.0.1:3000)`);
  const app = createSessionTool({
    serviceUrl,
    apiKey: env('PROVIDER_API_KEY'),
    network: env('X402_NETWORK') as Network,
    payeeAgentId: env('PAYEE_AGENT_ID'),
  });
  const port = Number(process.env.PORT ?? 4021);
  app.listen(port, '127.0.0.1', () => console.log(`session tool on http://127.0.0.1:${port}/search and /rows?n=3`));
}
