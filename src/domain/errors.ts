// Typed errors with the contract's codes. The HTTP error plugin turns them into the contract's error body; the
// status lives here. VALIDATION_FAILED is 400 when the request breaks its schema (the OpenAPI document says so) and
// 422 when it satisfies the schema but breaks a rule a schema cannot state (a time in the past, payer = payee, a
// cursor this API never issued), so that a client generated from the document can tell the two apart.

export type ErrorDetails = Record<string, unknown>;

export class ServiceError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: ErrorDetails,
  ) {
    super(message);
    this.name = 'ServiceError';
  }
}

export const errors = {
  validation: (message: string, details?: ErrorDetails) => new ServiceError(400, 'VALIDATION_FAILED', message, details),
  unprocessable: (message: string, details?: ErrorDetails) =>
    new ServiceError(422, 'VALIDATION_FAILED', message, details),
  unauthenticated: (message = 'missing or invalid credential') => new ServiceError(401, 'UNAUTHENTICATED', message),
  forbidden: (scope: string) =>
    new ServiceError(403, 'FORBIDDEN', `this credential lacks the scope ${scope}`, { requiredScope: scope }),
  notFound: (what = 'resource') => new ServiceError(404, 'NOT_FOUND', `${what} not found`),
  conflict: (code: string, message: string, details?: ErrorDetails) => new ServiceError(409, code, message, details),
  /** A webhook send (test, resend, recovery) to an address the SSRF guard refuses, as deliveries would be. */
  destinationRefused: (message: string) => new ServiceError(422, 'WEBHOOK_DESTINATION_REFUSED', message),
  transitionIllegal: (message: string, status: string) =>
    new ServiceError(409, 'TRANSITION_ILLEGAL', message, { status }),
  unavailable: (message = 'a backing service is unavailable; retry shortly') =>
    new ServiceError(503, 'UNAVAILABLE', message),
};

/**
 * The x402 gate's codes (contract section 8) and their one status each: 409, except a wound-down agent (410) and a
 * capture above what was authorized (422: the request itself is wrong, whatever the gate's state).
 */
export const X402_ERROR_STATUS = {
  X402_GATE_TERMINAL: 409,
  X402_QUOTE_NOT_FOUND: 409,
  X402_QUOTE_EXPIRED: 409,
  X402_QUOTE_MISMATCH: 409,
  X402_REQUEST_BINDING_MISMATCH: 409,
  X402_WALLET_DECISION_REQUIRED: 409,
  X402_WALLET_POLICY_VIOLATION: 409,
  X402_AUTHORIZATION_ESCALATION_REQUIRED: 409,
  X402_ESCALATION_TERMINAL: 409,
  /** A decision on an escalation whose deadline passed: it is (or is about to be) denied by itself. */
  X402_ESCALATION_DEADLINE_PASSED: 409,
  X402_OVERRIDE_INVALID: 409,
  X402_OVERRIDE_REPLAYED: 409,
  X402_PAYMENT_NOT_AUTHORIZED: 409,
  /** A success report after the authorization's deadline (its token's expiry plus the grace): the payer is refunded. */
  X402_AUTHORIZATION_EXPIRED: 409,
  X402_SESSION_CLOSED: 409,
  X402_SESSION_EXPIRED: 409,
  X402_SESSION_BUDGET_EXCEEDED: 409,
  X402_SESSION_LIMIT_EXCEEDED: 409,
  X402_SESSION_PAYEE_NOT_ALLOWED: 409,
  X402_SESSION_PAYMENT_REUSED: 409,
  /** A settle or charge naming another payee than the one its verify held the amount for. */
  X402_PAYEE_MISMATCH: 409,
  /** A payment in another asset than the session's currency (at verify, settle or charge). */
  X402_ASSET_MISMATCH: 409,
  /** A verify (or a facilitator settle) reporting a call cost above the gate's authorized amount: nothing moves. */
  X402_CAPTURE_EXCEEDS_AUTHORIZATION: 422,
  X402_AGENT_WOUND_DOWN: 410,
} as const;

export type X402ErrorCode = keyof typeof X402_ERROR_STATUS;

export function x402Error(code: X402ErrorCode, message: string, details?: ErrorDetails): ServiceError {
  return new ServiceError(X402_ERROR_STATUS[code], code, message, details);
}
