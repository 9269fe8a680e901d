// A tool priced per token, paid with witnessed usage through the stock x402 v2 middleware: `GET /complete?prompt=…`
// answers a completion and states the tokens it used (setUsage); the `escrow-session` server scheme signs that
// usage record with the payee agent's key at settle, and the Agent Run Settlement Service, as facilitator, charges
// the session the schedule's price of it (1 minor unit per 10 tokens here, at least 1, at most the route's price).
// Run (SETTLEMENT_URL names the service, default http://127.0.0.1:3000):
//   PROVIDER_API_KEY=… PAYEE_AGENT_ID=… PAYEE_PRIVATE_KEY=<PKCS#8 PEM or base64url seed> X402_NETWORK=agentstl:default \
//   node --import tsx examples/metered-tool/tool.ts
import express from 'express';
import { paymentMiddleware, x402ResourceServer, type Network } from '@x402/express';
import type { KeyObject } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { agentKeyPairFromPrivateKey } from 'agent-settlement-client';
import { escrowGateFacilitator } from 'agent-settlement/x402/facilitator';
import { EscrowSessionServerScheme, setUsage } from 'agent-settlement/x402/server';

export interface MeteredToolOptions {
  serviceUrl: string;
  /** The provider's API key (x402:write) in the payee's tenant. */
  apiKey: string;
  network: Network;
  payeeAgentId: string;
  /** The payee agent's registered key: signs the usage of each call. */
  payeeKey: { keyId: string; privateKey: KeyObject };
  /** Minor units per `per` tokens (default 1 per 10), and the most one call may cost (default 50: 500 tokens). */
  price?: number;
  per?: number;
  maxPerCall?: number;
}

/** A stand-in model: one token per word, the prompt's words echoed as many times as asked. */
function complete(prompt: string, repeat: number): { text: string; tokens: number } {
  const words = prompt.split(/\s+/).filter(Boolean);
  const out = Array.from({ length: repeat }, () => words).flat();
  return { text: out.join(' '), tokens: words.length + out.length };
}

export function createMeteredTool(o: MeteredToolOptions) {
  const pricing = { prices: { tokens: { price: o.price ?? 1, per: o.per ?? 10 } }, minimum: 1 };
  const maxPerCall = o.maxPerCall ?? 50;
  const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl: o.serviceUrl, apiKey: o.apiKey })).register(
    o.network,
    new EscrowSessionServerScheme({ pricing, payeeKey: o.payeeKey }),
  );
  const app = express();
  app.use(
    paymentMiddleware(
      {
        'GET /complete': {
          accepts: {
            scheme: 'escrow-session',
            network: o.network,
            payTo: o.payeeAgentId,
            price: { amount: String(maxPerCall), asset: 'USD' },
          },
          description: `a completion at ${pricing.prices.tokens.price} per ${pricing.prices.tokens.per} tokens, at most ${maxPerCall}`,
        },
      },
      server,
    ),
  );
  app.get('/complete', (req, res) => {
    const { text, tokens } = complete(String(req.query.prompt ?? ''), Math.max(0, Number(req.query.repeat ?? 1) || 0));
    // What the call used: signed by the payee at settle, priced by the session, checked by the payer.
    setUsage(res, { tokens });
    res.json({ text, tokens });
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
  const app = createMeteredTool({
    serviceUrl,
    apiKey: env('PROVIDER_API_KEY'),
    network: env('X402_NETWORK') as Network,
    payeeAgentId: env('PAYEE_AGENT_ID'),
    payeeKey: agentKeyPairFromPrivateKey(env('PAYEE_PRIVATE_KEY')),
  });
  const port = Number(process.env.PORT ?? 4022);
  app.listen(port, '127.0.0.1', () =>
    console.log(`metered tool on http://127.0.0.1:${port}/complete?prompt=hello+world&repeat=3`),
  );
}
