// An agent paying per call from a payment session, with the stock x402 v2 fetch wrapper and the escrow-session
// client scheme: the first call opens the session (one request to the service), later calls pay from it. Run
// (SETTLEMENT_URL names the service, default http://127.0.0.1:3000):
//   PAYER_API_KEY=… PAYER_AGENT_ID=… X402_NETWORK=… TOOL_URL=http://127.0.0.1:4021 \
//   node --import tsx examples/session-tool/caller.ts
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client, type Network } from '@x402/fetch';
import { pathToFileURL } from 'node:url';
import { EscrowSessionClientScheme } from 'agent-settlement/x402/session-client';

export interface SessionFetchOptions {
  serviceUrl: string;
  /** The payer's API key (x402:write). */
  apiKey: string;
  payerAgentId: string;
  network: Network;
  /** What each session reserves (minor units). */
  budget: number;
  /** The fetch the wrapper and the scheme call (default globalThis.fetch). */
  fetch?: typeof globalThis.fetch;
}

/** A paying fetch and close(), which closes the sessions it opened (their unspent budget goes back). */
export function sessionPayingFetch(o: SessionFetchOptions) {
  const scheme = new EscrowSessionClientScheme({
    serviceUrl: o.serviceUrl,
    apiKey: o.apiKey,
    payerAgentId: o.payerAgentId,
    budget: o.budget,
    ...(o.fetch ? { fetch: o.fetch } : {}),
  });
  const client = new x402Client().register(o.network, scheme);
  return { fetch: wrapFetchWithPayment(o.fetch ?? globalThis.fetch, client), close: () => scheme.close() };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const env = (name: string) =>
    process.env[name] ??
    (() => {
      throw new Error(`${name} is required`);
    })();
  const serviceUrl = process.env.SETTLEMENT_URL ?? 'http://127.0.0.1:3000';
  console.log(`settlement service: ${serviceUrl} (SETTLEMENT_URL; default http://127.0.0.1:3000)`);
  const paying = sessionPayingFetch({
    serviceUrl,
    apiKey: env('PAYER_API_KEY'),
    payerAgentId: env('PAYER_AGENT_ID'),
    network: env('X402_NETWORK') as Network,
    budget: 100,
  });
  for (const path of ['/search?q=x402', '/search?q=sessions', '/rows?n=3', '/rows?n=0']) {
    const res = await paying.fetch(env('TOOL_URL') + path);
    const receipt = res.headers.get('PAYMENT-RESPONSE');
    console.log(path, res.status, await res.json(), receipt ? decodePaymentResponseHeader(receipt) : null);
  }
  await paying.close();
}
