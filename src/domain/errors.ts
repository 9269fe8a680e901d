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

/**
 * Every error code this service answers with and its one status (the x402 gate's codes are below). A code's status
 * is decided here, never where the error is thrown: `serviceError(code, ...)`. VALIDATION_FAILED is the one code with
 * a second status: 422 through `errors.unprocessable` (see the comment at the top).
 */
export const ERROR_STATUS = {
  BAD_REQUEST: 400,
  VALIDATION_FAILED: 400,
  SIGNATURE_INVALID: 400,
  INVALID_IDEMPOTENCY_KEY: 400,
  UNAUTHENTICATED: 401,
  INSUFFICIENT_FUNDS: 402,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  METHOD_NOT_ALLOWED: 405,
  REQUEST_TIMEOUT: 408,
  AGENT_EXISTS: 409,
  AGENT_NAMESPACE_TAKEN: 409,
  KEY_EXISTS: 409,
  CHAIN_CONFLICT: 409,
  TRANSITION_ILLEGAL: 409,
  BALANCE_LIMIT: 409,
  IDEMPOTENCY_IN_PROGRESS: 409,
  AUDIT_IN_PROGRESS: 409,
  WEBHOOK_ENDPOINT_PULL: 409,
  WEBHOOK_ENDPOINT_DISABLED: 409,
  BODY_TOO_LARGE: 413,
  URI_TOO_LONG: 414,
  UNSUPPORTED_MEDIA_TYPE: 415,
  IDEMPOTENCY_KEY_REUSED: 422,
  WEBHOOK_DESTINATION_REFUSED: 422,
  RATE_LIMITED: 429,
  HEADERS_TOO_LARGE: 431,
  INTERNAL: 500,
  SETTLD_API_CALL_FAILED: 502,
  MCP_SMOKE_TEST_FAILED: 502,
  UNAVAILABLE: 503,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS | X402ErrorCode;

/** The status of any code this service answers with. */
export function statusOf(code: ErrorCode): number {
  return code in ERROR_STATUS
    ? ERROR_STATUS[code as keyof typeof ERROR_STATUS]
    : X402_ERROR_STATUS[code as X402ErrorCode];
}

/** An error with one of the contract's codes, at that code's status. */
export function serviceError(code: ErrorCode, message: string, details?: ErrorDetails): ServiceError {
  return new ServiceError(statusOf(code), code, message, details);
}

type ConflictCode = {
  [C in keyof typeof ERROR_STATUS]: (typeof ERROR_STATUS)[C] extends 409 ? C : never;
}[keyof typeof ERROR_STATUS];

export const errors = {
  validation: (message: string, details?: ErrorDetails) => serviceError('VALIDATION_FAILED', message, details),
  unprocessable: (message: string, details?: ErrorDetails) =>
    new ServiceError(422, 'VALIDATION_FAILED', message, details),
  unauthenticated: (message = 'missing or invalid credential') => serviceError('UNAUTHENTICATED', message),
  forbidden: (scope: string) =>
    serviceError('FORBIDDEN', `this credential lacks the scope ${scope}`, { requiredScope: scope }),
  notFound: (what = 'resource') => serviceError('NOT_FOUND', `${what} not found`),
  conflict: (code: ConflictCode, message: string, details?: ErrorDetails) => serviceError(code, message, details),
  /** A webhook send (test, resend, recovery) to an address the SSRF guard refuses, as deliveries would be. */
  destinationRefused: (message: string) => serviceError('WEBHOOK_DESTINATION_REFUSED', message),
  transitionIllegal: (message: string, status: string) => serviceError('TRANSITION_ILLEGAL', message, { status }),
  unavailable: (message = 'a backing service is unavailable; retry shortly') => serviceError('UNAVAILABLE', message),
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
  // Witnessed usage (a session charge priced from a signed UsageRecord.v1; docs/x402.md "Witnessed usage").
  /** A metric the session's price schedule does not price. */
  X402_USAGE_METRIC_UNKNOWN: 422,
  /** A usage count that is negative, not an integer, or beyond a safe integer. */
  X402_USAGE_COUNT_INVALID: 422,
  /** A usage record that is not a UsageRecord.v1 (its shape, its schema, its hashes). */
  X402_USAGE_RECORD_INVALID: 422,
  /** The payee's signature is not over this record by an active key of the payee agent. */
  X402_USAGE_PAYEE_SIGNATURE_INVALID: 422,
  /** The payer's signature is not over this record by an active key of the payer agent. */
  X402_USAGE_PAYER_SIGNATURE_INVALID: 422,
  /** The record names another session, payment, payee or request than the charge (or its hold). */
  X402_USAGE_RECORD_MISMATCH: 422,
  /** The priced usage is above the session's per-call maximum, or above what the payment's verify held. */
  X402_USAGE_ABOVE_LIMIT: 409,
  /** The priced usage is above the schedule's cap: refused, never clamped. */
  X402_USAGE_ABOVE_CAP: 422,
  /** Usage sent to a session without a price schedule. */
  X402_USAGE_NOT_PRICED: 422,
  /** A charge with both an amount and usage (one or the other). */
  X402_USAGE_AND_AMOUNT: 422,
  /** A plain amount on a session that pays acknowledged usage only. */
  X402_USAGE_REQUIRED: 422,
  /** An acknowledgement of a charge that carries no usage. */
  X402_USAGE_NOT_METERED: 422,
  /** An acknowledgement that came after the close had decided the charge unacknowledged. */
  X402_USAGE_ACK_AFTER_CLOSE: 409,
  /** A dispute citing a line whose usage the payer acknowledged. */
  X402_USAGE_ACKNOWLEDGED: 409,
} as const;

export type X402ErrorCode = keyof typeof X402_ERROR_STATUS;

export function x402Error(code: X402ErrorCode, message: string, details?: ErrorDetails): ServiceError {
  return serviceError(code, message, details);
}
