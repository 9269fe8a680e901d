// Typed errors with the contract's codes. The HTTP error plugin turns them into the contract's error body; the
// status lives here because each code has exactly one status in the contract.

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
  unauthenticated: (message = 'missing or invalid credential') => new ServiceError(401, 'UNAUTHENTICATED', message),
  forbidden: (scope: string) =>
    new ServiceError(403, 'FORBIDDEN', `this credential lacks the scope ${scope}`, { requiredScope: scope }),
  notFound: (what = 'resource') => new ServiceError(404, 'NOT_FOUND', `${what} not found`),
  conflict: (code: string, message: string, details?: ErrorDetails) => new ServiceError(409, code, message, details),
  transitionIllegal: (message: string, status: string) =>
    new ServiceError(409, 'TRANSITION_ILLEGAL', message, { status }),
  unavailable: (message = 'a backing service is unavailable; retry shortly') =>
    new ServiceError(503, 'UNAVAILABLE', message),
};
