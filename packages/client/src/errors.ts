// The error every refused call surfaces: the service's error body (contract section 2) with the HTTP status.
import { parseRetryAfter } from './retry-after.ts';

/** What the service answers on every error: `{code, message, details?, requestId}`. */
export interface ApiErrorBody {
  code: string;
  message: string;
  details?: Record<string, unknown>;
  requestId?: string;
}

/** A call the service answered with a 4xx or 5xx (after any retries). `code` is one of the contract's error codes. */
export class SettlementApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown> | undefined;
  readonly requestId: string | undefined;
  /** Seconds the service asked to wait (Retry-After), when it did. */
  readonly retryAfterSeconds: number | undefined;

  constructor(status: number, body: ApiErrorBody, retryAfterSeconds?: number) {
    super(`${body.code}: ${body.message} (HTTP ${status})`);
    this.name = 'SettlementApiError';
    this.status = status;
    this.code = body.code;
    this.details = body.details;
    this.requestId = body.requestId;
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

function isErrorBody(value: unknown): value is ApiErrorBody {
  const v = value as Partial<ApiErrorBody> | null;
  return typeof v === 'object' && v !== null && typeof v.code === 'string' && typeof v.message === 'string';
}

/**
 * The error for a non-2xx answer. The body is the contract's error object; `{error: {...}}` is read too, and an answer
 * that is neither (a proxy's HTML page) still becomes a SettlementApiError with code HTTP_<status>.
 */
export function apiErrorFrom(status: number, body: unknown, retryAfter: string | null): SettlementApiError {
  const nested = (body as { error?: unknown } | null)?.error;
  const parsed: ApiErrorBody = isErrorBody(body)
    ? body
    : isErrorBody(nested)
      ? nested
      : {
          code: `HTTP_${status}`,
          message: typeof body === 'string' && body ? body.slice(0, 200) : 'the service answered without an error body',
        };
  const ms = parseRetryAfter(retryAfter);
  return new SettlementApiError(status, parsed, ms === null ? undefined : ms / 1000);
}
