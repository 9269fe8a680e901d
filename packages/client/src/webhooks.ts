// Receiver helper: verify a webhook delivery from the Agent Run Settlement Service before trusting or parsing it.
// Self-contained (node:crypto only), so it can be copied into a receiver as it is.
//
//   import { verifyWebhook, WebhookVerificationError } from 'agent-settlement-client/webhooks';
//   const event = verifyWebhook(rawBody, request.headers, process.env.WEBHOOK_SECRET!);
//
// Deliveries follow Standard Webhooks (https://www.standardwebhooks.com): headers `webhook-id`,
// `webhook-timestamp` (unix seconds) and `webhook-signature`, a space-separated list of
// `v1,<base64 HMAC-SHA256(secret bytes, "{id}.{timestamp}.{body}")>`; `service-signature` carries the same value.
import { createHmac, timingSafeEqual } from 'node:crypto';

export type WebhookVerificationErrorCode =
  | 'MISSING_HEADERS'
  | 'INVALID_TIMESTAMP'
  | 'TIMESTAMP_TOO_OLD'
  | 'TIMESTAMP_TOO_NEW'
  | 'INVALID_SECRET'
  | 'NO_MATCHING_SIGNATURE'
  | 'INVALID_PAYLOAD';

/** Thrown for any delivery that must not be trusted; `code` says why (never which secret was tried). */
export class WebhookVerificationError extends Error {
  constructor(
    readonly code: WebhookVerificationErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'WebhookVerificationError';
  }
}

/** The delivered event, as the service sent it. */
export interface WebhookEvent<T = Record<string, unknown>> {
  id: string;
  type: string;
  createdAt: string;
  /** Test traffic (onboarding's first paid call); only endpoints created with `includeTestEvents` receive it. Absent before this field existed. */
  test?: boolean;
  data: T;
}

/** Node's IncomingHttpHeaders, a plain record, or a Fetch API Headers object. */
export type WebhookHeaders = Record<string, string | string[] | undefined> | { get(name: string): string | null };

/** A `whsec_…` string (or bare base64), or the raw key bytes. Pass several during a secret rotation. */
export type WebhookSecret = string | Uint8Array;

export interface VerifyWebhookOptions {
  /** How far the timestamp may be from now, in seconds (default 300). Older deliveries are replays. */
  toleranceSeconds?: number;
  /** "Now" for the timestamp check (default Date.now()); a Date or milliseconds since the epoch. */
  now?: Date | number;
}

const DEFAULT_TOLERANCE_SECONDS = 5 * 60;
/** More signatures than this in one header is not a real delivery; bounds the work an attacker can cause. */
const MAX_SIGNATURES = 16;

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === 'function') {
    return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  }
  const record = headers as Record<string, string | string[] | undefined>;
  let value = record[name];
  if (value === undefined) {
    const key = Object.keys(record).find((k) => k.toLowerCase() === name);
    value = key === undefined ? undefined : record[key];
  }
  return Array.isArray(value) ? value.join(' ') : value;
}

function keyBytes(secret: WebhookSecret): Buffer {
  if (secret instanceof Uint8Array) {
    if (secret.byteLength === 0) throw new WebhookVerificationError('INVALID_SECRET', 'the webhook secret is empty');
    return Buffer.from(secret);
  }
  if (typeof secret !== 'string')
    throw new WebhookVerificationError('INVALID_SECRET', 'the webhook secret must be a string or bytes');
  const encoded = secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret;
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(encoded)) {
    throw new WebhookVerificationError('INVALID_SECRET', 'the webhook secret is not whsec_ followed by base64');
  }
  return Buffer.from(encoded, 'base64');
}

/**
 * Verifies a delivery and returns its parsed event, or throws WebhookVerificationError.
 *
 * - `rawBody` must be the exact bytes received (verify before any JSON parsing or re-serialising).
 * - `secret` may be an array: any one of them verifying is enough (use this while rotating a secret).
 * - The timestamp must be within `toleranceSeconds` of now, so a captured delivery cannot be replayed later.
 * - Signatures are compared in constant time; every `v1,` signature in the header is tried.
 */
export function verifyWebhook<T = Record<string, unknown>>(
  rawBody: string | Uint8Array,
  headers: WebhookHeaders,
  secret: WebhookSecret | WebhookSecret[],
  options: VerifyWebhookOptions = {},
): WebhookEvent<T> {
  const msgId = header(headers, 'webhook-id');
  const timestampText = header(headers, 'webhook-timestamp');
  const signatureText = header(headers, 'webhook-signature') ?? header(headers, 'service-signature');
  if (!msgId || !timestampText || !signatureText) {
    throw new WebhookVerificationError('MISSING_HEADERS', 'missing webhook-id, webhook-timestamp or webhook-signature');
  }
  if (!/^\d{1,15}$/.test(timestampText.trim())) {
    throw new WebhookVerificationError('INVALID_TIMESTAMP', 'webhook-timestamp is not unix seconds');
  }
  const timestamp = Number(timestampText.trim());
  const nowMs =
    options.now === undefined ? Date.now() : typeof options.now === 'number' ? options.now : options.now.getTime();
  const now = Math.floor(nowMs / 1000);
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (now - timestamp > tolerance)
    throw new WebhookVerificationError('TIMESTAMP_TOO_OLD', 'the delivery timestamp is too old');
  if (timestamp - now > tolerance)
    throw new WebhookVerificationError('TIMESTAMP_TOO_NEW', 'the delivery timestamp is in the future');

  const secrets = (Array.isArray(secret) ? secret : [secret]).map(keyBytes);
  if (secrets.length === 0) throw new WebhookVerificationError('INVALID_SECRET', 'no webhook secret given');

  const body =
    typeof rawBody === 'string'
      ? Buffer.from(rawBody, 'utf8')
      : Buffer.from(rawBody.buffer, rawBody.byteOffset, rawBody.byteLength);
  const expected = secrets.map((key) =>
    createHmac('sha256', key).update(`${msgId}.${timestampText.trim()}.`).update(body).digest(),
  );
  const presented = signatureText
    .split(' ')
    .filter(Boolean)
    .slice(0, MAX_SIGNATURES)
    .flatMap((entry) => {
      const comma = entry.indexOf(',');
      if (comma < 0 || entry.slice(0, comma) !== 'v1') return [];
      const sig = Buffer.from(entry.slice(comma + 1), 'base64');
      return sig.length === 32 ? [sig] : [];
    });
  let matched = false;
  for (const sig of presented) {
    for (const mac of expected) {
      // Every comparison runs (no early exit), so timing does not reveal which secret or position matched.
      if (timingSafeEqual(sig, mac)) matched = true;
    }
  }
  if (!matched) throw new WebhookVerificationError('NO_MATCHING_SIGNATURE', 'no signature matches this delivery');

  let event: unknown;
  try {
    event = JSON.parse(body.toString('utf8'));
  } catch {
    throw new WebhookVerificationError('INVALID_PAYLOAD', 'the body is not JSON');
  }
  const e = event as Partial<WebhookEvent<T>> | null;
  if (
    !e ||
    typeof e !== 'object' ||
    typeof e.id !== 'string' ||
    typeof e.type !== 'string' ||
    typeof e.data !== 'object' ||
    e.data === null
  ) {
    throw new WebhookVerificationError('INVALID_PAYLOAD', 'the body is not an event {id, type, createdAt, data}');
  }
  if (e.id !== msgId) throw new WebhookVerificationError('INVALID_PAYLOAD', 'the body id does not match webhook-id');
  return e as WebhookEvent<T>;
}
