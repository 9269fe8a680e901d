import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RateLimitPolicy } from '../../config.ts';
import { serviceError } from '../../domain/errors.ts';
import type { Runtime } from '../../runtime.ts';
import { sendError } from './errors.ts';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** false exempts a route (health probes must answer even when a caller is over budget). */
    rateLimit?: boolean;
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
 * rate-limiter-flexible so every API process draws on one budget. Headers follow the IETF RateLimit draft.
 */
export default fp(async function rateLimitPlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { config, redis, stores } = opts.runtime;
  const limiters = new Map<string, RateLimiterRedis>();
  const tenantPolicies = new Map<string, { policy: RateLimitPolicy; until: number }>();

  const limiterFor = (name: string, policy: RateLimitPolicy) => {
    // The default budget keeps its key layout; a named route budget counts apart from it.
    const id =
      name === 'default'
        ? `${policy.limit}:${policy.windowSeconds}`
        : `${name}:${policy.limit}:${policy.windowSeconds}`;
    let limiter = limiters.get(id);
    if (!limiter) {
      limiter = new RateLimiterRedis({
        storeClient: redis,
        keyPrefix: `${config.redisPrefix}:rl:${id}`,
        points: policy.limit,
        duration: policy.windowSeconds,
      });
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
  const draw = async (
    name: string,
    policy: RateLimitPolicy,
    subject: string,
    reply: FastifyReply,
    policies: string[],
    states: string[],
  ) => {
    policies.push(`"${name}";q=${policy.limit};w=${policy.windowSeconds}`);
    let result: RateLimiterRes;
    try {
      result = await limiterFor(name, policy).consume(subject, 1);
    } catch (rejection) {
      if (!(rejection instanceof RateLimiterRes)) throw rejection; // Redis unreachable: the error plugin answers 503.
      const retryAfter = Math.max(1, Math.ceil(rejection.msBeforeNext / 1000));
      states.push(`"${name}";r=0;t=${retryAfter}`);
      reply.header('ratelimit-policy', policies.join(', '));
      reply.header('ratelimit', states.join(', '));
      reply.header('retry-after', String(retryAfter));
      throw serviceError(
        'RATE_LIMITED',
        `rate limit of ${policy.limit} requests per ${policy.windowSeconds}s exceeded`,
        {
          policy: name,
          limit: policy.limit,
          windowSeconds: policy.windowSeconds,
          retryAfterSeconds: retryAfter,
        },
      );
    }
    states.push(`"${name}";r=${result.remainingPoints};t=${Math.max(0, Math.ceil(result.msBeforeNext / 1000))}`);
  };

  const consume = async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const principal = request.principal;
    const tenantId = principal && principal.kind !== 'admin' ? principal.tenantId : null;
    const policies: string[] = [];
    const states: string[] = [];
    await draw(
      'default',
      await policyFor(tenantId),
      principal ? principal.credentialId : `ip:${request.ip}`,
      reply,
      policies,
      states,
    );
    const extra = request.routeOptions.config.tenantRateLimit;
    if (extra && tenantId) await draw(extra.name, extra.policy, tenantId, reply, policies, states);
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
