import { Counter, Registry } from 'prom-client';

/** Metrics recorded outside HTTP (workers); the API's /metrics serves them beside its own. */
export const processMetrics = new Registry();

export const jobsFailedForGood = new Counter({
  name: 'jobs_failed_for_good_total',
  help: 'Jobs that failed their last retry, by queue (an alert: the work needs a look)',
  labelNames: ['queue'] as const,
  registers: [processMetrics],
});
