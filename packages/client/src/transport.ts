// The fetch every client call goes through: an Idempotency-Key on each state-changing call, and retries with
// backoff and jitter that honour Retry-After, for as many attempts as the caller allows.
import { randomUUID } from 'node:crypto';
import { parseRetryAfter } from './retry-after.ts';

export type FetchLike = (request: Request) => Promise<Response>;

export interface RetryOptions {
  /** Attempts in all, the first included (default 4); 1 turns retries off. */
  maxAttempts?: number;
  /** Backoff before the first retry when the service names no Retry-After (ms, default 250); doubles each retry. */
  baseDelayMs?: number;
  /**
   * Longest wait between two attempts (ms, default 10 000). When the service asks for a longer Retry-After the call
   * stops retrying and surfaces the error (with retryAfterSeconds) rather than retry before it was told to.
   */
  maxDelayMs?: number;
  /** Told before each retry: what went wrong and how long the client waits. */
  onRetry?: (retry: {
    attempt: number;
    delayMs: number;
    method: string;
    url: string;
    status?: number;
    error?: unknown;
  }) => void;
}

const DEFAULTS = { maxAttempts: 4, baseDelayMs: 250, maxDelayMs: 10_000 };
const STATE_CHANGING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
/** Safe to send twice by their nature; a state-changing call is made so by its Idempotency-Key. */
const IDEMPOTENT = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE']);
export const IDEMPOTENCY_HEADER = 'idempotency-key';

/** Statuses a retry can cure: rate limited, or unavailable for a moment. */
const RETRYABLE_STATUS = new Set([429, 503]);

/** A 409 IDEMPOTENCY_IN_PROGRESS: the first attempt with this key is still running (say, it timed out on our side). */
async function isInProgress(response: Response): Promise<boolean> {
  if (response.status !== 409) return false;
  const body = (await response
    .clone()
    .json()
    .catch(() => null)) as { code?: unknown } | null;
  return body?.code === 'IDEMPOTENCY_IN_PROGRESS';
}

function sleep(ms: number, signal: AbortSignal | null): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Wraps `base` so that each call (one logical call: openapi-fetch calls it once per operation) carries one
 * Idempotency-Key across all its attempts, and is retried on 429, 503, 409 IDEMPOTENCY_IN_PROGRESS and, when sending
 * it twice is safe, on network errors. Without Retry-After the wait is "full jitter" exponential backoff.
 */
export function retryingFetch(base: FetchLike, options: RetryOptions | false = {}): FetchLike {
  const { maxAttempts, baseDelayMs, maxDelayMs } = { ...DEFAULTS, ...(options || { maxAttempts: 1 }) };
  const onRetry = options ? options.onRetry : undefined;
  return async (request) => {
    const method = request.method.toUpperCase();
    const headers = new Headers(request.headers);
    if (STATE_CHANGING.has(method) && !headers.has(IDEMPOTENCY_HEADER)) headers.set(IDEMPOTENCY_HEADER, randomUUID());
    const replayable = IDEMPOTENT.has(method) || headers.has(IDEMPOTENCY_HEADER);
    // Read once: every attempt sends the same bytes.
    const body = method === 'GET' || method === 'HEAD' ? undefined : await request.arrayBuffer();
    const attemptRequest = () =>
      new Request(request.url, {
        method,
        headers,
        body: body?.byteLength ? body : undefined,
        signal: request.signal,
        redirect: request.redirect,
      });

    for (let attempt = 1; ; attempt++) {
      const backoff = Math.random() * Math.min(maxDelayMs, baseDelayMs * 2 ** (attempt - 1));
      let response: Response;
      try {
        response = await base(attemptRequest());
      } catch (error) {
        if (request.signal.aborted || !replayable || attempt >= maxAttempts) throw error;
        onRetry?.({ attempt, delayMs: backoff, method, url: request.url, error });
        await sleep(backoff, request.signal);
        continue;
      }
      if (attempt >= maxAttempts || !(RETRYABLE_STATUS.has(response.status) || (await isInProgress(response))))
        return response;
      const askedMs = parseRetryAfter(response.headers.get('retry-after'));
      if (askedMs !== null && askedMs > maxDelayMs) return response;
      // After the wait the service asked for, a little jitter so that callers told the same second do not return together.
      const delayMs = askedMs === null ? backoff : askedMs + Math.random() * baseDelayMs;
      onRetry?.({ attempt, delayMs, method, url: request.url, status: response.status });
      await response.body?.cancel().catch(() => undefined);
      await sleep(delayMs, request.signal);
    }
  };
}
