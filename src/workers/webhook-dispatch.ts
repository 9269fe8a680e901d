import { randomUUID } from 'node:crypto';
import type { Job } from 'bullmq';
import type { Static } from 'typebox';
import {
  DISABLE_AFTER_FAILING_MS,
  MAX_ATTEMPTS,
  parseRetryAfter,
  retryDelayMs,
  signedHeaders,
} from '../domain/webhook-signing.ts';
import type { WebhookDeliverPayload, WebhookFanOutPayload } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import { WebhookDeliveryStore, WebhookEndpointStore, type WebhookDeliveryDoc, type WebhookEndpointDoc } from '../store/webhooks.ts';
import {
  acquireLease,
  DELIVER_JOB,
  deliverJobId,
  ensureLiveJob,
  fanOutJobId,
  leaseKey,
  releaseLease,
  scheduleDelivery,
  takeoverJobId,
} from '../webhooks/jobs.ts';
import { sendWebhook, type Resolver, type SendResult } from '../webhooks/send.ts';
import type { QueueProcessor } from './runner.ts';

// Delivery durability, step by step (a worker may be SIGKILLed at any point):
// 1. emitEvent (services/events.ts) records the event in the outbox (fannedOutAt null), then enqueues the fan-out job. Killed in
//    between: the sweeper re-enqueues outbox events left unfanned for SWEEP_STALE_AFTER_MS.
// 2. The fan-out job inserts one delivery per subscribed endpoint (deterministic id: a repeat creates none twice),
//    enqueues a `deliver` job for each (job id = delivery id + rev), then sets fannedOutAt. Killed in between: BullMQ
//    re-runs the stalled job, and the sweeper enqueues any due delivery that has no live job.
// 3. A `deliver` job takes the delivery's lease in Redis (SET NX PX, about twice the HTTP timeout), re-reads the
//    delivery and goes on only if it is still `pending` at the rev the job was scheduled for, then POSTs. Killed
//    mid-request: the delivery is still `pending` at that rev; the lease expires by itself; the sweeper sees a due
//    delivery whose job is stuck `active` with no lease and enqueues a takeover job, and another worker repeats the
//    attempt (the receiver may see the event twice, with the same id: at-least-once).
// 4. The attempt and the next state are recorded in one conditional write (rev -> rev+1), then the next attempt's
//    job is enqueued with its delay. Killed in between: the delivery is `pending` with nextAttemptAt and no job; the
//    sweeper enqueues it once it is due. A job for an old rev (a duplicate, or BullMQ re-running a stalled one) finds
//    the rev moved on and does nothing.

type FanOut = Static<typeof WebhookFanOutPayload>;
type Deliver = Static<typeof WebhookDeliverPayload>;

export interface WebhookDispatchOptions {
  /** DNS resolver for the SSRF guard (tests inject one); the system resolver by default. */
  resolver?: Resolver;
  /** Upper bound of outbox events and deliveries one sweep re-enqueues. */
  sweepBatch?: number;
}

export function createWebhookDispatchProcessor(runtime: Runtime, options: WebhookDispatchOptions = {}): QueueProcessor<'webhook-dispatch'> {
  const { config, db, producers } = runtime;
  const log = runtime.logger.child({ component: 'webhook-dispatch' });
  const outbox = runtime.stores.outbox;
  const { webhookEndpoints: endpoints, webhookDeliveries: deliveries } = runtime.stores;
  const scale = config.webhooks.retryScale;
  // Long enough for DNS + the HTTP timeout + recording the result; after it a killed attempt is taken over.
  const leaseMs = 2 * config.webhooks.timeoutMs + 1_000;
  const redis = runtime.redis;
  const sweepBatch = options.sweepBatch ?? 500;

  async function fanOut({ tenantId, eventId }: FanOut) {
    const event = await outbox.get(eventId);
    if (!event || event.tenantId !== tenantId) {
      log.warn({ eventId, tenantId }, 'webhook fan-out for an unknown event; nothing to do');
      return { deliveries: 0 };
    }
    if (event.fannedOutAt) return { deliveries: 0, alreadyFannedOut: true };
    const now = new Date();
    const subscribers = await endpoints.subscribers(tenantId, event.type, event.createdAt);
    for (const endpoint of subscribers) {
      const delivery = await deliveries.ensure({ tenantId, eventId, eventType: event.type, endpoint, now });
      if (delivery.status === 'pending') {
        const delay = (delivery.nextAttemptAt?.getTime() ?? now.getTime()) - Date.now();
        await scheduleDelivery(producers, { tenantId, deliveryId: delivery._id, rev: delivery.rev }, delay);
      }
    }
    // By _id alone (a repeat only moves the timestamp, and returns early above anyway): FerretDB answers that faster.
    await outbox.events.updateOne({ _id: eventId }, { $set: { fannedOutAt: new Date() } });
    return { deliveries: subscribers.length };
  }

  async function disableEndpoint(endpoint: WebhookEndpointDoc, reason: string) {
    if (await endpoints.disable(endpoint._id, reason)) {
      const abandoned = await deliveries.abandonPending(endpoint._id, `endpoint disabled: ${reason}`);
      log.warn({ tenantId: endpoint.tenantId, endpointId: endpoint._id, reason, abandoned }, 'webhook endpoint disabled');
    }
  }

  async function deliver({ tenantId, deliveryId, rev }: Deliver, job: Job) {
    const key = leaseKey(config.redisPrefix, deliveryId);
    const token = `${job.id}:${randomUUID()}`;
    if (!(await acquireLease(redis, key, token, leaseMs))) {
      // Another attempt of this delivery is running (or its worker died and the lease has not expired yet). Retry
      // this job shortly: by then the other attempt has recorded its result, or the lease has lapsed.
      throw new Error(`delivery ${deliveryId} is being attempted by another worker`);
    }
    let outcome: Awaited<ReturnType<typeof attempt>>;
    try {
      const current = await deliveries.get(deliveryId);
      if (!current || current.tenantId !== tenantId || current.rev !== rev || current.status !== 'pending') {
        return { skipped: 'stale revision' };
      }
      outcome = await attempt(current);
    } finally {
      await releaseLease(redis, key, token).catch(() => undefined);
    }
    // Enqueued after the lease is released, so an immediate retry does not find it still held.
    if (outcome.next) await scheduleDelivery(producers, { tenantId, deliveryId, rev: outcome.next.rev }, outcome.next.delay);
    return { status: outcome.status };
  }

  async function attempt(current: WebhookDeliveryDoc): Promise<{ status: string; next?: { rev: number; delay: number } }> {
    const { tenantId, _id: deliveryId } = current;
    const endpoint = await endpoints.getAny(tenantId, current.endpointId);
    if (!endpoint || endpoint.status === 'revoked') {
      await deliveries.settle(current, { status: 'cancelled', nextAttemptAt: null, lastError: 'endpoint deleted' });
      return { status: 'cancelled' };
    }
    if (endpoint.status === 'disabled') {
      await deliveries.settle(current, { status: 'abandoned', nextAttemptAt: null, lastError: `endpoint disabled: ${endpoint.disabledReason ?? ''}` });
      return { status: 'abandoned' };
    }
    const event = await outbox.get(current.eventId);
    if (!event) {
      await deliveries.settle(current, { status: 'cancelled', nextAttemptAt: null, lastError: 'event no longer exists' });
      return { status: 'cancelled' };
    }

    // The body is rebuilt from the stored event on every attempt, byte for byte the same; only the timestamp (and
    // with it the signature) is new.
    const body = JSON.stringify({ id: event._id, type: event.type, createdAt: event.createdAt.toISOString(), data: event.data });
    const startedAt = new Date();
    let headers: Record<string, string> | null = null;
    try {
      headers = { ...signedHeaders(endpoints.signingSecrets(endpoint, startedAt), event._id, Math.floor(startedAt.getTime() / 1000), body) };
    } catch {
      // Unreadable sealed secret (WEBHOOK_SECRET_KEY changed?): an attempt that fails without sending anything.
      log.error({ tenantId, endpointId: endpoint._id }, 'cannot decrypt the webhook endpoint secret');
    }
    const result: SendResult = headers
      ? await sendWebhook(endpoint.url, body, headers, {
          timeoutMs: config.webhooks.timeoutMs,
          allowPrivateAddresses: config.webhooks.allowPrivateAddresses,
          resolver: options.resolver,
        })
      : { ok: false, statusCode: null, durationMs: 0, retryAfter: null, error: 'the endpoint secret cannot be decrypted; rotate it', refused: false };
    const record = { statusCode: result.statusCode };
    const n = await deliveries.recordAttempt(current, {
      startedAt,
      durationMs: result.durationMs,
      statusCode: result.statusCode,
      error: result.ok ? null : result.error,
      succeeded: result.ok,
    });
    const logFields = { tenantId, endpointId: endpoint._id, deliveryId, eventId: event._id, attempt: n, statusCode: result.statusCode, durationMs: result.durationMs };

    if (result.ok) {
      await deliveries.settle(current, { status: 'succeeded', nextAttemptAt: null, lastError: null, attempt: record });
      // Health bookkeeping only when it changes something that matters (a write per delivery is costly on FerretDB).
      const now = Date.now();
      if (endpoint.failingSince || !endpoint.lastSuccessAt || now - endpoint.lastSuccessAt.getTime() > 60_000) {
        await endpoints.markSuccess(endpoint._id, new Date(now));
      }
      log.info(logFields, 'webhook delivered');
      return { status: 'succeeded' };
    }

    if (result.statusCode === 410) {
      const reason = 'the receiver answered 410 Gone';
      await deliveries.settle(current, { status: 'abandoned', nextAttemptAt: null, lastError: `${result.error}; endpoint disabled`, attempt: record });
      await disableEndpoint(endpoint, reason);
      log.info(logFields, 'webhook receiver is gone');
      return { status: 'abandoned' };
    }

    const nextIndex = current.roundAttempts + 1;
    const retrying = nextIndex < MAX_ATTEMPTS;
    const delay = retrying ? retryDelayMs(nextIndex, scale, parseRetryAfter(result.retryAfter)) : 0;
    const newRev = await deliveries.settle(current, {
      status: retrying ? 'pending' : 'failed',
      nextAttemptAt: retrying ? new Date(Date.now() + delay) : null,
      lastError: result.error,
      attempt: record,
    });
    log.info({ ...logFields, error: result.error, retryInMs: retrying ? delay : null }, 'webhook attempt failed');

    const failingSince = endpoint.failingSince ?? (await endpoints.markFailure(endpoint._id, startedAt));
    const disableAfter = DISABLE_AFTER_FAILING_MS * scale;
    if (disableAfter > 0 && Date.now() - failingSince.getTime() >= disableAfter) {
      await disableEndpoint(endpoint, `every delivery failed since ${failingSince.toISOString()}`);
    }
    return { status: retrying ? 'retrying' : 'failed', ...(newRev !== null && retrying ? { next: { rev: newRev, delay } } : {}) };
  }

  return {
    async process(payload, job: Job) {
      if ('deliveryId' in payload) return deliver(payload, job);
      return fanOut(payload);
    },

    async sweep() {
      const now = Date.now();
      let events = 0;
      let due = 0;
      const stale = await outbox.events
        .find({ fannedOutAt: null, createdAt: { $lte: new Date(now - config.sweeper.staleAfterMs) } })
        .sort({ createdAt: 1 })
        .limit(sweepBatch)
        .toArray();
      for (const event of stale) {
        if (await ensureLiveJob(producers, 'webhook-dispatch', { tenantId: event.tenantId, eventId: event._id }, fanOutJobId(event._id))) events++;
      }
      const pending: WebhookDeliveryDoc[] = await deliveries.due(new Date(now), sweepBatch);
      const queue = producers.queues['webhook-dispatch'];
      for (const d of pending) {
        if (await redis.exists(leaseKey(config.redisPrefix, d._id))) continue; // an attempt is running
        const data = { kind: 'deliver', tenantId: d.tenantId, deliveryId: d._id, rev: d.rev };
        const regular = deliverJobId(d._id, d.rev);
        const state = await (await queue.getJob(regular))?.getState();
        // `active` without a lease: the worker running it died mid-attempt. BullMQ would re-run it only after its lock
        // expires; a takeover job (same rev, so at most one of them can record a result) does it now.
        const jobId = state === 'active' ? takeoverJobId(d._id, d.rev) : regular;
        if (await ensureLiveJob(producers, DELIVER_JOB, data, jobId)) due++;
      }
      if (events + due > 0) log.info({ events, deliveries: due }, 'webhook sweeper re-enqueued work without a live job');
      return { events, deliveries: due };
    },
  };
}
