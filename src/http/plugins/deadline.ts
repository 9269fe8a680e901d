import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { errors } from '../../domain/errors.ts';
import type { Dependency } from '../../outages.ts';
import type { Runtime } from '../../runtime.ts';
import { sendError } from './errors.ts';

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | null)?.then === 'function';
}

/** After the deadline, how often a request still running looks again (a long artifact read may stall later). */
const RECHECK_MS = 100;

declare module 'fastify' {
  interface FastifyRequest {
    deadlineTimer: NodeJS.Timeout | null;
    /** The deadline answered 503 while the handler may still be running (see the idempotency plugin). */
    answeredByDeadline: boolean;
  }
}

/**
 * The request deadline (contract section 2: 503 fast, never hang). Fastify has none, and the drivers wait on a hung
 * server for seconds (MongoDB's socket has no timeout; its heartbeat notices after up to 10 s). A request still
 * unanswered at REQUEST_DEADLINE_MS answers 503 UNAVAILABLE when a backend is stalled: Redis not connected, no
 * MongoDB server known, or a MongoDB command waiting longer than half the deadline. A request that is merely long
 * (an artifact of many batches, each read answering promptly) keeps running.
 */
export default fp(async function deadlinePlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { config, redis, mongoWatch, outages } = opts.runtime;
  const stallMs = config.requestDeadlineMs / 2;
  const stalledBackend = (): Dependency | null => {
    if (redis.status !== 'ready') return 'redis';
    if (!mongoWatch.serverReachable || mongoWatch.oldestPendingMs() > stallMs) return 'mongodb';
    return null;
  };
  app.decorateRequest('deadlineTimer', null);
  app.decorateRequest('answeredByDeadline', false);

  // A handler the deadline answered for finishes once the backend thaws; its result has no one to go to. Fastify
  // would log a warning with a stack trace for each such request ("Reply was already sent"): during a stall, one per
  // request in flight. The result is dropped instead; the deadline's own line (or the outage count) already told.
  app.addHook('onRoute', (route) => {
    const handler = route.handler;
    route.handler = function lateAware(this: FastifyInstance, request, reply) {
      const result: unknown = handler.call(this, request, reply);
      if (!isThenable(result)) return result;
      return result.then((value) => (request.answeredByDeadline ? undefined : value));
    } as typeof handler;
  });

  app.addHook('onRequest', async (request, reply) => {
    const check = () => {
      request.deadlineTimer = null;
      if (reply.sent) return;
      const backend = stalledBackend();
      if (backend) {
        // One more failure of the outage while the backend is known to be down, else a line now and then (outages.ts).
        outages.answeredStalled(backend, config.requestDeadlineMs);
        request.answeredByDeadline = true;
        void sendError(request, reply, errors.unavailable('a backing service is unavailable; retry shortly'));
        return;
      }
      request.deadlineTimer = setTimeout(check, RECHECK_MS);
    };
    request.deadlineTimer = setTimeout(check, config.requestDeadlineMs);
  });
  const clear = async (request: { deadlineTimer: NodeJS.Timeout | null }) => {
    if (request.deadlineTimer) clearTimeout(request.deadlineTimer);
    request.deadlineTimer = null;
  };
  app.addHook('onResponse', clear);
  app.addHook('onRequestAbort', clear);
});
