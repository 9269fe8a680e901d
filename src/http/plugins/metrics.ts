import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { processMetrics } from '../../metrics.ts';
import type { Runtime } from '../../runtime.ts';

declare module 'fastify' {
  interface FastifyInstance {
    metricsRegistry: Registry;
  }
}

/** Prometheus metrics: requests by route and status, their latency, and the depth of every queue. */
export default fp(async function metricsPlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const requests = new Counter({
    name: 'http_requests_total',
    help: 'HTTP requests by route template, method and status',
    labelNames: ['method', 'route', 'status'] as const,
    registers: [registry],
  });
  const latency = new Histogram({
    name: 'http_request_duration_seconds',
    help: 'HTTP request latency by route template, method and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [registry],
  });
  new Gauge({
    name: 'queue_jobs',
    help: 'Jobs per queue and state',
    labelNames: ['queue', 'state'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      try {
        const depths = await opts.runtime.producers.depths();
        for (const [queue, counts] of Object.entries(depths)) {
          for (const [state, count] of Object.entries(counts)) this.set({ queue, state }, count);
        }
      } catch {
        // Redis unreachable: report no queue series rather than failing the whole scrape.
      }
    },
  });
  // The process's own metrics (workers run in this process in `all` mode) are served beside the HTTP ones.
  app.decorate('metricsRegistry', Registry.merge([registry, processMetrics]));

  app.addHook('onResponse', async (request, reply) => {
    // Route templates, not raw URLs, keep label cardinality bounded; unmatched URLs share one label.
    const labels = {
      method: request.method,
      route: request.routeOptions.url ?? 'unmatched',
      status: String(reply.statusCode),
    };
    requests.inc(labels);
    latency.observe(labels, reply.elapsedTime / 1000);
  });
});
