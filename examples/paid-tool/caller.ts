// An agent calling a paid tool with the stock x402 v2 fetch wrapper and the escrow-gate client scheme. Run
// (SETTLEMENT_URL names the service, default http://127.0.0.1:3000):
//   PAYER_API_KEY=… PAYER_AGENT_ID=… X402_NETWORK=… TOOL_URL=http://127.0.0.1:4020/search?q=x402 \
//   node --import tsx examples/paid-tool/caller.ts
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client, type Network } from '@x402/fetch';
import { pathToFileURL } from 'node:url';
import { EscrowGateClientScheme } from 'agent-settlement/x402/client';

export interface PayingFetchOptions {
  serviceUrl: string;
  /** The payer's API key (x402:write, agents:write). */
  apiKey: string;
  payerAgentId: string;
  network: Network;
  /** Raises the stock client's spend cap (default "$1" per payment). */
  maxAmountPerPayment?: string;
  /** The fetch the wrapper calls (default globalThis.fetch). */
  fetch?: typeof globalThis.fetch;
}

export function payingFetch(o: PayingFetchOptions) {
  const client = new x402Client().register(
    o.network,
    new EscrowGateClientScheme({ serviceUrl: o.serviceUrl, apiKey: o.apiKey, payerAgentId: o.payerAgentId }),
  );
  if (o.maxAmountPerPayment) client.setSpendControls({ maxAmountPerPayment: o.maxAmountPerPayment });
  return wrapFetchWithPayment(o.fetch ?? globalThis.fetch, client);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const env = (name: string) =>
    process.env[name] ??
    (() => {
      throw new Error(`${name} is required`);
    })();
  const serviceUrl = process.env.SETTLEMENT_URL ?? 'http://127.0.0.1:3000';
  console.log(`settlement service: ${serviceUrl} (SETTLEMENT_URL; default http://127.0.0.1:3000)`);
  const paidFetch = payingFetch({
    serviceUrl,
    apiKey: env('PAYER_API_KEY'),
    payerAgentId: env('PAYER_AGENT_ID'),
    network: env('X402_NETWORK') as Network,
  });
  const res = await paidFetch(env('TOOL_URL'));
  const receipt = res.headers.get('PAYMENT-RESPONSE');
  console.log(res.status, await res.json(), receipt ? decodePaymentResponseHeader(receipt) : null);
}
