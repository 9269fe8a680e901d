// The x402 v2 facilitator of the `escrow-gate` scheme: what stock x402 resource-server middleware calls to verify a
// payment before it serves a request and to settle it after. A payment is the spend token authorize-payment signed;
// it is checked offline against the service's own key ring, then against the gate it names (by `_id`, in the
// caller's tenant only). Settling reports the served call to the gate's verify, so money moves exactly as there.
import { createLocalJWKSet, errors as joseErrors, jwtVerify, type JWTPayload } from 'jose';
import { isSha256Hex, sha256Hex } from '../domain/crypto.ts';
import { ServiceError } from '../domain/errors.ts';
import { requestBindingOf, X402_SCHEME, X402_SESSION_SCHEME, X402_VERSION, x402RequestSha256, type PaymentTokenClaims } from '../domain/x402.ts';
import type { Runtime } from '../runtime.ts';
import { X402SessionFacilitator } from './x402-session-facilitator.ts';
import { X402Service, type GateState } from './x402.ts';

/** x402 v2 PaymentRequirements, as the facilitator API carries them. */
export interface FacilitatorRequirements {
  scheme: string;
  network: string;
  asset: string;
  amount: string;
  payTo: string;
  maxTimeoutSeconds: number;
  extra: Record<string, unknown>;
}

export interface FacilitatorRequest {
  x402Version: number;
  paymentPayload: {
    x402Version: number;
    resource?: { url: string };
    accepted: FacilitatorRequirements;
    payload: Record<string, unknown>;
  };
  paymentRequirements: FacilitatorRequirements;
}

export interface VerifyAnswer {
  isValid: boolean;
  invalidReason?: string;
  invalidMessage?: string;
  payer?: string;
}

export interface SettleAnswer {
  success: boolean;
  errorReason?: string;
  errorMessage?: string;
  payer?: string;
  transaction: string;
  network: string;
  amount?: string;
  extra?: Record<string, unknown>;
}

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
}

/** Our service errors as x402 reasons: `X402_QUOTE_EXPIRED` -> `quote_expired`, and so on. */
function reasonOf(err: ServiceError): string {
  return err.code.replace(/^X402_/, '').toLowerCase();
}

/** Why a settled payment did not pay the payee, or null when it did (the gate released). */
function unpaidReason(decided: boolean, state: GateState): { reason: string; message: string } | null {
  if (state.status === 'released') return null;
  const decision = state.settlement?.facts.decision;
  if (!decided || !decision) return { reason: 'settlement_pending', message: 'the payment is still being decided; the gate status URL tells when it is' };
  if (decision.verdict === 'pass') return { reason: 'settlement_pending', message: 'the payee\'s release is decided but not yet moved' };
  // The decision's reason in the protocol's terms: verification_failed, authorization_expired, agent_wound_down, …
  const reason = (decision.reason ?? 'payment_refunded').toLowerCase();
  return { reason, message: `the payer was refunded (${reason}); the payee was not paid` };
}

export class X402FacilitatorService {
  private readonly gates: X402Service;
  private readonly sessions: X402SessionFacilitator;
  private readonly jwks;

  constructor(private readonly runtime: Runtime) {
    this.gates = new X402Service(runtime);
    this.sessions = new X402SessionFacilitator(runtime, this.gates);
    this.jwks = createLocalJWKSet(runtime.keys.jwks as never);
  }

  private get network(): string {
    return this.runtime.config.x402.network;
  }

  supported() {
    return {
      kinds: [X402_SCHEME, X402_SESSION_SCHEME].map((scheme) => ({ x402Version: X402_VERSION, scheme, network: this.network })),
      extensions: [] as string[],
      signers: {} as Record<string, string[]>,
    };
  }

  async verify(tenantId: string, request: FacilitatorRequest): Promise<VerifyAnswer> {
    if (this.isSessionPayment(request)) return this.sessions.verify(tenantId, request);
    try {
      const { claims, state } = await this.check(tenantId, request);
      if (state.verification?.verificationStatus === 'expired') throw new Refusal('authorization_expired', 'the authorization expired before the call was reported');
      if (state.verification?.verificationStatus === 'wound_down') throw new Refusal('agent_wound_down', 'the gate was returned: its payer or payee is wound down');
      if (state.verification) throw new Refusal('payment_already_settled', 'this payment has already been settled');
      return { isValid: true, payer: claims.payer };
    } catch (err) {
      if (err instanceof Refusal) return { isValid: false, invalidReason: err.reason, invalidMessage: err.message };
      throw err;
    }
  }

  /**
   * Settles by the gate's verify with the provider's evidence: the first settle records the report, a repeat finds
   * it and answers the same settlement. Whatever the payload, money moves once per gate. `success` is true only when
   * the payee was paid (the gate released); a refunded, expired or still undecided gate answers why it was not.
   */
  async settle(tenantId: string, request: FacilitatorRequest): Promise<SettleAnswer> {
    if (this.isSessionPayment(request)) return this.sessions.settle(tenantId, request);
    const failed = (reason: string, message: string, payer?: string): SettleAnswer => ({
      success: false,
      errorReason: reason,
      errorMessage: message,
      ...(payer ? { payer } : {}),
      transaction: '',
      network: this.network,
    });
    let checked: CheckedPayment;
    try {
      checked = await this.check(tenantId, request);
    } catch (err) {
      if (err instanceof Refusal) return failed(err.reason, err.message);
      throw err;
    }
    const { claims } = checked;
    const evidence = request.paymentPayload.payload.responseSha256;
    try {
      const { state, decided } = await this.gates.verify(tenantId, {
        gateId: claims.gateId,
        // The server scheme hashes the response it served; a provider without it reports the empty response.
        evidence: { responseSha256: isSha256Hex(evidence) ? evidence : sha256Hex('') },
      });
      const decision = state.settlement?.facts.decision ?? null;
      const unpaid = unpaidReason(decided, state);
      if (unpaid) return { ...failed(unpaid.reason, unpaid.message, claims.payer), transaction: state.settlement?.doc._id ?? '' };
      return {
        success: true,
        payer: claims.payer,
        transaction: state.settlement?.doc._id ?? '',
        network: this.network,
        amount: String(state.gate.amount),
        extra: {
          gateId: state.gate._id,
          status: decided ? state.status : 'settling',
          releasedNow: decision?.releaseNow ?? null,
          holdback: decision?.holdback ?? null,
          receiptHash: decision?.receipt.receiptHash ?? null,
        },
      };
    } catch (err) {
      if (err instanceof ServiceError && err.code.startsWith('X402_')) return failed(reasonOf(err), err.message, claims.payer);
      throw err;
    }
  }

  /** A payment under the session scheme (version checked here: both schemes speak x402 v2 only). */
  private isSessionPayment(request: FacilitatorRequest): boolean {
    return request.paymentRequirements.scheme === X402_SESSION_SCHEME && request.x402Version === X402_VERSION && request.paymentPayload.x402Version === X402_VERSION;
  }

  /**
   * Every check but "already settled", cheapest first: the protocol fields, the token's signature and expiry
   * (offline, against the key ring), the gate in the caller's tenant, then each binding of the token to the
   * requirements. Another tenant's gate is `gate_not_found`, before anything about it is compared.
   */
  private async check(tenantId: string, request: FacilitatorRequest): Promise<CheckedPayment> {
    const { paymentPayload: payment, paymentRequirements: required } = request;
    if (request.x402Version !== X402_VERSION || payment.x402Version !== X402_VERSION) {
      throw new Refusal('invalid_x402_version', `only x402 version ${X402_VERSION} is supported`);
    }
    if (required.scheme !== X402_SCHEME || payment.accepted.scheme !== X402_SCHEME) throw new Refusal('unsupported_scheme', `only the ${X402_SCHEME} scheme is supported`);
    if (required.network !== this.network || payment.accepted.network !== this.network) throw new Refusal('invalid_network', `this facilitator settles on ${this.network}`);
    const { token, gateId, quoteId, requestSha256 } = payment.payload;
    if (typeof token !== 'string' || typeof gateId !== 'string' || typeof quoteId !== 'string' || typeof requestSha256 !== 'string') {
      throw new Refusal('invalid_payload', 'the payload must carry token, gateId, quoteId and requestSha256');
    }

    const claims = await this.verifyToken(token);
    if (claims.gateId !== gateId || claims.quoteId !== quoteId || claims.requestSha256 !== requestSha256) {
      throw new Refusal('invalid_payload', 'the payload does not match its token');
    }
    if (claims.scheme !== X402_SCHEME || claims.network !== this.network) throw new Refusal('invalid_network', 'the token was issued for another scheme or network');

    let state: GateState;
    try {
      state = await this.gates.gateState(await this.gates.requireGate(tenantId, claims.gateId));
    } catch (err) {
      if (err instanceof ServiceError && err.status === 404) throw new Refusal('gate_not_found', 'no such gate for this credential');
      throw err;
    }
    const { gate } = state;

    if (claims.payee !== required.payTo || claims.aud !== required.payTo || gate.payeeAgentId !== required.payTo) {
      throw new Refusal('payee_mismatch', 'the payment is for another payee');
    }
    if (String(claims.amount) !== required.amount || gate.amount !== claims.amount) throw new Refusal('amount_mismatch', 'the payment is for another amount');
    if (claims.currency !== required.asset || gate.currency !== claims.currency) throw new Refusal('asset_mismatch', 'the payment is in another currency');
    const terms = required.extra;
    if ((terms.holdbackBps !== undefined && terms.holdbackBps !== gate.holdbackBps) || (terms.disputeWindowSeconds !== undefined && terms.disputeWindowSeconds !== gate.disputeWindowSeconds)) {
      throw new Refusal('terms_mismatch', 'the gate holds back or disputes on other terms than required');
    }
    const binding = requestBindingOf(required.extra);
    if (!binding || x402RequestSha256(binding) !== claims.requestSha256 || (payment.resource && payment.resource.url !== binding.resource)) {
      throw new Refusal('request_binding_mismatch', 'the payment was made for another request');
    }

    if (state.status === 'cancelled' || state.status === 'unfunded' || (state.status === 'expired' && !state.verification)) throw new Refusal('gate_closed', `the gate is ${state.status}`);
    const commitment = state.commitment;
    if (commitment?.kind !== 'authorization' || commitment.authorizationRef !== claims.authorizationRef) {
      throw new Refusal('payment_not_authorized', 'the gate holds no authorization for this token');
    }
    return { claims, state };
  }

  private async verifyToken(token: string): Promise<PaymentTokenClaims & JWTPayload> {
    try {
      const { payload } = await jwtVerify(token, this.jwks, { issuer: this.runtime.config.publicBaseUrl, algorithms: ['EdDSA'] });
      return payload as PaymentTokenClaims & JWTPayload;
    } catch (err) {
      // The token lives exactly as long as its quote.
      if (err instanceof joseErrors.JWTExpired) throw new Refusal('quote_expired', 'the quote this payment was authorized under has expired');
      throw new Refusal('invalid_signature', 'the payment token does not verify against this service\'s keys');
    }
  }

  async close(): Promise<void> {
    await this.gates.close();
  }
}
