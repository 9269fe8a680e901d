// An agent paying a tool priced per token from a payment session, with the stock x402 v2 fetch wrapper: the session
// is opened with the tool's price schedule and pays acknowledged usage only; after reading each response, the caller
// checks the payee's usage record against the call and the body it received and acknowledges it (the payer agent's
// signature), in batches. Run (SETTLEMENT_URL names the service, default http://127.0.0.1:3000):
//   PAYER_API_KEY=… PAYER_AGENT_ID=… PAYER_PRIVATE_KEY=… X402_NETWORK=… TOOL_URL=http://127.0.0.1:4022 \
//   node --import tsx examples/metered-tool/caller.ts
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client, type Network } from '@x402/fetch';
import type { KeyObject } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { agentKeyPairFromPrivateKey, type UsageRecord } from 'agent-settlement-client';
import { EscrowSessionClientScheme } from 'agent-settlement/x402/session-client';

export interface MeteredFetchOptions {
  serviceUrl: string;
  /** The payer's API key (x402:write). */
  apiKey: string;
  payerAgentId: string;
  /** The payer agent's registered key: acknowledges the usage it read. */
  payerKey: { keyId: string; privateKey: KeyObject };
  network: Network;
  /** What each session reserves (minor units). */
  budget: number;
  /** Acknowledge a response's usage only if this holds (default: every record that fits the call and the body). */
  accept?: (record: UsageRecord, body: Uint8Array) => boolean;
  ackBatchSize?: number;
  fetch?: typeof globalThis.fetch;
}

/** A paying fetch that acknowledges the usage of each response it returns, and close(). */
export function meteredPayingFetch(o: MeteredFetchOptions) {
  const scheme = new EscrowSessionClientScheme({
    serviceUrl: o.serviceUrl,
    apiKey: o.apiKey,
    payerAgentId: o.payerAgentId,
    budget: o.budget,
    payerKey: o.payerKey,
    requireAcknowledgedUsage: true,
    ...(o.ackBatchSize ? { ackBatchSize: o.ackBatchSize } : {}),
    ...(o.fetch ? { fetch: o.fetch } : {}),
  });
  const paid = wrapFetchWithPayment(o.fetch ?? globalThis.fetch, new x402Client().register(o.network, scheme));
  const fetch = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const res = await paid(input, init);
    await scheme.acknowledge(res, o.accept);
    return res;
  };
  return { fetch, close: () => scheme.close() };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const env = (name: string) =>
    process.env[name] ??
    (() => {
      throw new Error(`${name} is required`);
    })();
  const serviceUrl = process.env.SETTLEMENT_URL ?? 'http://127.0.0.1:3000';
  console.log(`settlement service: ${serviceUrl} (SETTLEMENT_URL; default http://127.0.0.1:3000)`);
  const paying = meteredPayingFetch({
    serviceUrl,
    apiKey: env('PAYER_API_KEY'),
    payerAgentId: env('PAYER_AGENT_ID'),
    payerKey: agentKeyPairFromPrivateKey(env('PAYER_PRIVATE_KEY')),
    network: env('X402_NETWORK') as Network,
    budget: 200,
  });
  for (const path of ['/complete?prompt=hello+metered+world&repeat=3', '/complete?prompt=one']) {
    const res = await paying.fetch(env('TOOL_URL') + path);
    const receipt = res.headers.get('PAYMENT-RESPONSE');
    console.log(path, res.status, await res.json(), receipt ? decodePaymentResponseHeader(receipt) : null);
  }
  await paying.close();
}
