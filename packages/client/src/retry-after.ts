// HTTP Retry-After (RFC 9110 section 10.2.3): how long a server asked its caller to wait.

/** Retry-After as delta-seconds or an HTTP date, in ms; null when absent or unreadable. */
export function parseRetryAfter(value: string | undefined | null, now: number = Date.now()): number | null {
  if (value === undefined || value === null) return null;
  const text = value.trim();
  if (text === '') return null;
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  if (Number.isNaN(date)) return null;
  return Math.max(0, date - now);
}
