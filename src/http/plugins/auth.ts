import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { BUYER_SESSION_COOKIE, cookieValue, verifyBuyerSession } from '../../domain/buyer-session.ts';
import { errors } from '../../domain/errors.ts';
import { grants, type Scope } from '../../domain/scopes.ts';
import type { Runtime } from '../../runtime.ts';
import { sendError } from './errors.ts';

/**
 * What a route requires: a tenant scope, any valid tenant key whatever its scopes ('tenant', for routes that only
 * describe the caller), the onboarding credentials of the path's tenant ('onboarding', see below), the admin
 * credential, or nothing at all.
 */
export type RouteAccess = Scope | 'tenant' | 'onboarding' | 'admin' | 'public';

export type Principal =
  | { kind: 'admin'; credentialId: 'admin' }
  | { kind: 'key'; credentialId: string; tenantId: string; scopes: string[] }
  /** Acting for the path's tenant on an onboarding route; credentialId is 'admin', a key id or a session id. */
  | { kind: 'onboarding'; via: 'admin' | 'api-key' | 'buyer-session'; credentialId: string; tenantId: string };

declare module 'fastify' {
  interface FastifyContextConfig {
    access?: RouteAccess;
  }
  interface FastifyRequest {
    principal: Principal | null;
  }
}

function sha256(value: string): Buffer {
  return createHash('sha256').update(value).digest();
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

/** Tenant id of the principal; only reachable on routes that require a tenant scope. */
export function tenantOf(request: FastifyRequest): string {
  const principal = request.principal;
  if (principal?.kind !== 'key' && principal?.kind !== 'onboarding') throw errors.unauthenticated();
  return principal.tenantId;
}

/**
 * Every route declares `config.access`; a route without one fails at start-up, so "forgot to check a scope" cannot
 * ship. The check runs on request, before the body is read.
 */
export default fp(async function authPlugin(app: FastifyInstance, opts: { runtime: Runtime; adminPrefixes: string[] }) {
  const { config, stores } = opts.runtime;
  const adminDigest = sha256(config.adminKey);
  const isAdminKey = (credential: string) => timingSafeEqual(sha256(credential), adminDigest);

  app.decorateRequest('principal', null);

  app.addHook('onRoute', (route) => {
    // Third-party UIs (Bull Board) register routes we cannot annotate; their whole prefix is admin-only.
    if (opts.adminPrefixes.some((prefix) => route.url.startsWith(prefix))) {
      route.config = { ...route.config, access: 'admin' };
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
    if (!credential) {
      if (access === 'admin') reply.header('www-authenticate', 'Basic realm="agent-settlement admin"');
      throw errors.unauthenticated();
    }
    if (isAdminKey(credential)) {
      request.principal = { kind: 'admin', credentialId: 'admin' };
      if (access === 'admin') return;
      // The admin credential belongs to no tenant, so it cannot act inside one.
      throw errors.forbidden(access);
    }
    const key = await opts.runtime.credentials.authenticate(stores.apiKeys, credential);
    if (!key) throw errors.unauthenticated();
    request.principal = { kind: 'key', credentialId: key._id, tenantId: key.tenantId, scopes: key.scopes };
    if (access === 'tenant') return;
    const needed: Scope = access === 'admin' ? 'ops' : access;
    if (!grants(key.scopes, needed)) throw errors.forbidden(needed);
  };

  app.addHook('onRequest', async (request, reply) => {
    try {
      await authorize(request, reply);
    } catch (err) {
      return sendError(request, reply, err);
    }
  });
});
