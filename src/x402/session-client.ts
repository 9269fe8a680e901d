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
//
// Witnessed usage: toward a provider whose requirement carries a price schedule (extra.pricing), the session is
// opened with it, and each call's settle answer (the PAYMENT-RESPONSE header) carries the payee's signed usage
// record. With the payer agent's key (payerKey), acknowledge(response) checks the record against the call it paid
// and the response it read (session, payment, payee, request hash, the sha256 of the body), signs it, and queues the
// acknowledgement; they are sent in batches, with a later payment or at close (before the session closes).
import { randomUUID, type KeyObject } from 'node:crypto';
import { decodePaymentResponseHeader } from '@x402/core/http';
import type { PaymentPayloadResult, PaymentRequirements, SchemeNetworkClient } from '@x402/core/types';
import { sha256Hex } from '../domain/crypto.ts';
import { signUsageRecord, usageProblem, type UsageRecord, type UsageSignature } from '../domain/usage.ts';
import { X402_SESSION_SCHEME, x402RequestSha256 } from '../domain/x402.ts';
import { parsePriceSchedule, type PriceSchedule } from '../domain/pricing.ts';
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
  /** The payer agent's registered key: acknowledges the usage of calls it read (see acknowledge). */
  payerKey?: { keyId: string; privateKey: KeyObject };
  /** Open priced sessions that pay acknowledged usage only (default false). */
  requireAcknowledgedUsage?: boolean;
  /** Acknowledgements queued before a payment sends them (default 8); close() sends the rest. */
  ackBatchSize?: number;
}

/** A call this client paid from a session: what its usage record must name. */
interface PaidCall {
  sessionId: string;
  payeeAgentId: string;
  requestSha256: string;
  pricing: PriceSchedule | null;
}

interface OpenSession {
  sessionId: string;
  maxPerCall: number;
  expiresAtMs: number;
  /** The prices of the calls paid from it so far: what it may have been charged, at most. */
  committed: number;
}

/** Paid calls remembered for their acknowledgement, and acknowledgements per request (the route's limit). */
const MAX_PAID_CALLS = 10_000;
const MAX_ACK_BATCH = 256;

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A session this close to its expiry takes no new call: the call could be served after it. */
const EXPIRY_MARGIN_MS = 10_000;

export class EscrowSessionClientScheme extends ServiceClientScheme implements SchemeNetworkClient {
  readonly scheme = X402_SESSION_SCHEME;
  /** The open session per payee and asset (a promise, so concurrent first calls open one session). */
  private readonly sessions = new Map<string, Promise<OpenSession>>();
  /** Calls paid and not yet acknowledged, by payment id (the oldest forgotten past MAX_PAID_CALLS). */
  private readonly paid = new Map<string, PaidCall>();
  /** Acknowledgements not sent yet, per session. */
  private readonly acks = new Map<string, Array<{ paymentId: string; payerSignature: UsageSignature }>>();

  constructor(private readonly options: EscrowSessionClientOptions) {
    super(options);
  }

  async createPaymentPayload(x402Version: number, requirements: PaymentRequirements): Promise<PaymentPayloadResult> {
    const binding = this.bindingOf(requirements);
    const price = Number(requirements.amount);
    const session = await this.sessionFor(requirements, price);
    const paymentId = randomUUID();
    const requestSha256 = x402RequestSha256(binding);
    if (this.options.payerKey && isRecord(requirements.extra.pricing)) {
      if (this.paid.size >= MAX_PAID_CALLS) this.paid.delete(this.paid.keys().next().value!);
      this.paid.set(paymentId, {
        sessionId: session.sessionId,
        payeeAgentId: requirements.payTo,
        requestSha256,
        pricing: parsePriceSchedule(requirements.extra.pricing),
      });
    }
    // A batch of acknowledgements rides along with a later payment; one that fails stays queued for the next.
    if ((this.acks.get(session.sessionId)?.length ?? 0) >= (this.options.ackBatchSize ?? 8))
      await this.sendAcks(session.sessionId).catch(() => undefined);
    return { x402Version, payload: { sessionId: session.sessionId, paymentId, requestSha256 } };
  }

  /**
   * Acknowledges the usage of a paid call once its response was read: the settle answer's usage record must name the
   * call this client paid (session, payment, payee, request) and the response as received (sha256 of its body), and
   * price with the schedule the session was opened with; `accept` may refuse it on what was served. Then the payer's
   * signature is queued for the next batch. Reads a clone: the caller still reads the body. Answers whether it
   * acknowledged (false: nothing to acknowledge, or the record does not fit).
   */
  async acknowledge(
    response: Response,
    accept: (record: UsageRecord, body: Uint8Array) => boolean = () => true,
  ): Promise<boolean> {
    const key = this.options.payerKey;
    const header = response.headers.get('PAYMENT-RESPONSE');
    if (!key || !header) return false;
    const usage = (decodePaymentResponseHeader(header).extra as { usage?: { record?: unknown } } | undefined)?.usage;
    const record = usage?.record as UsageRecord | undefined;
    const call = record ? this.paid.get(record.paymentId) : undefined;
    if (!record || !call || !call.pricing || usageProblem(record, call.pricing)) return false;
    const body = new Uint8Array(await response.clone().arrayBuffer());
    const fits =
      record.sessionId === call.sessionId &&
      record.payeeAgentId === call.payeeAgentId &&
      record.requestSha256 === call.requestSha256 &&
      record.responseSha256 === sha256Hex(body) &&
      accept(record, body);
    if (!fits) return false;
    this.paid.delete(record.paymentId);
    const queued = this.acks.get(call.sessionId) ?? [];
    queued.push({ paymentId: record.paymentId, payerSignature: signUsageRecord(record, key) });
    this.acks.set(call.sessionId, queued);
    return true;
  }

  /** Sends a session's queued acknowledgements in one request (a failed batch goes back in the queue). */
  private async sendAcks(sessionId: string): Promise<void> {
    const batch = this.acks.get(sessionId) ?? [];
    this.acks.delete(sessionId);
    for (let from = 0; from < batch.length; from += MAX_ACK_BATCH) {
      const part = batch.slice(from, from + MAX_ACK_BATCH);
      try {
        await this.post(`/x402/sessions/${encodeURIComponent(sessionId)}/acknowledgements`, `x402ack-${randomUUID()}`, {
          acknowledgements: part,
        });
      } catch (err) {
        this.acks.set(sessionId, [...batch.slice(from), ...(this.acks.get(sessionId) ?? [])]);
        throw err;
      }
    }
  }

  /** Closes every session this client opened: what they did not spend goes back to the wallet. */
  async close(): Promise<void> {
    const open = await Promise.allSettled(this.sessions.values());
    this.sessions.clear();
    await Promise.all(open.map((s) => (s.status === 'fulfilled' ? this.closeSession(s.value.sessionId) : undefined)));
  }

  private async sessionFor(requirements: PaymentRequirements, price: number): Promise<OpenSession> {
    // A priced requirement gets a session opened with its schedule: one per payee, asset and schedule.
    const pricing = isRecord(requirements.extra.pricing) ? JSON.stringify(requirements.extra.pricing) : '';
    const key = `${requirements.payTo}|${requirements.asset}|${pricing}`;
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
        ...(isRecord(extra.pricing)
          ? { pricing: extra.pricing, requireAcknowledgedUsage: this.options.requireAcknowledgedUsage ?? false }
          : {}),
      },
    );
    return {
      sessionId: opened.sessionId,
      maxPerCall: opened.maxPerCall,
      expiresAtMs: Date.parse(opened.expiresAt),
      committed: 0,
    };
  }

  /** Sends the session's acknowledgements first: usage acknowledged after the close would not count. */
  private async closeSession(sessionId: string): Promise<unknown> {
    // A batch the service refuses never keeps the budget's rest from going back.
    await this.sendAcks(sessionId).catch(() => undefined);
    return this.post(`/x402/sessions/${encodeURIComponent(sessionId)}/close`, `x402ses-close-${sessionId}`, {});
  }
}
