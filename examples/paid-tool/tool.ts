// A paid tool: express routes protected by the stock x402 v2 middleware, paid through the escrow-gate scheme, with
// the Agent Run Settlement Service as facilitator. `GET /search` has a fixed price; `GET /summarize?words=N` is
// metered: its price is a maximum, and the handler charges per word it actually returned. Run (SETTLEMENT_URL names
// the service, default http://127.0.0.1:3000): PROVIDER_API_KEY=… PAYEE_AGENT_ID=… X402_NETWORK=agentstl:default
//   node --import tsx examples/paid-tool/tool.ts
import express from 'express';
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer, type Network } from '@x402/express';
import { pathToFileURL } from 'node:url';
import { escrowGateFacilitator } from 'agent-settlement/x402/facilitator';
import { EscrowGateServerScheme } from 'agent-settlement/x402/server';

const TEXT = 'The ledger balances after every step under crashes and retries and so does every reserve it holds';

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
  /** Metered summaries: the most words one may have (default 50) and the price of each, in cents (default 1). */
  maxWords?: number;
  centsPerWord?: number;
  /** The summary's words, at most `words` of them (default: the first words of a fixed text, which has 17). */
  summarize?: (words: number) => string[];
}

export function createPaidTool(o: PaidToolOptions) {
  const facilitator = escrowGateFacilitator({ serviceUrl: o.serviceUrl, apiKey: o.apiKey });
  const holdbackBps = o.holdbackBps ?? 0;
  const fixed = new x402ResourceServer(facilitator).register(o.network, new EscrowGateServerScheme({ holdbackBps }));
  // A metered scheme marks its requirements' price as a maximum (extra.metered): the payer locks the maximum.
  const metered = new x402ResourceServer(facilitator).register(
    o.network,
    new EscrowGateServerScheme({ holdbackBps, metered: true }),
  );
  const search = o.search ?? ((query: string) => ({ query, results: [`${query}: first hit`] }));
  const maxWords = o.maxWords ?? 50;
  const centsPerWord = o.centsPerWord ?? 1;
  const summarize = o.summarize ?? ((words: number) => TEXT.split(' ').slice(0, words));
  const accepts = (price: string | { amount: string; asset: string }) => ({
    scheme: 'escrow-gate',
    network: o.network,
    payTo: o.payeeAgentId,
    price,
  });

  const app = express();
  app.use(paymentMiddleware({ 'GET /search': { accepts: accepts(o.price ?? '$0.10'), description: 'search' } }, fixed));
  app.use(
    paymentMiddleware(
      {
        'GET /summarize': {
          accepts: accepts({ amount: String(maxWords * centsPerWord), asset: 'USD' }),
          description: `summary, ${centsPerWord} cent(s) a word, at most ${maxWords} words`,
        },
      },
      metered,
    ),
  );
  app.get('/search', (req, res) => {
    res.json(search(String(req.query.q ?? '')));
  });
  app.get('/summarize', (req, res) => {
    const asked = Number.parseInt(String(req.query.words ?? maxWords), 10);
    const words = summarize(Number.isSafeInteger(asked) ? Math.min(Math.max(asked, 0), maxWords) : maxWords);
    const charged = words.length * centsPerWord;
    // What the call cost, in the asset's minor units: settle charges this and returns the rest of the maximum.
    setSettlementOverrides(res, { amount: String(charged) });
    res.json({ summary: words.join(' '), words: words.length, charged });
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
  const app = createPaidTool({
    serviceUrl,
    apiKey: env('PROVIDER_API_KEY'),
    network: env('X402_NETWORK') as Network,
    payeeAgentId: env('PAYEE_AGENT_ID'),
  });
  const port = Number(process.env.PORT ?? 4020);
  app.listen(port, '127.0.0.1', () =>
    console.log(`paid tool on http://127.0.0.1:${port}/search and /summarize?words=N`),
  );
}
