// The payer's side of the `escrow-session` x402 scheme, for the stock x402 v2 client:
//
//   const client = new x402Client().register(network, new EscrowSessionClientScheme({ serviceUrl, apiKey, payerAgentId, budget: 500 }));
//   const paidFetch = wrapFetchWithPayment(fetch, client);
//
// The first paid call toward a payee opens a payment session with the service (one request: the budget is reserved
// from the payer's wallet once); every later call pays from it with no request to the service at all: the payment
// names the session and a fresh payment id, and the provider's facilitator charges it. When the session could no
// longer cover a call (its budget spent by the prices paid, or close to its expiry), the next call opens a new one
// and the old one is closed (its unspent rest goes back at once). close() closes them all. Runs in the payer's
// process: it imports only pure domain modules and the gate client's base class.
import { randomUUID } from 'node:crypto';
import type { PaymentPayloadResult, PaymentRequirements, SchemeNetworkClient } from '@x402/core/types';
import { X402_SESSION_SCHEME, x402RequestSha256 } from '../domain/x402.ts';
import { ServiceClientScheme } from './client.ts';

export interface EscrowSessionClientOptions {
  /** The service's base URL, e.g. https://settlement.example.com */
  serviceUrl: string;
  /** The payer's API key (`sk_…`, scope x402:write). Sent only to serviceUrl. */
  apiKey: string;
  payerAgentId: string;
  /** The budget each session reserves, in the asset's minor units. */
  budget: number;
  /** How long a session lives (default 3600 s). */
  ttlSeconds?: number;
  /** The most one call may cost (default: the budget; the stock client's own spend controls apply besides). */
  maxPerCall?: number;
  /** A sponsor wallet of the tenant that pays instead of the payer's own wallet (its policy then applies). */
  sponsorWalletId?: string;
  fetch?: typeof globalThis.fetch;
}

interface OpenSession {
  sessionId: string;
  maxPerCall: number;
  expiresAtMs: number;
  /** The prices of the calls paid from it so far: what it may have been charged, at most. */
  committed: number;
}

/** A session this close to its expiry takes no new call: the call could be served after it. */
const EXPIRY_MARGIN_MS = 10_000;

export class EscrowSessionClientScheme extends ServiceClientScheme implements SchemeNetworkClient {
  readonly scheme = X402_SESSION_SCHEME;
  /** The open session per payee and asset (a promise, so concurrent first calls open one session). */
  private readonly sessions = new Map<string, Promise<OpenSession>>();

  constructor(private readonly options: EscrowSessionClientOptions) {
    super(options);
  }

  async createPaymentPayload(x402Version: number, requirements: PaymentRequirements): Promise<PaymentPayloadResult> {
    const binding = this.bindingOf(requirements);
    const price = Number(requirements.amount);
    const session = await this.sessionFor(requirements, price);
    return {
      x402Version,
      payload: { sessionId: session.sessionId, paymentId: randomUUID(), requestSha256: x402RequestSha256(binding) },
    };
  }

  /** Closes every session this client opened: what they did not spend goes back to the wallet. */
  async close(): Promise<void> {
    const open = await Promise.allSettled(this.sessions.values());
    this.sessions.clear();
    await Promise.all(open.map((s) => (s.status === 'fulfilled' ? this.closeSession(s.value.sessionId) : undefined)));
  }

  private async sessionFor(requirements: PaymentRequirements, price: number): Promise<OpenSession> {
    const key = `${requirements.payTo}|${requirements.asset}`;
    const current = this.sessions.get(key);
    const session = current && (await current.catch(() => null));
    if (
      session &&
      session.committed + price <= this.options.budget &&
      price <= session.maxPerCall &&
      Date.now() < session.expiresAtMs - EXPIRY_MARGIN_MS
    ) {
      session.committed += price;
      return session;
    }
    // Another call may have replaced it meanwhile: take the replacement rather than open a third.
    if (this.sessions.get(key) !== current) return this.sessionFor(requirements, price);
    const opening = this.openSession(requirements);
    this.sessions.set(key, opening);
    if (session) void this.closeSession(session.sessionId).catch(() => undefined); // its rest goes back
    const opened = await opening.catch((err) => {
      if (this.sessions.get(key) === opening) this.sessions.delete(key);
      throw err;
    });
    opened.committed += price;
    return opened;
  }

  private async openSession(requirements: PaymentRequirements): Promise<OpenSession> {
    const extra = requirements.extra;
    const maxPerCall = this.options.maxPerCall ?? this.options.budget;
    const opened = await this.post<{ sessionId: string; expiresAt: string; maxPerCall: number }>(
      '/x402/sessions',
      `x402ses-${randomUUID()}`,
      {
        payerAgentId: this.options.payerAgentId,
        payeeAgentIds: [requirements.payTo],
        currency: requirements.asset,
        budget: this.options.budget,
        maxPerCall,
        ...(this.options.ttlSeconds ? { ttlSeconds: this.options.ttlSeconds } : {}),
        ...(typeof extra.holdbackBps === 'number' ? { holdbackBps: extra.holdbackBps } : {}),
        ...(typeof extra.disputeWindowSeconds === 'number' ? { disputeWindowSeconds: extra.disputeWindowSeconds } : {}),
        ...(this.options.sponsorWalletId ? { sponsorWalletId: this.options.sponsorWalletId } : {}),
      },
    );
    return {
      sessionId: opened.sessionId,
      maxPerCall: opened.maxPerCall,
      expiresAtMs: Date.parse(opened.expiresAt),
      committed: 0,
    };
  }

  private closeSession(sessionId: string): Promise<unknown> {
    return this.post(`/x402/sessions/${encodeURIComponent(sessionId)}/close`, `x402ses-close-${sessionId}`, {});
  }
}
