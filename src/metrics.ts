import { Counter, Registry } from 'prom-client';

/** Metrics recorded outside HTTP (workers); the API's /metrics serves them beside its own. */
export const processMetrics = new Registry();

export const jobsFailedForGood = new Counter({
  name: 'jobs_failed_for_good_total',
  help: 'Jobs that failed their last retry, by queue (an alert: the work needs a look)',
  labelNames: ['queue'] as const,
  registers: [processMetrics],
});

export const jobsRoutedToUnconsumedPartition = new Counter({
  name: 'queue_jobs_routed_to_unconsumed_partition_total',
  help: 'Jobs enqueued to a hot queue partition that no worker consumed at the time (they wait there; an alert)',
  labelNames: ['queue', 'partition'] as const,
  registers: [processMetrics],
});
