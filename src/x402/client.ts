// The payer's side of the `escrow-gate` x402 scheme, for the stock x402 v2 client:
//
//   const client = new x402Client().register(network, new EscrowGateClientScheme({ serviceUrl, apiKey, payerAgentId }));
//   const paidFetch = wrapFetchWithPayment(fetch, client);
//
// Paying is three calls to the Agent Run Settlement Service with the payer's key: create a gate (locks the amount in
// escrow), quote it for this request, authorize the payment. The spend token that answers is the payment. Each call
// carries an Idempotency-Key derived from the requirement (which names the request and a per-402 nonce), so a retry
// of the same payment repeats nothing. Runs in the payer's process: it imports only pure domain modules.
import type { PaymentPayloadResult, PaymentRequirements, SchemeNetworkClient } from '@x402/core/types';
import { canonicalize } from '../domain/canonical-json.ts';
import { sha256Hex } from '../domain/crypto.ts';
import { MAX_QUOTE_TTL_SECONDS, requestBindingOf, X402_SCHEME, X402_USD_ASSET, x402RequestSha256 } from '../domain/x402.ts';

export interface EscrowGateClientOptions {
  /** The service's base URL, e.g. https://settlement.example.com */
  serviceUrl: string;
  /** The payer's API key (`sk_…`, scopes x402:write and agents:write). Sent only to serviceUrl. */
  apiKey: string;
  payerAgentId: string;
  /** A sponsor wallet of the tenant that pays instead of the payer's own wallet (its policy then applies). */
  sponsorWalletId?: string;
  fetch?: typeof globalThis.fetch;
}

/** A refusal by the service, with its error code (e.g. INSUFFICIENT_FUNDS, X402_WALLET_POLICY_VIOLATION). */
export class EscrowGatePaymentError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`${code}: ${message}`);
    this.name = 'EscrowGatePaymentError';
  }
}

/** A duplicate still being processed by the service answers 409 IDEMPOTENCY_IN_PROGRESS: wait, then ask again. */
const IN_PROGRESS_RETRIES = 20;
const IN_PROGRESS_WAIT_MS = 100;

/**
 * A POST to the service with the payer's key and an Idempotency-Key; a duplicate still in progress is waited for.
 * Throws EscrowGatePaymentError with the service's error code when it refuses.
 */
export async function postToService<T>(
  to: { fetch: typeof globalThis.fetch; serviceUrl: string; apiKey: string },
  path: string,
  idempotencyKey: string,
  body: Record<string, unknown>,
): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    const res = await to.fetch(`${to.serviceUrl}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${to.apiKey}`, 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
      body: JSON.stringify(body),
    });
    const answer = (await res.json().catch(() => ({}))) as { code?: string; message?: string };
    if (res.ok) return answer as T;
    if (res.status === 409 && answer.code === 'IDEMPOTENCY_IN_PROGRESS' && attempt < IN_PROGRESS_RETRIES) {
      await new Promise((resolve) => setTimeout(resolve, IN_PROGRESS_WAIT_MS));
      continue;
    }
    throw new EscrowGatePaymentError(res.status, answer.code ?? 'HTTP_ERROR', answer.message ?? `the service answered ${res.status} to ${path}`);
  }
}

export class EscrowGateClientScheme implements SchemeNetworkClient {
  readonly scheme = X402_SCHEME;
  private readonly serviceUrl: string;
  private readonly fetch: typeof globalThis.fetch;

  constructor(private readonly options: EscrowGateClientOptions) {
    this.serviceUrl = options.serviceUrl.replace(/\/$/, '');
    this.fetch = options.fetch ?? globalThis.fetch;
  }

  /** USD is a default asset (cents), so the stock client's spend controls ("$1" per payment unless raised) apply. */
  findDefaultAsset(asset: string) {
    return asset === X402_USD_ASSET.asset ? X402_USD_ASSET : undefined;
  }

  async createPaymentPayload(x402Version: number, requirements: PaymentRequirements): Promise<PaymentPayloadResult> {
    const binding = requestBindingOf(requirements.extra);
    if (!binding) throw new Error('the payment requirements name no request (extra.method and extra.resource): the provider must use the escrow-gate server scheme');
    const requestSha256 = x402RequestSha256(binding);
    const keyBase = `x402-${sha256Hex(canonicalize({ payer: this.options.payerAgentId, requirements })).slice(0, 40)}`;
    const extra = requirements.extra;

    const gate = await this.call<{ gateId: string }>('/x402/gate/create', `${keyBase}:gate`, {
      payerAgentId: this.options.payerAgentId,
      payeeAgentId: requirements.payTo,
      amount: Number(requirements.amount),
      currency: requirements.asset,
      ...(typeof extra.holdbackBps === 'number' ? { holdbackBps: extra.holdbackBps } : {}),
      ...(typeof extra.disputeWindowSeconds === 'number' ? { disputeWindowSeconds: extra.disputeWindowSeconds } : {}),
      ...(typeof extra.toolId === 'string' ? { toolId: extra.toolId } : {}),
      ...(this.options.sponsorWalletId ? { sponsorWalletId: this.options.sponsorWalletId } : {}),
    });
    const ttlSeconds = Math.min(Math.max(requirements.maxTimeoutSeconds, 1), MAX_QUOTE_TTL_SECONDS);
    const quote = await this.call<{ quoteId: string }>('/x402/gate/quote', `${keyBase}:quote`, { gateId: gate.gateId, requestSha256, ttlSeconds });
    const bound = { gateId: gate.gateId, quoteId: quote.quoteId, requestSha256 };
    let walletDecisionToken: string | undefined;
    if (this.options.sponsorWalletId) {
      const decision = await this.call<{ walletDecisionToken: string }>(`/x402/wallets/${encodeURIComponent(this.options.sponsorWalletId)}/authorize`, `${keyBase}:wallet`, bound);
      walletDecisionToken = decision.walletDecisionToken;
    }
    const authorization = await this.call<{ token: string }>('/x402/gate/authorize-payment', `${keyBase}:authorize`, { ...bound, ...(walletDecisionToken ? { walletDecisionToken } : {}) });
    return { x402Version, payload: { token: authorization.token, ...bound } };
  }

  private call<T>(path: string, idempotencyKey: string, body: Record<string, unknown>): Promise<T> {
    return postToService<T>({ fetch: this.fetch, serviceUrl: this.serviceUrl, apiKey: this.options.apiKey }, path, idempotencyKey, body);
  }
}
