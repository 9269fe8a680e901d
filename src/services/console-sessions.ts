// Console sign-in: a person presents the admin key or a tenant API key once; the browser then holds only a random
// session id in an HttpOnly cookie, and Redis holds who signed in (the key's id and tenant, never its secret) until
// the session's TTL. Every request re-checks the key, so revoking it ends its console sessions too.
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { secretMatcher } from '../domain/crypto.ts';
import { errors } from '../domain/errors.ts';
import { grants, type Scope } from '../domain/scopes.ts';
import type { Runtime } from '../runtime.ts';
import type { ConsoleSessionDoc, ConsoleSigner } from '../store/console-sessions.ts';

/** A tenant key must be able to read something the console shows; a write scope implies its read scope. */
const READ_SCOPES: readonly Scope[] = ['runs:read', 'x402:read', 'wallets:read', 'agents:read', 'webhooks:read'];

export interface ConsoleSession {
  signer: ConsoleSigner;
  csrfToken: string;
  expiresAt: Date;
  /** The signed-in key's scopes now (every scope for the operator). */
  scopes: string[];
}

/** Signs in with a key: the new session's cookie value (shown to the browser only) and the session. */
export async function signInToConsole(
  runtime: Runtime,
  credential: string,
  now = new Date(),
): Promise<{ sessionToken: string; session: ConsoleSession }> {
  let signer: ConsoleSigner;
  let scopes: string[];
  if (secretMatcher(runtime.config.adminKey)(credential)) {
    signer = { kind: 'admin' };
    scopes = ['ops'];
  } else {
    const key = await runtime.credentials.authenticate(runtime.stores.apiKeys, credential, now);
    if (!key) throw errors.unauthenticated('that key is not valid (wrong, revoked or expired)');
    if (!READ_SCOPES.some((scope) => grants(key.scopes, scope))) throw errors.forbidden(READ_SCOPES.join(' or '));
    signer = { kind: 'key', keyId: key._id, tenantId: key.tenantId };
    scopes = key.scopes;
  }
  const ttl = runtime.config.console.sessionTtlSeconds;
  const doc: ConsoleSessionDoc = {
    signer,
    csrfToken: randomBytes(32).toString('base64url'),
    createdAt: now.toISOString(),
    expiresAt: new Date(now.getTime() + ttl * 1000).toISOString(),
  };
  const sessionToken = randomBytes(32).toString('base64url');
  await runtime.stores.consoleSessions.put(sessionToken, doc, ttl);
  return { sessionToken, session: { signer, csrfToken: doc.csrfToken, expiresAt: new Date(doc.expiresAt), scopes } };
}

/** The live session a cookie value names, or null: unknown, expired, or signed in with a key no longer live. */
export async function consoleSession(
  runtime: Runtime,
  sessionToken: string,
  now = new Date(),
): Promise<ConsoleSession | null> {
  if (!/^[A-Za-z0-9_-]{43}$/.test(sessionToken)) return null;
  const doc = await runtime.stores.consoleSessions.get(sessionToken);
  if (!doc || new Date(doc.expiresAt).getTime() <= now.getTime()) return null;
  const base = { signer: doc.signer, csrfToken: doc.csrfToken, expiresAt: new Date(doc.expiresAt) };
  if (doc.signer.kind === 'admin') return { ...base, scopes: ['ops'] };
  const key = await runtime.credentials.liveKeyById(runtime.stores.apiKeys, doc.signer.keyId, now);
  if (!key || key.tenantId !== doc.signer.tenantId) return null;
  return { ...base, scopes: key.scopes };
}

/** Whether a state-changing request carries its session's CSRF token (compared in constant time). */
export function csrfTokenMatches(session: ConsoleSession, presented: string | undefined): boolean {
  if (!presented) return false;
  const a = Buffer.from(presented);
  const b = Buffer.from(session.csrfToken);
  return a.length === b.length && timingSafeEqual(a, b);
}

export async function signOutOfConsole(runtime: Runtime, sessionToken: string): Promise<void> {
  await runtime.stores.consoleSessions.delete(sessionToken);
}
