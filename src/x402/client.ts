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
import {
  MAX_QUOTE_TTL_SECONDS,
  requestBindingOf,
  X402_SCHEME,
  X402_USD_ASSET,
  x402RequestSha256,
  type X402RequestBinding,
} from '../domain/x402.ts';

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
 * What a payer's scheme of this service holds: where the service is, the payer's key, and a POST that carries an
 * Idempotency-Key and waits out a duplicate still in progress (a refusal throws EscrowGatePaymentError with the
 * service's code). USD is a default asset (cents), so the stock client's spend controls ("$1" per payment unless
 * raised) apply.
 */
export abstract class ServiceClientScheme {
  abstract readonly scheme: string;
  protected readonly serviceUrl: string;
  protected readonly fetch: typeof globalThis.fetch;

  constructor(private readonly service: { serviceUrl: string; apiKey: string; fetch?: typeof globalThis.fetch }) {
    this.serviceUrl = service.serviceUrl.replace(/\/$/, '');
    this.fetch = service.fetch ?? globalThis.fetch;
  }

  findDefaultAsset(asset: string) {
    return asset === X402_USD_ASSET.asset ? X402_USD_ASSET : undefined;
  }

  /** The request the requirement names (written by this project's server scheme of the same name), or an error. */
  protected bindingOf(requirements: PaymentRequirements): X402RequestBinding {
    const binding = requestBindingOf(requirements.extra);
    if (!binding)
      throw new Error(
        `the payment requirements name no request (extra.method and extra.resource): the provider must use the ${this.scheme} server scheme`,
      );
    return binding;
  }

  protected async post<T>(path: string, idempotencyKey: string, body: Record<string, unknown>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      const res = await this.fetch(`${this.serviceUrl}${path}`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${this.service.apiKey}`,
          'content-type': 'application/json',
          'idempotency-key': idempotencyKey,
        },
        body: JSON.stringify(body),
      });
      const answer = (await res.json().catch(() => ({}))) as { code?: string; message?: string };
      if (res.ok) return answer as T;
      if (res.status === 409 && answer.code === 'IDEMPOTENCY_IN_PROGRESS' && attempt < IN_PROGRESS_RETRIES) {
        await new Promise((resolve) => setTimeout(resolve, IN_PROGRESS_WAIT_MS));
        continue;
      }
      throw new EscrowGatePaymentError(
        res.status,
        answer.code ?? 'HTTP_ERROR',
        answer.message ?? `the service answered ${res.status} to ${path}`,
      );
    }
  }
}

export class EscrowGateClientScheme extends ServiceClientScheme implements SchemeNetworkClient {
  readonly scheme = X402_SCHEME;

  constructor(private readonly options: EscrowGateClientOptions) {
    super(options);
  }

  async createPaymentPayload(x402Version: number, requirements: PaymentRequirements): Promise<PaymentPayloadResult> {
    const binding = this.bindingOf(requirements);
    const requestSha256 = x402RequestSha256(binding);
    const keyBase = `x402-${sha256Hex(canonicalize({ payer: this.options.payerAgentId, requirements })).slice(0, 40)}`;
    const extra = requirements.extra;

    const gate = await this.post<{ gateId: string }>('/x402/gate/create', `${keyBase}:gate`, {
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
    const quote = await this.post<{ quoteId: string }>('/x402/gate/quote', `${keyBase}:quote`, {
      gateId: gate.gateId,
      requestSha256,
      ttlSeconds,
    });
    const bound = { gateId: gate.gateId, quoteId: quote.quoteId, requestSha256 };
    let walletDecisionToken: string | undefined;
    if (this.options.sponsorWalletId) {
      const decision = await this.post<{ walletDecisionToken: string }>(
        `/x402/wallets/${encodeURIComponent(this.options.sponsorWalletId)}/authorize`,
        `${keyBase}:wallet`,
        bound,
      );
      walletDecisionToken = decision.walletDecisionToken;
    }
    const authorization = await this.post<{ token: string }>('/x402/gate/authorize-payment', `${keyBase}:authorize`, {
      ...bound,
      ...(walletDecisionToken ? { walletDecisionToken } : {}),
    });
    return { x402Version, payload: { token: authorization.token, ...bound } };
  }
}
