import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { pingMongo } from '../../store/mongo.ts';
import type { Runtime } from '../../runtime.ts';

const PING_TIMEOUT_MS = 500;

async function pingRedis(runtime: Runtime): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const answer = await Promise.race([
      runtime.redis.ping(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('timeout')), PING_TIMEOUT_MS);
      }),
    ]);
    return answer === 'PONG';
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

const Readiness = Type.Object({
  status: Type.Union([Type.Literal('ready'), Type.Literal('unavailable')]),
  checks: Type.Object({ redis: Type.Boolean(), mongo: Type.Boolean() }),
});

export async function healthRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { runtime } = opts;
  const probe = { access: 'public', rateLimit: false } as const;

  app.get(
    '/healthz',
    {
      config: probe,
      schema: {
        tags: ['health'],
        operationId: 'getLiveness',
        summary: 'Liveness: the process answers',
        response: { 200: Type.Object({ status: Type.Literal('ok') }) },
      },
    },
    async () => ({ status: 'ok' as const }),
  );

  app.get(
    '/readyz',
    {
      config: probe,
      schema: {
        tags: ['health'],
        operationId: 'getReadiness',
        summary: 'Readiness: Redis and MongoDB answer',
        response: { 200: Readiness, 503: Readiness },
      },
    },
    async (_request, reply) => {
      const [redis, mongo] = await Promise.all([pingRedis(runtime), pingMongo(runtime.db, PING_TIMEOUT_MS)]);
      const ready = redis && mongo;
      if (!ready) reply.header('retry-after', '1');
      return reply
        .status(ready ? 200 : 503)
        .send({ status: ready ? 'ready' : 'unavailable', checks: { redis, mongo } });
    },
  );

  app.get(
    '/metrics',
    {
      config: { access: runtime.config.metricsPublic ? 'public' : 'admin', rateLimit: false },
      schema: {
        tags: ['health'],
        operationId: 'getMetrics',
        summary: 'Prometheus metrics',
        // Per status, so the platform's error answers (JSON) are not documented as text too.
        response: {
          200: {
            description: 'Prometheus text exposition format',
            content: { 'text/plain': { schema: Type.String() } },
          },
        },
      },
    },
    async (_request, reply) => {
      reply.type(app.metricsRegistry.contentType);
      return app.metricsRegistry.metrics();
    },
  );

  // Left out of the document it serves (it would only describe itself); GET / and /docs point at it.
  app.get(
    '/openapi.json',
    {
      config: { access: 'public' },
      schema: { tags: ['health'], summary: 'This OpenAPI 3.1 document', hide: true },
    },
    async () => app.swagger(),
  );
}
