// Jobs of the `webhook-dispatch` queue: the fan-out job (name `webhook-dispatch`, one per outbox event) and one
// `deliver` job per delivery revision. Job ids are derived from what they act on, so enqueueing the same work twice
// adds one job. They are enqueued through runtime.producers (schedule / ensure).
import type { RedisClient } from '../redis.ts';
import { jobIdFor } from '../queues/index.ts';

export const DELIVER_JOB = 'deliver';

export const RECOVER_JOB = 'recover';

/** One job per recovery: asking twice, or a sweep re-enqueueing it, adds none. */
export function recoverJobId(recoveryId: string): string {
  return jobIdFor('webhook-dispatch', recoveryId, 'recover');
}

export function fanOutJobId(eventId: string): string {
  return jobIdFor('webhook-dispatch', eventId);
}

/** One job per revision of a delivery: a new attempt, a replay or a takeover after a crash always gets a new id. */
export function deliverJobId(deliveryId: string, rev: number): string {
  return jobIdFor('webhook-dispatch', deliveryId, String(rev));
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

const RELEASE_IF_OWNER =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

export async function releaseLease(redis: RedisClient, key: string, token: string): Promise<void> {
  await redis.eval(RELEASE_IF_OWNER, 1, key, token);
}
