import {
  DISABLE_AFTER_FAILING_MS,
  eventBody,
  MAX_ATTEMPTS,
  parseRetryAfter,
  retryDelayMs,
  signedHeaders,
} from '../domain/webhook-signing.ts';
import type { Runtime } from '../runtime.ts';
import type { WebhookDeliveryDoc } from '../store/webhook-deliveries.ts';
import { bucketEnd, bucketOf, type DueEntry } from '../store/webhook-due.ts';
import type { WebhookEndpoint } from '../store/webhook-endpoints.ts';
import { randomUUID } from 'node:crypto';
import { errors } from '../domain/errors.ts';
import { failpoint } from '../domain/failpoints.ts';
import {
  acquireLease,
  DELIVER_JOB,
  deliverJobId,
  fanOutJobId,
  leaseKey,
  releaseLease,
  RECOVER_JOB,
  recoverJobId,
  takeoverJobId,
} from '../webhooks/jobs.ts';
import { destinationRefusal, sendWebhook, type Resolver, type SendResult } from '../webhooks/send.ts';

// Delivering events to webhook endpoints; durability, step by step (a worker may be SIGKILLed at any point):
// 1. emitEvent records the event in the outbox (its fan-out entered in the due index first), then enqueues the
//    fan-out job. Killed in between: the sweeper finds the due entry of an event not fanned out and enqueues it.
// 2. The fan-out creates one delivery per subscribed endpoint (deterministic id, due entry first), enqueues a
//    `deliver` job for each (job id = delivery id + rev), then marks the event fanned out.
// 3. A `deliver` job takes the delivery's lease in Redis, re-reads the delivery and goes on only if it is still
//    `pending` at the rev the job was scheduled for, then POSTs. Killed mid-request: the delivery is still pending
//    at that rev; the lease expires; the sweeper sees the due delivery's job stuck `active` with no lease and enqueues
//    a takeover job (the receiver may see the event twice, with the same id: at-least-once).
// 4. The attempt is recorded by insert, then the next state as revision rev+1 (its due entry first), then the next
//    attempt's job is enqueued. Killed in between: the sweeper finds the pending delivery once it is due.

/** Enqueues the attempt of a delivery at its current revision, after `delayMs`. */
export function scheduleAttempt(runtime: Runtime, delivery: WebhookDeliveryDoc, delayMs: number): Promise<void> {
  const payload = {
    kind: 'deliver' as const,
    tenantId: delivery.tenantId,
    deliveryId: delivery._id,
    rev: delivery.rev,
  };
  return runtime.producers.schedule(
    'webhook-dispatch',
    payload,
    deliverJobId(delivery._id, delivery.rev),
    delayMs,
    DELIVER_JOB,
  );
}

/**
 * Refuses a send the dispatcher would not make: to a pull endpoint (409, it has no URL), to a disabled endpoint (409,
 * enable it first), or to a URL whose
 * address the SSRF guard refuses now (422, the same check as every attempt; a name that no longer resolves is left
 * to the attempt, which records the failure).
 */
export async function assertSendable(
  runtime: Runtime,
  endpoint: WebhookEndpoint,
  options: { resolver?: Resolver } = {},
): Promise<void> {
  if (endpoint.url === null) {
    throw errors.conflict(
      'WEBHOOK_ENDPOINT_PULL',
      'a pull endpoint is never sent to: read its events at GET /v1/webhooks/{id}/events',
      { delivery: 'pull' },
    );
  }
  if (endpoint.status === 'disabled') {
    throw errors.conflict(
      'WEBHOOK_ENDPOINT_DISABLED',
      `the endpoint is disabled (${endpoint.disabledReason ?? 'no reason given'}); enable it first`,
      { disabledReason: endpoint.disabledReason },
    );
  }
  const refusal = await destinationRefusal(endpoint.url, {
    allowPrivateAddresses: runtime.config.webhooks.allowPrivateAddresses,
    resolver: options.resolver,
  });
  if (refusal) throw errors.destinationRefused(`deliveries to this endpoint are refused: ${refusal}`);
}

/** Two retry-now requests of one delivery this close together are one request (a double click, a retried call). */
export const RETRY_COALESCE_MS = 5_000;
/** How long a retry-now holds the delivery's attempt lease: the time to commit one revision, with room to spare. */
const RETRY_LEASE_MS = 5_000;

export interface RetryOutcome {
  delivery: WebhookDeliveryDoc;
  /** false: an attempt was already due now or running, or a retry was asked for moments ago; that one stands. */
  retried: boolean;
}

/** An attempt is due now, or a retry-now was recorded moments ago: a retry-now asked for now is that same one. */
function retryStands(d: WebhookDeliveryDoc, now: number): boolean {
  if (d.status === 'pending' && d.nextAttemptAt !== null && d.nextAttemptAt.getTime() <= now) return true;
  return d.retriedAt != null && now - d.retriedAt.getTime() < RETRY_COALESCE_MS;
}

/**
 * Retry now: makes the delivery due now as a new revision with a fresh retry schedule (the schedule restarts from
 * this attempt), whatever its state (pending with a later attempt, succeeded, failed, abandoned, cancelled), and
 * enqueues its attempt: the same event id and body, a new attempt. Idempotent by delivery:
 * - the decision is the unique insert of the delivery's next revision (the delivery document is only a cache), so
 *   two requests deciding on the same revision make one;
 * - it is taken under the delivery's attempt lease (the one a `deliver` job holds while it attempts), so it never
 *   overtakes an attempt in flight (that attempt is the retry), and a scheduled attempt cannot start meanwhile (its
 *   job finds the lease taken, retries, and then finds its revision stale);
 * - a request while an attempt is due now or running, or within RETRY_COALESCE_MS of the last retry, changes
 *   nothing and answers the delivery as it stands.
 * The due entry is written before the revision, so a crash before the enqueue is found by the sweeper.
 */
export async function retryNow(runtime: Runtime, delivery: WebhookDeliveryDoc): Promise<RetryOutcome> {
  if (retryStands(delivery, Date.now())) return { delivery, retried: false };
  const deliveries = runtime.stores.webhookDeliveries;
  const key = leaseKey(runtime.config.redisPrefix, delivery._id);
  const token = `retry:${randomUUID()}`;
  if (!(await acquireLease(runtime.redis, key, token, RETRY_LEASE_MS))) return { delivery, retried: false };
  let due: WebhookDeliveryDoc | null;
  try {
    const current = (await deliveries.get(delivery._id)) ?? delivery;
    const now = new Date();
    if (retryStands(current, now.getTime())) return { delivery: current, retried: false };
    due = await deliveries.transition(current, {
      status: 'pending',
      nextAttemptAt: now,
      lastError: current.lastError,
      roundAttempts: 0,
      retriedAt: now,
    });
    // Another retry (or a recovery) committed this revision first (only possible when Redis lost the lease).
    if (!due) return { delivery: (await deliveries.get(delivery._id)) ?? current, retried: false };
  } finally {
    await releaseLease(runtime.redis, key, token).catch(() => undefined);
  }
  failpoint('webhook.retry.recorded');
  // If Redis refuses, the sweeper finds the delivery through its due entry.
  await scheduleAttempt(runtime, due, 0).catch((err: Error) =>
    runtime.logger.warn({ deliveryId: due._id, err: err.message }, 'retried delivery left to the sweeper'),
  );
  return { delivery: due, retried: true };
}

/** Enqueues a recovery's job (one per recovery, whoever asks). */
export function scheduleRecovery(runtime: Runtime, recovery: { tenantId: string; _id: string }): Promise<void> {
  return runtime.producers.schedule(
    'webhook-dispatch',
    { kind: 'recover', tenantId: recovery.tenantId, recoveryId: recovery._id },
    recoverJobId(recovery._id),
    0,
    RECOVER_JOB,
  );
}

/** Positions a recovery job looks at between progress notes. */
const RECOVERY_BATCH = 100;

/**
 * The recovery job: walks the endpoint's deliveries from the newest (when it was asked for) down to the first one
 * created before `since`, and sends each failed or abandoned one again (and, when the recovery includes them, each
 * pending one now: retryNow). It may run twice (or die halfway and run again): each delivery it sends is first
 * claimed by a unique insert `<recoveryId>#<position>` holding the revision it was found at, and sent only while it
 * is still at that revision, so each is sent again once per recovery.
 */
export async function runRecovery(
  runtime: Runtime,
  input: { tenantId: string; recoveryId: string },
): Promise<{ queued: number; scannedDownTo: number }> {
  const deliveries = runtime.stores.webhookDeliveries;
  const recovery = await deliveries.recoveryOf(input.recoveryId);
  if (!recovery || recovery.tenantId !== input.tenantId) return { queued: 0, scannedDownTo: 0 };
  let queued = 0;
  let position = recovery.fromPosition;
  for (; position >= 1; position -= RECOVERY_BATCH) {
    const positions = Array.from({ length: Math.min(RECOVERY_BATCH, position) }, (_, i) => position - i);
    const batch = await Promise.all(positions.map((n) => deliveries.atPosition(recovery.endpointId, n)));
    let reachedSince = false;
    for (const [i, d] of batch.entries()) {
      if (!d) continue; // a position whose delivery write never happened, or past retention
      if (d.createdAt.getTime() < recovery.since.getTime()) {
        reachedSince = true;
        break;
      }
      const wanted =
        d.status === 'failed' ||
        d.status === 'abandoned' ||
        (d.status === 'pending' && recovery.includePending === true);
      if (!wanted) continue;
      const claim = await deliveries.claimRecoveryItem(recovery._id, positions[i]!, d);
      if (claim.fromRev === d.rev && (await retryNow(runtime, d)).retried) queued++;
    }
    const low = positions.at(-1)!;
    if (reachedSince || low === 1) {
      await deliveries.noteRecoveryProgress(recovery._id, low, new Date());
      return { queued, scannedDownTo: low };
    }
    await deliveries.noteRecoveryProgress(recovery._id, low, null);
  }
  await deliveries.noteRecoveryProgress(recovery._id, 1, new Date());
  return { queued, scannedDownTo: 1 };
}

/** Creates the deliveries of an outbox event, one per endpoint subscribed when it happened, and enqueues them. */
export async function fanOut(runtime: Runtime, input: { tenantId: string; eventId: string }) {
  const { outbox, webhookEndpoints: endpoints, webhookDeliveries: deliveries } = runtime.stores;
  const event = await outbox.get(input.eventId);
  if (!event || event.tenantId !== input.tenantId) {
    runtime.logger.warn(input, 'webhook fan-out for an unknown event; nothing to do');
    return { deliveries: 0 };
  }
  if (event.fannedOutAt) return { deliveries: 0, alreadyFannedOut: true };
  const now = new Date();
  // The tenant's few endpoints, read by id; subscription, status and age are decided here, not by a query.
  const subscribers = (await endpoints.allOfTenant(event.tenantId)).filter(
    (e) =>
      e.status !== 'revoked' &&
      e.events.includes(event.type) &&
      e.createdAt.getTime() <= event.createdAt.getTime() &&
      (event.test !== true || e.includeTestEvents === true),
  );
  for (const endpoint of subscribers) {
    const delivery = await deliveries.ensure({ eventId: event._id, eventType: event.type, endpoint, now });
    if (delivery.status === 'pending')
      await scheduleAttempt(runtime, delivery, (delivery.nextAttemptAt?.getTime() ?? now.getTime()) - Date.now());
  }
  await outbox.markFannedOut(event._id, new Date());
  return { deliveries: subscribers.length };
}

export interface AttemptOutcome {
  status: 'succeeded' | 'retrying' | 'failed' | 'abandoned' | 'cancelled';
  /** The revision whose attempt is due next, and when. */
  next?: { delivery: WebhookDeliveryDoc; delayMs: number };
}

/** Makes one attempt of a pending delivery (the caller holds its lease) and records the outcome. */
export async function attemptDelivery(
  runtime: Runtime,
  current: WebhookDeliveryDoc,
  options: { resolver?: Resolver } = {},
): Promise<AttemptOutcome> {
  const { config } = runtime;
  const { outbox, webhookEndpoints: endpoints, webhookDeliveries: deliveries } = runtime.stores;
  const log = runtime.logger.child({ component: 'webhook-dispatch' });
  const { tenantId, _id: deliveryId } = current;
  const [endpoint, event] = await Promise.all([endpoints.get(current.endpointId), outbox.get(current.eventId)]);
  // Deleting an endpoint does not touch its deliveries: each one is cancelled here, when its attempt comes due.
  if (!endpoint || endpoint.tenantId !== tenantId || endpoint.status === 'revoked') {
    await deliveries.transition(current, { status: 'cancelled', nextAttemptAt: null, lastError: 'endpoint deleted' });
    return { status: 'cancelled' };
  }
  if (endpoint.status === 'disabled') {
    await deliveries.transition(current, {
      status: 'abandoned',
      nextAttemptAt: null,
      lastError: `endpoint disabled: ${endpoint.disabledReason ?? ''}`,
    });
    return { status: 'abandoned' };
  }
  if (!event) {
    await deliveries.transition(current, {
      status: 'cancelled',
      nextAttemptAt: null,
      lastError: 'event no longer exists',
    });
    return { status: 'cancelled' };
  }
  if (endpoint.url === null) {
    // Only a pending delivery is attempted, and a pull endpoint's are stored, never pending: nothing to send to.
    await deliveries.transition(current, { status: 'stored', nextAttemptAt: null, lastError: null });
    return { status: 'cancelled' };
  }
  const url = endpoint.url;

  // The body is rebuilt from the stored event on every attempt, byte for byte the same; only the timestamp (and
  // with it the signature) is new.
  const body = eventBody(event);
  const startedAt = new Date();
  let headers: Record<string, string> | null = null;
  try {
    headers = {
      ...signedHeaders(
        endpoints.signingSecrets(endpoint, startedAt),
        event._id,
        Math.floor(startedAt.getTime() / 1000),
        body,
      ),
    };
  } catch {
    // Unreadable sealed secret (WEBHOOK_SECRET_KEY changed?): an attempt that fails without sending anything.
    log.error({ tenantId, endpointId: endpoint._id }, 'cannot decrypt the webhook endpoint secret');
  }
  const result: SendResult = headers
    ? await sendWebhook(url, body, headers, {
        timeoutMs: config.webhooks.timeoutMs,
        allowPrivateAddresses: config.webhooks.allowPrivateAddresses,
        resolver: options.resolver,
      })
    : {
        ok: false,
        statusCode: null,
        durationMs: 0,
        retryAfter: null,
        error: 'the endpoint secret cannot be decrypted; rotate it',
        refused: false,
      };
  const attempt = {
    url,
    startedAt,
    durationMs: result.durationMs,
    statusCode: result.statusCode,
    error: result.ok ? null : result.error,
    succeeded: result.ok,
  };
  const logFields = {
    tenantId,
    endpointId: endpoint._id,
    deliveryId,
    eventId: event._id,
    attempt: current.attemptCount + 1,
    statusCode: result.statusCode,
    durationMs: result.durationMs,
  };

  if (result.ok) {
    await deliveries.transition(current, { status: 'succeeded', nextAttemptAt: null, lastError: null }, attempt);
    // Health bookkeeping only when it changes something that matters (a write per delivery is costly on FerretDB).
    const now = Date.now();
    if (endpoint.failingSince || !endpoint.lastSuccessAt || now - endpoint.lastSuccessAt.getTime() > 60_000)
      await endpoints.markSuccess(endpoint._id, new Date(now));
    log.info(logFields, 'webhook delivered');
    return { status: 'succeeded' };
  }

  if (result.statusCode === 410) {
    await deliveries.transition(
      current,
      { status: 'abandoned', nextAttemptAt: null, lastError: `${result.error}; endpoint disabled` },
      attempt,
    );
    await disableEndpoint(runtime, endpoint, 'the receiver answered 410 Gone');
    log.info(logFields, 'webhook receiver is gone');
    return { status: 'abandoned' };
  }

  // The outcome is recorded before the failure clock is started: a failed bookkeeping write must not make the job
  // retry (and repeat) an attempt whose result is already known.
  const failingSince = endpoint.failingSince ?? startedAt;
  const disableAfter = DISABLE_AFTER_FAILING_MS * config.webhooks.retryScale;
  if (disableAfter > 0 && Date.now() - failingSince.getTime() >= disableAfter) {
    await deliveries.transition(
      current,
      { status: 'abandoned', nextAttemptAt: null, lastError: `${result.error}; endpoint disabled` },
      attempt,
    );
    await disableEndpoint(runtime, endpoint, `every delivery failed since ${failingSince.toISOString()}`);
    log.info({ ...logFields, error: result.error }, 'webhook attempt failed');
    return { status: 'abandoned' };
  }

  const nextIndex = current.roundAttempts + 1;
  const retrying = nextIndex < MAX_ATTEMPTS;
  const delayMs = retrying
    ? retryDelayMs(nextIndex, config.webhooks.retryScale, parseRetryAfter(result.retryAfter))
    : 0;
  const next = await deliveries.transition(
    current,
    {
      status: retrying ? 'pending' : 'failed',
      nextAttemptAt: retrying ? new Date(Date.now() + delayMs) : null,
      lastError: result.error,
    },
    attempt,
  );
  log.info({ ...logFields, error: result.error, retryInMs: retrying ? delayMs : null }, 'webhook attempt failed');
  if (!endpoint.failingSince) await endpoints.markFailing(endpoint._id, startedAt);
  return {
    status: retrying ? 'retrying' : 'failed',
    ...(next && retrying ? { next: { delivery: next, delayMs } } : {}),
  };
}

/** Disables an active endpoint (a new revision); its pending deliveries are abandoned as their attempts come due. */
async function disableEndpoint(runtime: Runtime, endpoint: WebhookEndpoint, reason: string): Promise<void> {
  const endpoints = runtime.stores.webhookEndpoints;
  for (
    let current: WebhookEndpoint | null = endpoint;
    current && current.status === 'active';
    current = await endpoints.get(endpoint._id)
  ) {
    if (await endpoints.change(current, { status: 'disabled', disabledReason: reason, disabledAt: new Date() })) {
      runtime.logger.warn(
        { tenantId: endpoint.tenantId, endpointId: endpoint._id, reason },
        'webhook endpoint disabled',
      );
      return;
    }
  }
}

type DueCheck = 'done' | 'waiting' | 'enqueued';

/**
 * The sweeper: walks the due index (see store/webhook-due.ts) from its cursor to the current bucket, enqueues a job
 * for due work that has none, and clears past buckets whose work is all done. Reads only what is due, by `_id`.
 * Safe to run concurrently: job ids are derived, so overlapping sweeps enqueue one job. `partition`: the share of
 * the index a partition's sweep job walks (a slow one holds up no other); none: every partition, each with `batch`.
 */
export async function sweepWebhookWork(
  runtime: Runtime,
  options: { batch: number; now?: number; partition?: number },
): Promise<{ events: number; deliveries: number }> {
  const due = runtime.stores.webhookDue;
  const counts = { events: 0, deliveries: 0 };
  const partitions = options.partition === undefined ? due.readPartitionList() : [options.partition];
  for (const partition of partitions) await sweepWebhookPartition(runtime, options, partition, counts);
  if (counts.events + counts.deliveries > 0)
    runtime.logger.info(counts, 'webhook sweeper re-enqueued work without a live job');
  return counts;
}

async function sweepWebhookPartition(
  runtime: Runtime,
  options: { batch: number; now?: number },
  partition: number,
  counts: { events: number; deliveries: number },
): Promise<void> {
  const due = runtime.stores.webhookDue;
  const start = await due.cursor(partition);
  if (start === null) return;
  const now = options.now ?? Date.now();
  let budget = options.batch;
  let clearing = true;
  for (let bucket = start; bucket <= bucketOf(now) && budget > 0; bucket++) {
    const entries = await due.read(bucket, partition);
    let firstLive: number | null = null;
    const done: number[] = [];
    for (const entry of entries) {
      // Work that fell due only just now is its job's to do; the sweeper is for work whose job was lost.
      if (budget <= 0 || entry.dueAt.getTime() > now - runtime.config.sweeper.staleAfterMs) {
        firstLive ??= entry.n;
        if (budget <= 0) break;
        continue;
      }
      budget--;
      const check = await checkDueEntry(runtime, entry, bucket, now);
      if (check === 'done') {
        done.push(entry.n);
        continue;
      }
      firstLive ??= entry.n;
      if (check === 'enqueued') counts[entry.kind === 'fan-out' ? 'events' : 'deliveries']++;
    }
    // A past bucket is cleared once its work is done; the cursor only moves over a cleared prefix.
    clearing = clearing && firstLive === null && bucketEnd(bucket) <= now - runtime.config.sweeper.staleAfterMs;
    if (clearing) {
      await due.clear(bucket, partition);
      await due.moveCursor(bucket + 1, partition);
    } else if (entries.length > 0) {
      await due.remember(bucket, firstLive ?? entries.at(-1)!.n + 1, done, partition);
    }
  }
}

async function checkDueEntry(runtime: Runtime, entry: DueEntry, bucket: number, now: number): Promise<DueCheck> {
  if (entry.kind === 'fan-out') {
    const event = await runtime.stores.outbox.get(entry.eventId);
    if (!event || event.fannedOutAt) return 'done';
    const state = await runtime.producers.ensure(
      'webhook-dispatch',
      { tenantId: event.tenantId, eventId: event._id },
      fanOutJobId(event._id),
    );
    return state === 'live' ? 'waiting' : 'enqueued';
  }
  const d = await runtime.stores.webhookDeliveries.get(entry.deliveryId);
  if (!d || d.status !== 'pending' || !d.nextAttemptAt) return 'done';
  if (d.nextAttemptAt.getTime() >= bucketEnd(bucket)) return 'done'; // rescheduled: a later bucket holds it
  if (d.nextAttemptAt.getTime() > now) return 'waiting';
  if (await runtime.redis.exists(leaseKey(runtime.config.redisPrefix, d._id))) return 'waiting'; // an attempt is running
  const regular = deliverJobId(d._id, d.rev);
  const payload = { kind: 'deliver' as const, tenantId: d.tenantId, deliveryId: d._id, rev: d.rev };
  const regularState = await (await runtime.producers.getJob('webhook-dispatch', payload, regular))?.getState();
  // `active` without a lease: the worker running it died mid-attempt. BullMQ would re-run it only after its lock
  // expires; a takeover job (same rev, so at most one of them can record a result) does it now.
  const jobId = regularState === 'active' ? takeoverJobId(d._id, d.rev) : regular;
  const state = await runtime.producers.ensure('webhook-dispatch', payload, jobId, DELIVER_JOB);
  return state === 'live' ? 'waiting' : 'enqueued';
}
