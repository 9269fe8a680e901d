// Jobs of the `webhook-dispatch` queue: the fan-out job (name `webhook-dispatch`, one per outbox event) and one
// `deliver` job per delivery attempt. Job ids are derived from what they act on, so enqueueing the same work twice
// adds one job.
import type { Queue } from 'bullmq';
import type { RedisClient } from '../redis.ts';
import { Value } from 'typebox/value';
import { jobIdFor, QueuePayloads, type Producers } from '../queues/index.ts';

export const DELIVER_JOB = 'deliver';

export function fanOutJobId(eventId: string): string {
  return jobIdFor('webhook-dispatch', eventId);
}

/** One job per revision of a delivery: a new attempt, a replay or a takeover after a crash always gets a new id. */
export function deliverJobId(deliveryId: string, rev: number): string {
  return jobIdFor('webhook-dispatch', deliveryId, String(rev));
}

function queueOf(producers: Producers): Queue {
  return producers.queues['webhook-dispatch'];
}

/** Enqueues the attempt of `deliveryId` at revision `rev`, after `delayMs`. */
export async function scheduleDelivery(producers: Producers, input: { tenantId: string; deliveryId: string; rev: number }, delayMs: number): Promise<void> {
  const payload = { kind: 'deliver' as const, tenantId: input.tenantId, deliveryId: input.deliveryId, rev: input.rev };
  if (!Value.Check(QueuePayloads['webhook-dispatch'], payload)) throw new Error('invalid deliver job payload');
  await queueOf(producers).add(DELIVER_JOB, payload, { jobId: deliverJobId(input.deliveryId, input.rev), delay: Math.max(0, Math.round(delayMs)) });
}

/**
 * Makes sure a job with this id is waiting, delayed or active. A job that already finished (completed, or failed
 * after its retries) would make BullMQ ignore a new add with the same id, so it is removed first. Safe to run from
 * several sweepers at once: the same id can only ever be one job.
 */
export async function ensureLiveJob(producers: Producers, name: string, data: Record<string, unknown>, jobId: string): Promise<boolean> {
  const queue = queueOf(producers);
  const existing = await queue.getJob(jobId);
  if (existing) {
    const state = await existing.getState();
    if (state !== 'completed' && state !== 'failed' && state !== 'unknown') return false;
    await existing.remove().catch(() => undefined);
  }
  if (!Value.Check(QueuePayloads['webhook-dispatch'], data)) throw new Error(`invalid ${name} job payload`);
  await queue.add(name, data, { jobId });
  return true;
}

/**
 * Job that takes over an attempt whose worker died: the delivery's regular job is stuck `active` (BullMQ would only
 * notice after its lock expires and a stalled-job check runs) while no lease shows anyone working on it.
 */
export function takeoverJobId(deliveryId: string, rev: number): string {
  return jobIdFor('webhook-dispatch', deliveryId, String(rev), 'takeover');
}

// ---- Attempt leases: one Redis key per delivery, held while an attempt runs, expiring by itself if its worker dies.

export function leaseKey(redisPrefix: string, deliveryId: string): string {
  return `${redisPrefix}:webhook-lease:${deliveryId}`;
}

export async function acquireLease(redis: RedisClient, key: string, token: string, ms: number): Promise<boolean> {
  return (await redis.set(key, token, 'PX', ms, 'NX')) === 'OK';
}

const RELEASE_IF_OWNER = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

export async function releaseLease(redis: RedisClient, key: string, token: string): Promise<void> {
  await redis.eval(RELEASE_IF_OWNER, 1, key, token);
}
