import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { BUYER_SESSION_COOKIE, cookieValue, verifyBuyerSession } from '../../domain/buyer-session.ts';
import { secretMatcher } from '../../domain/crypto.ts';
import { errors, serviceError } from '../../domain/errors.ts';
import { grants, type Scope } from '../../domain/scopes.ts';
import type { Runtime } from '../../runtime.ts';
import { consoleSession, csrfTokenMatches } from '../../services/console-sessions.ts';
import { sendError } from './errors.ts';

/**
 * What a route requires: a tenant scope, any valid tenant key whatever its scopes ('tenant', for routes that only
 * describe the caller), the onboarding credentials of the path's tenant ('onboarding', see below), the admin
 * credential or a key with scope `ops` ('admin', the `/ops/*` routes), the admin credential itself and never a
 * tenant key whatever its scopes ('admin-key': third-party UIs such as Bull Board, which show every tenant's jobs
 * and answer nothing in the contract's terms), or nothing at all.
 */
export type RouteAccess = Scope | 'tenant' | 'onboarding' | 'admin' | 'admin-key' | 'public';

export type Principal =
  | { kind: 'admin'; credentialId: 'admin' }
  | { kind: 'key'; credentialId: string; tenantId: string; scopes: string[] }
  /** Acting for the path's tenant on an onboarding route; credentialId is 'admin', a key id or a session id. */
  | { kind: 'onboarding'; via: 'admin' | 'api-key' | 'buyer-session'; credentialId: string; tenantId: string }
  /**
   * The operator (signed in to the console with the admin key) looking into the one tenant the console names
   * (header `x-console-tenant`). It holds every tenant scope there: the admin key can issue itself any key of any
   * tenant (`POST /ops/api-keys`), so this grants nothing the admin key does not already have.
   */
  | { kind: 'operator'; credentialId: 'admin'; tenantId: string };

/** The console's session cookie: a random id of a session in Redis (services/console-sessions.ts), never a key. */
export const CONSOLE_SESSION_COOKIE = 'as_console';
/** The header a console page sends its session's CSRF token in, on every state-changing request. */
export const CSRF_HEADER = 'x-csrf-token';
/** The header the operator's console pages name the tenant they look into with. */
export const CONSOLE_TENANT_HEADER = 'x-console-tenant';
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
const TENANT_ID = /^[A-Za-z0-9_-]{1,128}$/;

declare module 'fastify' {
  interface FastifyContextConfig {
    access?: RouteAccess;
  }
  interface FastifyRequest {
    principal: Principal | null;
  }
}

/** Bearer token, or the password of HTTP Basic (so a browser can open Bull Board). */
export function presentedCredential(request: FastifyRequest): string | null {
  const header = request.headers.authorization;
  if (!header) return null;
  const [scheme, value] = header.split(' ', 2);
  if (!value) return null;
  if (/^bearer$/i.test(scheme!)) return value.trim();
  if (/^basic$/i.test(scheme!)) {
    const decoded = Buffer.from(value, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    return colon >= 0 ? decoded.slice(colon + 1) : null;
  }
  return null;
}

function headerValue(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return typeof value === 'string' && value !== '' ? value : undefined;
}

/** Tenant id of the principal; only reachable on routes that require a tenant scope. */
export function tenantOf(request: FastifyRequest): string {
  const principal = request.principal;
  if (principal?.kind !== 'key' && principal?.kind !== 'onboarding' && principal?.kind !== 'operator')
    throw errors.unauthenticated();
  return principal.tenantId;
}

/**
 * Every route declares `config.access`; a route without one fails at start-up, so "forgot to check a scope" cannot
 * ship. The check runs on request, before the body is read.
 */
export default fp(async function authPlugin(app: FastifyInstance, opts: { runtime: Runtime; adminPrefixes: string[] }) {
  const { config, stores } = opts.runtime;
  const isAdminKey = secretMatcher(config.adminKey);

  app.decorateRequest('principal', null);

  app.addHook('onRoute', (route) => {
    // Third-party UIs (Bull Board) register routes we cannot annotate; their whole prefix is the admin key's alone.
    if (opts.adminPrefixes.some((prefix) => route.url.startsWith(prefix))) {
      route.config = { ...route.config, access: 'admin-key' };
    }
    if (!route.config?.access) {
      throw new Error(`route ${route.method} ${route.url} declares no access scope`);
    }
  });

  /**
   * Onboarding routes (`/v1/tenants/{tenantId}/onboarding/*`, contract section 3) take one of three credentials:
   * header `x-api-key` with the admin key or a tenant key holding `onboarding`, or the buyer session cookie. Each is
   * bound to the path's tenant; a credential of another tenant gets 404, so it learns nothing about this one.
   */
  const onboardingPrincipal = async (request: FastifyRequest): Promise<Principal> => {
    const pathTenant = (request.params as { tenantId?: string }).tenantId;
    if (!pathTenant) throw new Error(`onboarding route ${request.routeOptions.url} has no {tenantId} in its path`);
    const apiKey = request.headers['x-api-key'];
    if (typeof apiKey === 'string' && apiKey !== '') {
      if (isAdminKey(apiKey)) return { kind: 'onboarding', via: 'admin', credentialId: 'admin', tenantId: pathTenant };
      const key = await opts.runtime.credentials.authenticate(stores.apiKeys, apiKey);
      if (!key) throw errors.unauthenticated();
      if (key.tenantId !== pathTenant) throw errors.notFound('tenant');
      if (!grants(key.scopes, 'onboarding')) throw errors.forbidden('onboarding');
      return { kind: 'onboarding', via: 'api-key', credentialId: key._id, tenantId: pathTenant };
    }
    const cookie = cookieValue(request.headers.cookie, BUYER_SESSION_COOKIE);
    if (cookie) {
      const session = verifyBuyerSession(config.onboarding.sessionSecret, cookie);
      if (!session) throw errors.unauthenticated('the buyer session is invalid or expired');
      if (session.tenantId !== pathTenant) throw errors.notFound('tenant');
      return { kind: 'onboarding', via: 'buyer-session', credentialId: session.sessionId, tenantId: pathTenant };
    }
    throw errors.unauthenticated();
  };

  const authorize = async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const access = request.routeOptions.config.access;
    if (access === undefined || access === 'public') return; // 404s carry no route config: nothing to protect.
    if (access === 'onboarding') {
      request.principal = await onboardingPrincipal(request);
      return;
    }

    const credential = presentedCredential(request);
    const sessionToken = credential ? null : cookieValue(request.headers.cookie, CONSOLE_SESSION_COOKIE);
    let principal: Principal;
    if (credential) {
      principal = await credentialPrincipal(credential);
    } else if (sessionToken) {
      principal = await consolePrincipal(request, sessionToken);
    } else {
      if (access === 'admin' || access === 'admin-key')
        reply.header('www-authenticate', 'Basic realm="agent-settlement admin"');
      throw errors.unauthenticated();
    }
    request.principal = principal;
    // The same checks whichever way the credential came: a console session acts exactly as the key it signed in with.
    if (principal.kind === 'admin') {
      if (access === 'admin' || access === 'admin-key') return;
      // The admin credential belongs to no tenant, so it cannot act inside one.
      throw errors.forbidden(access);
    }
    if (principal.kind !== 'key') return; // the operator inside a tenant the console names (see Principal)
    if (access === 'tenant') return;
    // A tenant key, or its console session, never opens what only the admin key may (whatever scopes it holds).
    if (access === 'admin-key')
      throw serviceError('FORBIDDEN', 'only the admin key (or the console signed in with it) may open this', {
        requiredCredential: 'admin',
      });
    const needed: Scope = access === 'admin' ? 'ops' : access;
    if (!grants(principal.scopes, needed)) throw errors.forbidden(needed);
  };

  const credentialPrincipal = async (credential: string): Promise<Principal> => {
    if (isAdminKey(credential)) return { kind: 'admin', credentialId: 'admin' };
    const key = await opts.runtime.credentials.authenticate(stores.apiKeys, credential);
    if (!key) throw errors.unauthenticated();
    return { kind: 'key', credentialId: key._id, tenantId: key.tenantId, scopes: key.scopes };
  };

  /**
   * A request of a console page: its session cookie, plus (on every state-changing method) the session's CSRF token
   * in a header, which another site's page cannot read. SameSite=Strict already keeps the cookie off cross-site
   * requests; the token also covers a sibling subdomain or a browser that ignores SameSite.
   */
  const consolePrincipal = async (request: FastifyRequest, sessionToken: string): Promise<Principal> => {
    const session = await consoleSession(opts.runtime, sessionToken);
    if (!session) throw errors.unauthenticated('the console session is invalid or expired; sign in again at /console');
    if (!SAFE_METHODS.has(request.method) && !csrfTokenMatches(session, headerValue(request, CSRF_HEADER))) {
      throw serviceError(
        'FORBIDDEN',
        `a console request that changes something must carry the session's CSRF token in ${CSRF_HEADER}`,
      );
    }
    const tenant = headerValue(request, CONSOLE_TENANT_HEADER);
    if (session.signer.kind === 'admin') {
      if (!tenant) return { kind: 'admin', credentialId: 'admin' };
      if (!TENANT_ID.test(tenant)) throw errors.validation(`${CONSOLE_TENANT_HEADER} is not a tenant id`);
      return { kind: 'operator', credentialId: 'admin', tenantId: tenant };
    }
    // A tenant key sees its own tenant only; naming another gets what any other tenant's id gets.
    if (tenant && tenant !== session.signer.tenantId) throw errors.notFound('tenant');
    return {
      kind: 'key',
      credentialId: session.signer.keyId,
      tenantId: session.signer.tenantId,
      scopes: session.scopes,
    };
  };

  app.addHook('onRequest', async (request, reply) => {
    try {
      await authorize(request, reply);
    } catch (err) {
      return sendError(request, reply, err);
    }
  });
});
