// The x402 v2 facilitator of the `escrow-gate` scheme: what stock x402 resource-server middleware calls to verify a
// payment before it serves a request and to settle it after. A payment is the spend token authorize-payment signed;
// it is checked offline against the service's own key ring, then against the gate it names (by `_id`, in the
// caller's tenant only). Settling reports the served call to the gate's verify, so money moves exactly as there.
import { recorded } from '../../domain/money.ts';
import { createLocalJWKSet, errors as joseErrors, jwtVerify, type JWTPayload } from 'jose';
import { isSha256Hex, sha256Hex } from '../../domain/crypto.ts';
import { errors, ServiceError } from '../../domain/errors.ts';
import { capturedOf } from '../../domain/settlement.ts';
import {
  acceptsNetwork,
  authorizationDeadline,
  legacyNetworksAt,
  requestBindingOf,
  X402_SCHEME,
  X402_SESSION_SCHEME,
  X402_VERSION,
  x402RequestSha256,
  type PaymentTokenClaims,
} from '../../domain/x402.ts';
import {
  paymentStatusAnswer,
  unpaidAnswer,
  type FacilitatorRequest,
  type PaymentStatusAnswer,
  type SettleAnswer,
  type VerifyAnswer,
} from '../../domain/x402-facilitator.ts';
import type { Runtime } from '../../runtime.ts';
import { X402SessionFacilitator } from './session-facilitator.ts';
import { x402Service, type GateState, type X402Service } from './service.ts';

/** A refusal in the protocol's terms: a snake_case reason and a sentence that names no secret. */
class Refusal extends Error {
  constructor(
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

interface CheckedPayment {
  claims: PaymentTokenClaims & JWTPayload;
  state: GateState;
  /** What settle charges: the requirement's amount (verify: exactly the authorized amount). */
  captured: number;
}

/** Our service errors as x402 reasons: `X402_QUOTE_EXPIRED` -> `quote_expired`, and so on. */
function reasonOf(err: ServiceError): string {
  return err.code.replace(/^X402_/, '').toLowerCase();
}

/**
 * Whether the gate's payment is settled as agreed: the payee paid (released), or a metered call that charged nothing
 * (its whole reserve back with the payer: the gate reads refunded, yet the payment did what it was asked).
 */
function settledAsAgreed(state: GateState): boolean {
  if (state.status === 'released') return true;
  const decision = state.settlement?.facts.decision;
  return (
    decision?.verdict === 'pass' &&
    capturedOf(state.gate.amount, decision) === 0 &&
    state.settlement!.view.status === 'refunded'
  );
}

/** Why a settled payment did not pay the payee, or null when it was settled as agreed. */
function unpaidReason(decided: boolean, state: GateState): { reason: string; message: string } | null {
  if (settledAsAgreed(state)) return null;
  const decision = state.settlement?.facts.decision;
  if (!decided || !decision)
    return {
      reason: 'settlement_pending',
      message: 'the payment is still being decided; the gate status URL tells when it is',
    };
  if (decision.verdict === 'pass')
    return { reason: 'settlement_pending', message: "the payee's release is decided but not yet moved" };
  // The decision's reason in the protocol's terms: verification_failed, authorization_expired, agent_wound_down, …
  const reason = (decision.reason ?? 'payment_refunded').toLowerCase();
  return { reason, message: `the payer was refunded (${reason}); the payee was not paid` };
}

export class X402FacilitatorService {
  private readonly x402: X402Service;
  private readonly sessions: X402SessionFacilitator;
  private readonly jwks;

  constructor(private readonly runtime: Runtime) {
    this.x402 = x402Service(runtime);
    this.sessions = new X402SessionFacilitator(runtime, this.x402);
    this.jwks = createLocalJWKSet(runtime.keys.jwks as never);
  }

  private get network(): string {
    return this.runtime.config.x402.network;
  }

  /** Whether a payment naming `network` is settled here: our CAIP-2 id, or a legacy id inside its window. */
  private accepts(network: string): boolean {
    return acceptsNetwork(this.runtime.config.x402, network, new Date());
  }

  /**
   * The kinds settled here, under the CAIP-2 id only. Legacy ids still accepted are announced in each kind's `extra`
   * (with the end of their window), never as kinds of their own: stock tools reject a kind whose network is no CAIP-2.
   * Public: it names the deployment's schemes and network, nothing of any tenant.
   */
  supported() {
    const legacy = legacyNetworksAt(this.runtime.config.x402, new Date());
    const until = this.runtime.config.x402.legacyNetworksUntil.toISOString();
    const extra = legacy.length
      ? {
          extra: {
            deprecatedNetworks: legacy.map((network) => ({ network, acceptedUntil: until, replacedBy: this.network })),
          },
        }
      : {};
    return {
      kinds: [X402_SCHEME, X402_SESSION_SCHEME].map((scheme) => ({
        x402Version: X402_VERSION,
        scheme,
        network: this.network,
        ...extra,
      })),
      extensions: [] as string[],
      signers: {} as Record<string, string[]>,
    };
  }

  async verify(tenantId: string, request: FacilitatorRequest): Promise<VerifyAnswer> {
    if (this.isSessionPayment(request)) return this.sessions.verify(tenantId, request);
    try {
      const { claims, state } = await this.check(tenantId, request);
      if (state.verification?.verificationStatus === 'expired')
        throw new Refusal('authorization_expired', 'the authorization expired before the call was reported');
      if (state.verification?.verificationStatus === 'wound_down')
        throw new Refusal('agent_wound_down', 'the gate was returned: its payer or payee is wound down');
      if (state.verification) throw new Refusal('payment_already_settled', 'this payment has already been settled');
      return { isValid: true, payer: claims.payer };
    } catch (err) {
      if (err instanceof Refusal) return { isValid: false, invalidReason: err.reason, invalidMessage: err.message };
      throw err;
    }
  }

  /**
   * Settles by the gate's verify with the provider's evidence and the requirement's amount (what the call cost, at
   * most the authorized amount): the first settle records the report, a repeat finds it and answers the same
   * settlement. Whatever the payload, money moves once per gate. `success` is true only when the payment was settled
   * as agreed (the payee paid what was charged); a refunded, expired or still undecided gate answers why it was not.
   */
  async settle(tenantId: string, request: FacilitatorRequest): Promise<SettleAnswer> {
    if (this.isSessionPayment(request)) return this.sessions.settle(tenantId, request);
    const failed = (reason: string, message: string, payer?: string): SettleAnswer =>
      unpaidAnswer(this.network, reason, message, payer ? { payer } : {});
    let checked: CheckedPayment;
    try {
      checked = await this.check(tenantId, request, true);
    } catch (err) {
      if (err instanceof Refusal) return failed(err.reason, err.message);
      throw err;
    }
    const { claims, captured } = checked;
    const evidence = request.paymentPayload.payload.responseSha256;
    try {
      const { state, decided } = await this.x402.verification.verify(tenantId, {
        gateId: claims.gateId,
        // The server scheme hashes the response it served; a provider without it reports the empty response.
        evidence: { responseSha256: isSha256Hex(evidence) ? evidence : sha256Hex('') },
        amount: captured,
      });
      return this.settleAnswer(state, decided);
    } catch (err) {
      if (err instanceof ServiceError && err.code.startsWith('X402_'))
        return failed(reasonOf(err), err.message, claims.payer);
      throw err;
    }
  }

  /** A payment under the session scheme (version checked here: both schemes speak x402 v2 only). */
  private isSessionPayment(request: FacilitatorRequest): boolean {
    return (
      request.paymentRequirements.scheme === X402_SESSION_SCHEME &&
      request.x402Version === X402_VERSION &&
      request.paymentPayload.x402Version === X402_VERSION
    );
  }

  /** What settle answers for the gate as it stands: success only once it is settled as agreed, else why not. */
  private settleAnswer(state: GateState, decided: boolean): SettleAnswer {
    const payer = state.gate.payerAgentId;
    const transaction = state.settlement?.doc._id ?? '';
    const unpaid = unpaidReason(decided, state);
    if (unpaid) return unpaidAnswer(this.network, unpaid.reason, unpaid.message, { payer, transaction });
    const decision = recorded(state.settlement?.facts.decision, `the settlement decision of gate ${state.gate._id}`);
    return {
      success: true,
      status: 'settled',
      payer,
      transaction,
      network: this.network,
      // What was charged: the first report's capture, whatever amount a repeat asks for.
      amount: String(capturedOf(state.gate.amount, decision)),
      settledAt: decision.decidedAt,
      extra: {
        gateId: state.gate._id,
        status: decided ? state.status : 'settling',
        releasedNow: decision.releaseNow,
        holdback: decision.holdback,
        receiptHash: decision.receipt.receiptHash,
      },
    };
  }

  /** The same lookup from the body settle was sent: its payment id is the payload's gateId. */
  async paymentStatusOf(tenantId: string, request: FacilitatorRequest): Promise<PaymentStatusAnswer> {
    if (this.isSessionPayment(request)) {
      const { sessionId, paymentId } = request.paymentPayload.payload;
      if (
        typeof sessionId !== 'string' ||
        typeof paymentId !== 'string' ||
        sessionId.length > 128 ||
        paymentId.length > 128
      ) {
        throw errors.unprocessable('the payment payload names no sessionId and paymentId', {
          errors: [
            {
              path: 'body.paymentPayload.payload',
              message: 'sessionId and paymentId strings of at most 128 characters',
            },
          ],
        });
      }
      return this.sessions.paymentStatus(tenantId, sessionId, paymentId);
    }
    const gateId = request.paymentPayload.payload.gateId;
    if (typeof gateId !== 'string' || gateId.length > 128) {
      throw errors.unprocessable('the payment payload names no gateId', {
        errors: [{ path: 'body.paymentPayload.payload.gateId', message: 'a string of at most 128 characters' }],
      });
    }
    return this.paymentStatus(tenantId, gateId);
  }

  /**
   * Where the payment of an escrow-gate stands (its payment id is its gate id), for a resource server whose settle
   * timed out: `unknown` (no such payment in the caller's tenant, or never paid for), `authorized` (safe to settle
   * now), `settling` (reported, decision in flight: ask again, or settle again, which answers the same), `settled`
   * or `refused` with the answer settle gave. Reads by `_id` only and moves nothing.
   */
  async paymentStatus(tenantId: string, paymentId: string): Promise<PaymentStatusAnswer> {
    // A session payment's id is `<sessionId>:<paymentId>` (session ids hold no colon).
    const session = /^(ses_[^:]+):(.+)$/.exec(paymentId);
    if (session) return this.sessions.paymentStatus(tenantId, session[1]!, session[2]!);
    const unknown = paymentStatusAnswer(paymentId, 'unknown', null, null);
    const gate = await this.x402.gates.requireGate(tenantId, paymentId).catch((err: unknown) => {
      if (err instanceof ServiceError && err.status === 404) return null;
      throw err;
    });
    if (!gate) return unknown;
    const state = await this.x402.gates.gateState(gate, true);
    // A payment exists once the gate was authorized (its token is the payment); a gate held, voided, or cancelled or
    // expired before anyone authorized it was never paid for.
    if (state.commitment?.kind !== 'authorization') return unknown;
    if (state.status === 'authorized') {
      return paymentStatusAnswer(
        paymentId,
        'authorized',
        authorizationDeadline(state.commitment.expiresAt, this.runtime.config.x402).toISOString(),
        null,
      );
    }
    // Reported (or returned): settling until decided and moved, then what settle answers.
    if (state.status === 'settling') return paymentStatusAnswer(paymentId, 'settling', null, null);
    const answer = this.settleAnswer(state, true);
    return paymentStatusAnswer(
      paymentId,
      answer.success ? 'settled' : answer.errorReason === 'settlement_pending' ? 'settling' : 'refused',
      null,
      answer,
    );
  }

  /**
   * Every check but "already settled", cheapest first: the protocol fields, the token's signature and expiry
   * (offline, against the key ring), the gate in the caller's tenant, then each binding of the token to the
   * requirements. Another tenant's gate is `gate_not_found`, before anything about it is compared.
   */
  private async check(tenantId: string, request: FacilitatorRequest, capture = false): Promise<CheckedPayment> {
    const { paymentPayload: payment, paymentRequirements: required } = request;
    if (request.x402Version !== X402_VERSION || payment.x402Version !== X402_VERSION) {
      throw new Refusal('invalid_x402_version', `only x402 version ${X402_VERSION} is supported`);
    }
    if (required.scheme !== X402_SCHEME || payment.accepted.scheme !== X402_SCHEME)
      throw new Refusal('unsupported_scheme', `only the ${X402_SCHEME} scheme is supported`);
    if (!this.accepts(required.network) || !this.accepts(payment.accepted.network))
      throw new Refusal('invalid_network', `this facilitator settles on ${this.network}`);
    const { token, gateId, quoteId, requestSha256 } = payment.payload;
    if (
      typeof token !== 'string' ||
      typeof gateId !== 'string' ||
      typeof quoteId !== 'string' ||
      typeof requestSha256 !== 'string'
    ) {
      throw new Refusal('invalid_payload', 'the payload must carry token, gateId, quoteId and requestSha256');
    }

    const { claims, expired } = await this.verifyToken(token);
    if (claims.gateId !== gateId || claims.quoteId !== quoteId || claims.requestSha256 !== requestSha256) {
      throw new Refusal('invalid_payload', 'the payload does not match its token');
    }
    // A token issued under the legacy id before the switch stays good for its (short) life, inside the window.
    if (claims.scheme !== X402_SCHEME || !this.accepts(claims.network))
      throw new Refusal('invalid_network', 'the token was issued for another scheme or network');

    let state: GateState;
    try {
      state = await this.x402.gates.gateState(await this.x402.gates.requireGate(tenantId, claims.gateId));
    } catch (err) {
      if (err instanceof ServiceError && err.status === 404)
        throw new Refusal('gate_not_found', 'no such gate for this credential');
      throw err;
    }
    const { gate } = state;

    if (claims.payee !== required.payTo || claims.aud !== required.payTo || gate.payeeAgentId !== required.payTo) {
      throw new Refusal('payee_mismatch', 'the payment is for another payee');
    }
    if (gate.amount !== claims.amount) throw new Refusal('amount_mismatch', 'the payment is for another amount');
    // Settling may charge less than was authorized (a metered call: the stock middleware's settlement override
    // sends the actual amount as the requirement's, while the payload keeps the authorized maximum); never more.
    const captured = Number(required.amount);
    if (capture && captured > claims.amount)
      throw new Refusal(
        'capture_exceeds_authorization',
        `the payment authorized at most ${claims.amount}; it cannot be charged ${required.amount}`,
      );
    if (!capture && captured !== claims.amount)
      throw new Refusal('amount_mismatch', 'the payment is for another amount');
    if (claims.currency !== required.asset || gate.currency !== claims.currency)
      throw new Refusal('asset_mismatch', 'the payment is in another currency');
    const terms = required.extra;
    if (
      (terms.holdbackBps !== undefined && terms.holdbackBps !== gate.holdbackBps) ||
      (terms.disputeWindowSeconds !== undefined && terms.disputeWindowSeconds !== gate.disputeWindowSeconds)
    ) {
      throw new Refusal('terms_mismatch', 'the gate holds back or disputes on other terms than required');
    }
    const binding = requestBindingOf(required.extra);
    if (
      !binding ||
      x402RequestSha256(binding) !== claims.requestSha256 ||
      (payment.resource && payment.resource.url !== binding.resource)
    ) {
      throw new Refusal('request_binding_mismatch', 'the payment was made for another request');
    }

    if (
      state.status === 'cancelled' ||
      state.status === 'unfunded' ||
      (state.status === 'expired' && !state.verification)
    )
      throw new Refusal('gate_closed', `the gate is ${state.status}`);
    const commitment = state.commitment;
    if (commitment?.kind !== 'authorization' || commitment.authorizationRef !== claims.authorizationRef) {
      throw new Refusal('payment_not_authorized', 'the gate holds no authorization for this token');
    }
    // The token lives exactly as long as its quote: past it nothing new may happen, but a settle of a payment already
    // reported answers its outcome again (settle is idempotent per payment, however late the repeat).
    if (expired && !(capture && state.verification))
      throw new Refusal('quote_expired', 'the quote this payment was authorized under has expired');
    return { claims, state, captured };
  }

  /**
   * The token's claims once its signature verifies; `expired` when its quote's time is over (jose checks the
   * signature before the claims, so an expired token's payload is still the one we signed).
   */
  private async verifyToken(token: string): Promise<{ claims: PaymentTokenClaims & JWTPayload; expired: boolean }> {
    try {
      const { payload } = await jwtVerify(token, this.jwks, {
        issuer: this.runtime.config.publicBaseUrl,
        algorithms: ['EdDSA'],
      });
      return { claims: payload as PaymentTokenClaims & JWTPayload, expired: false };
    } catch (err) {
      if (err instanceof joseErrors.JWTExpired && err.payload.iss === this.runtime.config.publicBaseUrl)
        return { claims: err.payload as PaymentTokenClaims & JWTPayload, expired: true };
      throw new Refusal('invalid_signature', "the payment token does not verify against this service's keys");
    }
  }

  async close(): Promise<void> {
    await this.x402.close();
  }
}
