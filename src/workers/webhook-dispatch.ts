import { randomUUID } from 'node:crypto';
import type { Job } from 'bullmq';
import type { Static } from 'typebox';
import type { WebhookDeliverPayload } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import {
  attemptDelivery,
  fanOut,
  runRecovery,
  scheduleAttempt,
  sweepWebhookWork,
  type AttemptOutcome,
} from '../services/webhook-delivery.ts';
import { acquireLease, leaseKey, releaseLease } from '../webhooks/jobs.ts';
import { sweepWebhookRetention } from '../services/webhook-retention.ts';
import type { Resolver } from '../webhooks/send.ts';
import type { QueueProcessor } from './runner.ts';

// The `webhook-dispatch` queue: fan-out jobs, `deliver` jobs (one attempt each, under the delivery's lease),
// `recover` jobs (an endpoint's failed deliveries since a time, sent again) and the sweeper. What each step records, and how a crash at any point is recovered, is in services/webhook-delivery.ts.

type Deliver = Static<typeof WebhookDeliverPayload>;

export interface WebhookDispatchOptions {
  /** DNS resolver for the SSRF guard (tests inject one); the system resolver by default. */
  resolver?: Resolver;
  /** Upper bound of due entries one sweep checks. */
  sweepBatch?: number;
}

export function createWebhookDispatchProcessor(
  runtime: Runtime,
  options: WebhookDispatchOptions = {},
): QueueProcessor<'webhook-dispatch'> {
  const { config, redis } = runtime;
  // Long enough for DNS + the HTTP timeout + recording the result; after it a killed attempt is taken over.
  const leaseMs = 2 * config.webhooks.timeoutMs + 1_000;

  async function deliver({ tenantId, deliveryId, rev }: Deliver, job: Job) {
    const key = leaseKey(config.redisPrefix, deliveryId);
    const token = `${job.id}:${randomUUID()}`;
    if (!(await acquireLease(redis, key, token, leaseMs))) {
      // Another attempt of this delivery is running (or its worker died and the lease has not expired yet). Retry
      // this job shortly: by then the other attempt has recorded its result, or the lease has lapsed.
      throw new Error(`delivery ${deliveryId} is being attempted by another worker`);
    }
    let outcome: AttemptOutcome;
    try {
      const current = await runtime.stores.webhookDeliveries.getAt(deliveryId, rev);
      if (!current || current.tenantId !== tenantId || current.status !== 'pending')
        return { skipped: 'stale revision' };
      outcome = await attemptDelivery(runtime, current, { resolver: options.resolver });
    } finally {
      await releaseLease(redis, key, token).catch(() => undefined);
    }
    // Enqueued after the lease is released, so an immediate retry does not find it still held.
    if (outcome.next) await scheduleAttempt(runtime, outcome.next.delivery, outcome.next.delayMs);
    return { status: outcome.status };
  }

  return {
    process(payload, job: Job) {
      if ('deliveryId' in payload) return deliver(payload, job);
      return 'recoveryId' in payload ? runRecovery(runtime, payload) : fanOut(runtime, payload);
    },
    // Each partition's sweep job walks its partition of the due index; the retention sweep (not split) is
    // partition 0's.
    sweepsPerPartition: true,
    async sweep(partition) {
      const work = await sweepWebhookWork(runtime, { batch: options.sweepBatch ?? 500, partition });
      if (partition !== undefined && partition !== 0) return { ...work, retention: null };
      // Expiry after the due work, and on its own: a failing expiry must not hold up deliveries.
      const retention = await sweepWebhookRetention(runtime, { batch: options.sweepBatch ?? 500 }).catch(
        (err: Error) => {
          runtime.logger.warn({ err: err.message }, 'webhook retention sweep failed; the next sweep tries again');
          return null;
        },
      );
      return { ...work, retention };
    },
  };
}
