import type { RedisClient } from '../redis.ts';

// When webhook records expire, without scanning a collection (FerretDB 1.24 has no TTL indexes, and any filter but
// an exact `_id` match scans the whole collection). One Redis sorted set holds every record that expires on its own,
// scored by the time its retention counts from:
// - `d|<deliveryId>`: a delivery, re-scored at each of its changes (so retention counts from its last attempt); its
//   attempts, revisions and position in its endpoint's index go with it;
// - `i|<webhook_index _id>`: an endpoint's index or parked entry, kept while its delivery is kept.
// Each member is written BEFORE the record it stands for, so a crash in between leaves a member whose record is
// missing (the sweep forgets it), never a record nobody will remove. A score is a hint: the sweep re-reads the
// record and only removes what is really past retention. The webhook sweeper pops due members in batches
// (services/webhook-retention.ts); a member that failed backs off alone (failures counted in a hash).
//
// Beside it, per endpoint, the highest index position removed so far (`expired-through`): the pull feed starts
// past it, so a cursor older than the retention does not walk through positions that no longer exist.

export type RetentionMember =
  { kind: 'delivery'; id: string; member: string } | { kind: 'entry'; id: string; member: string };

export interface DueMember {
  member: RetentionMember;
  score: number;
}

const RAISE_FIELD =
  "local c = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or '0') if c < tonumber(ARGV[2]) then redis.call('hset', KEYS[1], ARGV[1], ARGV[2]) end return 0";
/** A failing member waits at most this long before it is tried again. */
const MAX_BACKOFF_MS = 3_600_000;

function parse(member: string): RetentionMember | null {
  const bar = member.indexOf('|');
  const tag = member.slice(0, bar);
  const id = member.slice(bar + 1);
  if (bar < 0 || !id) return null;
  if (tag === 'd') return { kind: 'delivery', id, member };
  if (tag === 'i') return { kind: 'entry', id, member };
  return null;
}

export class WebhookRetentionIndex {
  private readonly key: string;
  private readonly failuresKey: string;
  private readonly expiredKey: string;

  constructor(
    private readonly redis: RedisClient,
    prefix: string,
  ) {
    // One hash slot for the three keys (Redis Cluster): `{webhook-retention}`.
    this.key = `${prefix}:{webhook-retention}:due`;
    this.failuresKey = `${prefix}:{webhook-retention}:failures`;
    this.expiredKey = `${prefix}:{webhook-retention}:expired-through`;
  }

  static deliveryMember(deliveryId: string): string {
    return `d|${deliveryId}`;
  }

  static entryMember(slotId: string): string {
    return `i|${slotId}`;
  }

  /** The delivery's retention counts from `lastChange` (written before the change is committed). */
  async noteDelivery(deliveryId: string, lastChange: Date): Promise<void> {
    await this.redis.zadd(this.key, lastChange.getTime(), WebhookRetentionIndex.deliveryMember(deliveryId));
  }

  async noteEntry(slotId: string, at: Date): Promise<void> {
    await this.redis.zadd(this.key, at.getTime(), WebhookRetentionIndex.entryMember(slotId));
  }

  /** Up to `count` members whose retention counts from `cutoff` or earlier, oldest first. */
  async due(cutoff: number, count: number): Promise<DueMember[]> {
    const flat = await this.redis.zrangebyscore(this.key, '-inf', cutoff, 'WITHSCORES', 'LIMIT', 0, count);
    const due: DueMember[] = [];
    for (let i = 0; i < flat.length; i += 2) {
      const member = parse(flat[i]!);
      if (member) due.push({ member, score: Number(flat[i + 1]) });
      else await this.redis.zrem(this.key, flat[i]!); // not written by this code: nothing to remove
    }
    return due;
  }

  /** The record is kept: its retention now counts from `from`. */
  async keep(member: RetentionMember, from: number): Promise<void> {
    await this.redis.pipeline().zadd(this.key, from, member.member).hdel(this.failuresKey, member.member).exec();
  }

  /** The record is gone (removed, or never written): nothing left to expire. */
  async forget(member: RetentionMember): Promise<void> {
    await this.redis.pipeline().zrem(this.key, member.member).hdel(this.failuresKey, member.member).exec();
  }

  /**
   * Removing the record failed: it is tried again after a backoff that doubles with each failure (its score moves
   * just that far past the sweep's cutoff). Returns how many times it has failed.
   */
  async backOff(member: RetentionMember, cutoff: number): Promise<number> {
    const failures = await this.redis.hincrby(this.failuresKey, member.member, 1);
    const backoffMs = Math.min(MAX_BACKOFF_MS, 1_000 * 2 ** Math.min(failures, 20));
    await this.redis.zadd(this.key, cutoff + backoffMs, member.member);
    return failures;
  }

  /** Records that the endpoint's index positions up to `position` have expired (only ever raised). */
  async raiseExpiredThrough(endpointId: string, position: number): Promise<void> {
    await this.redis.eval(RAISE_FIELD, 1, this.expiredKey, endpointId, String(position));
  }

  async expiredThrough(endpointId: string): Promise<number> {
    return Number((await this.redis.hget(this.expiredKey, endpointId)) ?? 0);
  }

  /** Members waiting to expire (tests and metrics). */
  size(): Promise<number> {
    return this.redis.zcard(this.key);
  }
}
