import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import type { RateLimitPolicy } from '../../config.ts';
import { ServiceError } from '../../domain/errors.ts';
import type { Runtime } from '../../runtime.ts';
import { LeasedLimiter } from '../rate-leases.ts';
import { sendError } from './errors.ts';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** false exempts a route (health probes must answer even when a caller is over budget). */
    rateLimit?: boolean;
    /**
     * Draw the caller's budget from this process's lease (see rate-leases.ts) instead of one Redis round trip per
     * request: only for a route whose every success needs Redis and MongoDB in its handler, so that during an outage
     * it still fails as every request does (a lease only skips the limit's own round trip).
     */
    rateLimitLease?: boolean;
    /**
     * An extra budget for an expensive route, shared by every credential of the caller's tenant and counted on top
     * of the default one; both appear in the RateLimit headers under their names.
     */
    tenantRateLimit?: { name: string; policy: RateLimitPolicy };
  }
}

const TENANT_POLICY_CACHE_MS = 30_000;

/**
 * Fixed-window limits per credential (per client IP where there is none), counted in Redis by
 * rate-limiter-flexible so every API process draws on one budget; a route that opts in (a paid session call) draws
 * through leases of a few points at a time (see rate-leases.ts). Headers follow the IETF RateLimit draft.
 */
export default fp(async function rateLimitPlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { config, redis, stores } = opts.runtime;
  const limiters = new Map<string, LeasedLimiter>();
  const tenantPolicies = new Map<string, { policy: RateLimitPolicy; until: number }>();

  const limiterFor = (name: string, policy: RateLimitPolicy) => {
    // The default budget keeps its key layout; a named route budget counts apart from it.
    const id = name === 'default' ? `${policy.limit}:${policy.windowSeconds}` : `${name}:${policy.limit}:${policy.windowSeconds}`;
    let limiter = limiters.get(id);
    if (!limiter) {
      const counter = new RateLimiterRedis({
        storeClient: redis,
        keyPrefix: `${config.redisPrefix}:rl:${id}`,
        points: policy.limit,
        duration: policy.windowSeconds,
      });
      limiter = new LeasedLimiter(counter, policy.limit, () => redis.status === 'ready');
      limiters.set(id, limiter);
    }
    return limiter;
  };

  // Tenant overrides change rarely; caching them briefly keeps a MongoDB read off every request.
  const policyFor = async (tenantId: string | null): Promise<RateLimitPolicy> => {
    if (!tenantId) return config.rateLimit;
    const cached = tenantPolicies.get(tenantId);
    if (cached && cached.until > Date.now()) return cached.policy;
    const tenant = await stores.tenants.get(tenantId);
    const policy = tenant?.rateLimit ?? config.rateLimit;
    tenantPolicies.set(tenantId, { policy, until: Date.now() + TENANT_POLICY_CACHE_MS });
    return policy;
  };

  /** Draws one point from `policy` for `subject`; the IETF header items it contributes, or a 429 when over budget. */
  const draw = async (name: string, policy: RateLimitPolicy, subject: string, leased: boolean, reply: FastifyReply, policies: string[], states: string[]) => {
    policies.push(`"${name}";q=${policy.limit};w=${policy.windowSeconds}`);
    const limiter = limiterFor(name, policy);
    // Redis unreachable: the draw throws and the error plugin answers 503.
    const result = leased ? await limiter.draw(subject) : await limiter.drawOne(subject);
    if (!result.allowed) {
      const retryAfter = Math.max(1, Math.ceil(result.msBeforeNext / 1000));
      states.push(`"${name}";r=0;t=${retryAfter}`);
      reply.header('ratelimit-policy', policies.join(', '));
      reply.header('ratelimit', states.join(', '));
      reply.header('retry-after', String(retryAfter));
      throw new ServiceError(429, 'RATE_LIMITED', `rate limit of ${policy.limit} requests per ${policy.windowSeconds}s exceeded`, {
        policy: name,
        limit: policy.limit,
        windowSeconds: policy.windowSeconds,
        retryAfterSeconds: retryAfter,
      });
    }
    states.push(`"${name}";r=${result.remaining};t=${Math.max(0, Math.ceil(result.msBeforeNext / 1000))}`);
  };

  const consume = async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const principal = request.principal;
    const tenantId = principal && principal.kind !== 'admin' ? principal.tenantId : null;
    const policies: string[] = [];
    const states: string[] = [];
    const leased = request.routeOptions.config.rateLimitLease === true && principal !== null;
    await draw('default', await policyFor(tenantId), principal ? principal.credentialId : `ip:${request.ip}`, leased, reply, policies, states);
    const extra = request.routeOptions.config.tenantRateLimit;
    if (extra && tenantId) await draw(extra.name, extra.policy, tenantId, leased, reply, policies, states);
    reply.header('ratelimit-policy', policies.join(', '));
    reply.header('ratelimit', states.join(', '));
  };

  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.config.rateLimit === false || reply.sent) return;
    try {
      await consume(request, reply);
    } catch (err) {
      return sendError(request, reply, err);
    }
  });
});
