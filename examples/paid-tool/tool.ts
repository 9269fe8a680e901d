// A paid tool: an express route protected by the stock x402 v2 middleware, paid through the escrow-gate scheme,
// with the Agent Run Settlement Service as facilitator. Run: SERVICE_URL=… PROVIDER_API_KEY=… PAYEE_AGENT_ID=…
// X402_NETWORK=agent-settlement:default node --import tsx examples/paid-tool/tool.ts
import express from 'express';
import { paymentMiddleware, x402ResourceServer, type Network } from '@x402/express';
import { pathToFileURL } from 'node:url';
import { escrowGateFacilitator } from 'agent-settlement/x402/facilitator';
import { EscrowGateServerScheme } from 'agent-settlement/x402/server';

export interface PaidToolOptions {
  serviceUrl: string;
  /** The provider's API key (x402:write) in the payee's tenant. */
  apiKey: string;
  network: Network;
  payeeAgentId: string;
  price?: string;
  holdbackBps?: number;
  /** The tool's work; runs only for a verified payment. */
  search?: (query: string) => unknown;
}

export function createPaidTool(o: PaidToolOptions) {
  const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl: o.serviceUrl, apiKey: o.apiKey }))
    .register(o.network, new EscrowGateServerScheme({ holdbackBps: o.holdbackBps ?? 0 }));
  const search = o.search ?? ((query: string) => ({ query, results: [`${query}: first hit`] }));
  const app = express();
  app.use(paymentMiddleware({ 'GET /search': { accepts: { scheme: 'escrow-gate', network: o.network, payTo: o.payeeAgentId, price: o.price ?? '$0.10' }, description: 'search' } }, server));
  app.get('/search', (req, res) => {
    res.json(search(String(req.query.q ?? '')));
  });
  return app;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const env = (name: string) => process.env[name] ?? (() => { throw new Error(`${name} is required`); })();
  const app = createPaidTool({ serviceUrl: env('SERVICE_URL'), apiKey: env('PROVIDER_API_KEY'), network: env('X402_NETWORK') as Network, payeeAgentId: env('PAYEE_AGENT_ID') });
  const port = Number(process.env.PORT ?? 4020);
  app.listen(port, '127.0.0.1', () => console.log(`paid tool on http://127.0.0.1:${port}/search`));
}
