// The buyer session: a stateless cookie value that lets a person's browser drive one tenant's onboarding routes.
// `v1.<payload>.<mac>`: payload is base64url JSON {tenantId, sessionId, exp (unix seconds)}, mac is base64url
// HMAC-SHA256 over "v1.<payload>" with the server's session secret. Nothing is stored; it ends when it expires.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

export const BUYER_SESSION_COOKIE = 'ml_buyer_session';
const VERSION = 'v1';

export interface BuyerSession {
  tenantId: string;
  /** Random per issue: names the session in logs and idempotency scopes without revealing the cookie. */
  sessionId: string;
  expiresAt: Date;
}

function mac(secret: Buffer, signed: string): Buffer {
  return createHmac('sha256', secret).update(signed).digest();
}

export function signBuyerSession(
  secret: Buffer,
  tenantId: string,
  ttlSeconds: number,
  now = new Date(),
): { value: string; session: BuyerSession } {
  const exp = Math.floor(now.getTime() / 1000) + ttlSeconds;
  const sessionId = `bss_${randomBytes(12).toString('base64url')}`;
  const payload = Buffer.from(JSON.stringify({ tenantId, sessionId, exp })).toString('base64url');
  const signed = `${VERSION}.${payload}`;
  return {
    value: `${signed}.${mac(secret, signed).toString('base64url')}`,
    session: { tenantId, sessionId, expiresAt: new Date(exp * 1000) },
  };
}

/** The session a cookie value carries, or null when it is malformed, forged or expired. */
export function verifyBuyerSession(secret: Buffer, value: string, now = new Date()): BuyerSession | null {
  const parts = value.split('.');
  if (parts.length !== 3 || parts[0] !== VERSION) return null;
  const [, payload, presented] = parts as [string, string, string];
  const expected = mac(secret, `${VERSION}.${payload}`);
  const given = Buffer.from(presented, 'base64url');
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return null;
  let claims: { tenantId?: unknown; sessionId?: unknown; exp?: unknown };
  try {
    claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
  } catch {
    return null;
  }
  const { tenantId, sessionId, exp } = claims;
  if (typeof tenantId !== 'string' || typeof sessionId !== 'string' || typeof exp !== 'number') return null;
  if (exp * 1000 <= now.getTime()) return null;
  return { tenantId, sessionId, expiresAt: new Date(exp * 1000) };
}

/** The value of one cookie in a Cookie header (RFC 6265 `name=value; name2=value2`), or null. */
export function cookieValue(header: string | undefined, name: string): string | null {
  if (!header) return null;
  for (const pair of header.split(';')) {
    const eq = pair.indexOf('=');
    if (eq > 0 && pair.slice(0, eq).trim() === name)
      return pair
        .slice(eq + 1)
        .trim()
        .replace(/^"(.*)"$/, '$1');
  }
  return null;
}
