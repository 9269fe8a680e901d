// The x402 v2 facilitator of the `escrow-session` scheme: the payment names an open payment session and a payment
// id of the payer's. Verify holds the required amount in the session's budget (so a verified call can always be
// paid, and parallel calls never overspend); settle charges what the call cost, at most that (the stock middleware's
// settlement overrides send the actual amount), and the rest of the hold goes back to the budget at once. Both are
// idempotent by the payment id: a repeated settle answers the same charge. See sessions.ts.
//
// Witnessed usage: a settle whose payload carries `usage: {record, payeeSignature}` (the provider's server scheme adds
// it with the stock enrichSettlementPayload hook) charges the record's priced usage instead of the amount; the
// answer carries the usage back, so the payer can check it against the response it read and acknowledge it.
import { isSha256Hex } from '../../domain/crypto.ts';
import { ServiceError } from '../../domain/errors.ts';
import { acceptsNetwork, requestBindingOf, X402_SESSION_SCHEME, x402RequestSha256 } from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import {
  paymentStatusAnswer,
  unpaidAnswer,
  type FacilitatorRequest,
  type PaymentStatusAnswer,
  type SettleAnswer,
  type VerifyAnswer,
} from '../../domain/x402-facilitator.ts';
import type { ChargeAnswer } from './sessions.ts';
import type { X402Service } from './service.ts';

const AMOUNT = /^(0|[1-9][0-9]{0,15})$/;

class Refusal extends Error {
  constructor(
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

/** Our service errors as x402 reasons: X402_SESSION_BUDGET_EXCEEDED -> session_budget_exceeded, 404 -> session_not_found. */
function refusalOf(err: unknown): Refusal | null {
  if (err instanceof Refusal) return err;
  if (!(err instanceof ServiceError)) return null;
  if (err.status === 404) return new Refusal('session_not_found', 'no such session for this credential');
  if (err.code.startsWith('X402_') || err.status === 422)
    return new Refusal(err.code.replace(/^X402_/, '').toLowerCase(), err.message);
  return null;
}

interface SessionPayment {
  sessionId: string;
  paymentId: string;
  requestSha256: string;
  payeeAgentId: string;
  /** What the payer accepted to pay at most (the requirement it paid for). */
  accepted: number;
  /** The asset it was paid in: the session's currency, or refused (asset_mismatch). */
  asset: string;
}

export class X402SessionFacilitator {
  constructor(
    private readonly runtime: Runtime,
    private readonly x402: X402Service,
  ) {}

  async verify(tenantId: string, request: FacilitatorRequest): Promise<VerifyAnswer> {
    try {
      const p = this.check(request);
      const { session } = await this.x402.sessions.hold(tenantId, p.sessionId, {
        paymentId: p.paymentId,
        payeeAgentId: p.payeeAgentId,
        maxAmount: p.accepted,
        requestSha256: p.requestSha256,
        asset: p.asset,
      });
      return { isValid: true, payer: session.payerAgentId };
    } catch (err) {
      const refusal = refusalOf(err);
      if (refusal) return { isValid: false, invalidReason: refusal.reason, invalidMessage: refusal.message };
      throw err;
    }
  }

  async settle(tenantId: string, request: FacilitatorRequest): Promise<SettleAnswer> {
    const network = this.runtime.config.x402.network;
    try {
      const p = this.check(request);
      const amount = request.paymentRequirements.amount;
      if (!AMOUNT.test(amount)) throw new Refusal('invalid_amount', 'the amount to settle must be integer minor units');
      if (Number(amount) > p.accepted)
        throw new Refusal('amount_exceeds_authorization', `the payment authorized at most ${p.accepted}`);
      const usage = request.paymentPayload.payload.usage;
      if (usage !== undefined && (typeof usage !== 'object' || usage === null || Array.isArray(usage)))
        throw new Refusal('invalid_payload', 'usage must be {record, payeeSignature}');
      const witnessed = usage as { record?: unknown; payeeSignature?: unknown } | undefined;
      const charged = await this.x402.sessions.capture(tenantId, p.sessionId, {
        paymentId: p.paymentId,
        payeeAgentId: p.payeeAgentId,
        ...(witnessed
          ? { usage: { record: witnessed.record, payeeSignature: witnessed.payeeSignature } }
          : { amount: Number(amount) }),
        requestSha256: p.requestSha256,
        asset: p.asset,
      });
      return this.settled(charged);
    } catch (err) {
      const refusal = refusalOf(err);
      if (refusal) return unpaidAnswer(network, refusal.reason, refusal.message);
      throw err;
    }
  }

  /** What settle answers for a charge: the same for the first settle, a repeat, and the status lookup. */
  private settled(charged: ChargeAnswer): SettleAnswer {
    const { charge, receipt } = charged;
    return {
      success: true,
      status: 'settled',
      payer: receipt.body.payerAgentId,
      transaction: charge._id,
      network: this.runtime.config.x402.network,
      amount: String(charge.amount),
      settledAt: charge.at.toISOString(),
      extra: {
        sessionId: charge.sessionId,
        paymentId: charge.paymentId!,
        seq: charge.seq,
        remaining: charged.remaining,
        receiptHash: receipt.receiptHash,
        ...(charge.usage
          ? { usage: { record: charge.usage.record, payeeSignature: charge.usage.payeeSignature } }
          : {}),
      },
    };
  }

  /**
   * Where a session payment stands (its payment id is `<sessionId>:<paymentId>`): see X402Sessions.paymentState. A
   * settled one carries the answer settle gives (`remaining` as it is now); a refused one was voided by the close.
   */
  async paymentStatus(tenantId: string, sessionId: string, paymentId: string): Promise<PaymentStatusAnswer> {
    const state = await this.x402.sessions.paymentState(tenantId, sessionId, paymentId);
    const id = `${sessionId}:${paymentId}`;
    if (state.status === 'settled') return paymentStatusAnswer(id, 'settled', null, this.settled(state.charged!));
    if (state.status === 'refused') {
      const settlement = unpaidAnswer(
        this.runtime.config.x402.network,
        'session_closed',
        'the session closed before this payment was settled: nothing was charged',
      );
      return paymentStatusAnswer(id, 'refused', null, settlement);
    }
    const settleBy = state.status === 'authorized' ? state.session!.expiresAt.toISOString() : null;
    return paymentStatusAnswer(id, state.status, settleBy, null);
  }

  /** The protocol's fields and the payment's bindings (the request it pays for, the payee, the amount accepted). */
  private check(request: FacilitatorRequest): SessionPayment {
    const { paymentPayload: payment, paymentRequirements: required } = request;
    if (payment.accepted.scheme !== X402_SESSION_SCHEME)
      throw new Refusal('unsupported_scheme', `the payment was made for the ${payment.accepted.scheme} scheme`);
    if (
      !acceptsNetwork(this.runtime.config.x402, required.network, new Date()) ||
      payment.accepted.network !== required.network
    )
      throw new Refusal('invalid_network', `this facilitator settles on ${this.runtime.config.x402.network}`);
    const { sessionId, paymentId, requestSha256 } = payment.payload;
    if (
      typeof sessionId !== 'string' ||
      typeof paymentId !== 'string' ||
      !/^[A-Za-z0-9._:-]{1,128}$/.test(paymentId) ||
      !isSha256Hex(requestSha256)
    ) {
      throw new Refusal('invalid_payload', 'the payload must carry sessionId, paymentId and requestSha256');
    }
    if (payment.accepted.payTo !== required.payTo)
      throw new Refusal('payee_mismatch', 'the payment is for another payee');
    if (payment.accepted.asset !== required.asset)
      throw new Refusal('asset_mismatch', 'the payment is in another currency');
    const binding = requestBindingOf(required.extra);
    if (
      !binding ||
      x402RequestSha256(binding) !== requestSha256 ||
      (payment.resource && payment.resource.url !== binding.resource)
    ) {
      throw new Refusal('request_binding_mismatch', 'the payment was made for another request');
    }
    if (!AMOUNT.test(payment.accepted.amount)) throw new Refusal('invalid_amount', 'amounts are integer minor units');
    return {
      sessionId,
      paymentId,
      requestSha256,
      payeeAgentId: required.payTo,
      accepted: Number(payment.accepted.amount),
      asset: required.asset,
    };
  }
}
