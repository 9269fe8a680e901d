import { partitionOf } from '../queues/index.ts';
import type { RedisClient } from '../redis.ts';
import { groupBy, ONE_PARTITION, type DuePartitions } from './due-work.ts';

/** An entry whose apply() is under way (or died): `member` is what to remove once it is finished. */
export interface StartedEntry {
  member: string;
  entryId: string;
  startedAt: number;
}

const AUDIT_KEY_VALUE = '1';

/** A `pending` member `<entryId>@<ms>` read back (entry ids may contain '@': the last one splits). */
function startedEntry(member: string): StartedEntry {
  const at = member.lastIndexOf('@');
  return { member, entryId: member.slice(0, at), startedAt: Number(member.slice(at + 1)) };
}

/**
 * The ledger's due work, indexed in Redis sorted sets scored by time, so the settle sweeper finds it in time
 * proportional to what is due (on FerretDB any MongoDB filter but an exact `_id` reads the whole collection).
 *
 * - `pending`: one member `<entryId>@<ms>` per apply() that records an attempt, added BEFORE the attempt is
 *   inserted and removed after it is applied or refused, so a crash anywhere in between leaves it findable.
 * - `locks`: escrow locks to check against their run, added once the lock's legs are posted and BEFORE the entry
 *   is marked applied (while its `pending` member still stands), moved to its reserve's deadline once its run holds
 *   it, removed once its reserve's fate is decided (markReconciled, lockSettled).
 *
 * Both are split over the hot queues' K partitions by the entry id's hash (every ledger posting writes here: the
 * hottest of the indexes), a hash tag per partition (`{ledger}` for partition 0, as before, `{ledger-p3}`…), so a
 * cluster spreads them over its masters. The readers (the settle sweep of partition 0, the ledger audit) read every
 * partition; a member found outside the partition its id names (written under another K) is moved there as it is
 * read, and a partition above K (K lowered) is moved whole, so the callers only ever act on a member's own partition.
 *
 * Redis keeps these with AOF like the queues themselves; `claimAudit` lets one process now and then rebuild them
 * from MongoDB in case Redis lost writes.
 */
export class LedgerDueIndex {
  private readonly pendingKeys: string[];
  private readonly lockKeys: string[];
  private readonly auditKey: string;
  private readonly partitions: DuePartitions;

  constructor(
    private readonly redis: RedisClient,
    prefix: string,
    partitions: DuePartitions = ONE_PARTITION,
  ) {
    this.partitions = partitions;
    // One hash tag per partition for both of its sets; partition 0 keeps the keys of old, so K=1 changes none.
    const tag = (p: number) => `${prefix}:{ledger${p === 0 ? '' : `-p${p}`}}`;
    this.pendingKeys = Array.from({ length: partitions.readPartitions }, (_, p) => `${tag(p)}:pending`);
    this.lockKeys = Array.from({ length: partitions.readPartitions }, (_, p) => `${tag(p)}:locks`);
    this.auditKey = `${prefix}:{ledger}:audit`;
  }

  /** The partition of an entry under the current K. */
  private home(entryId: string): number {
    return partitionOf(entryId, this.partitions.partitions);
  }

  private pendingKey(entryId: string): string {
    return this.pendingKeys[this.home(entryId)]!;
  }

  private lockKey(entryId: string): string {
    return this.lockKeys[this.home(entryId)]!;
  }

  async entryStarted(entryId: string, now = Date.now()): Promise<string> {
    const member = `${entryId}@${now}`;
    await this.redis.zadd(this.pendingKey(entryId), now, member);
    return member;
  }

  async entryDone(member: string): Promise<void> {
    await this.redis.zrem(this.pendingKey(startedEntry(member).entryId), member);
  }

  /** Looks at a started entry again at `at` instead of at once. */
  async postpone(member: string, at: number): Promise<void> {
    await this.redis.zadd(this.pendingKey(startedEntry(member).entryId), 'XX', at, member);
  }

  async startedBefore(before: Date, limit: number): Promise<StartedEntry[]> {
    const members = await this.readAll(this.pendingKeys, before, limit, (m) => startedEntry(m).entryId);
    return members.map(startedEntry);
  }

  /**
   * Every started entry, oldest score first, at most `limit` (the ledger audit's look at what is in flight; a
   * postponed member keeps its start time in its name, so the caller reads that, not the score).
   */
  async startedEntries(limit: number): Promise<StartedEntry[]> {
    const perPartition = await Promise.all(
      this.pendingKeys.map((key) => this.redis.zrange(key, 0, limit - 1, 'WITHSCORES')),
    );
    return oldestFirst(perPartition, limit).map(startedEntry);
  }

  async lockApplied(entryId: string, appliedAt: Date): Promise<void> {
    await this.redis.zadd(this.lockKey(entryId), 'NX', appliedAt.getTime(), entryId);
  }

  /** Looks at the lock again at `at` (its reserve's deadline), whatever time it was indexed under before. */
  async lockCheckAt(entryId: string, at: Date): Promise<void> {
    await this.redis.zadd(this.lockKey(entryId), at.getTime(), entryId);
  }

  async lockReconciled(entryId: string): Promise<void> {
    await this.redis.zrem(this.lockKey(entryId), entryId);
  }

  locksAppliedBefore(before: Date, limit: number): Promise<string[]> {
    return this.readAll(this.lockKeys, before, limit, (entryId) => entryId);
  }

  /**
   * Members scored before `before` over every partition, oldest first, at most `limit`; each found outside its own
   * partition is moved there first (home, then out of where it was: a crash between leaves it in both, harmless),
   * and a partition above K is moved whole, a batch per read, so it empties while its members wait for later.
   */
  private async readAll(
    keys: string[],
    before: Date,
    limit: number,
    entryIdOf: (member: string) => string,
  ): Promise<string[]> {
    const perPartition = await Promise.all(
      keys.map((key, p) =>
        p >= this.partitions.partitions
          ? this.redis.zrange(key, 0, DRAIN_BATCH - 1, 'WITHSCORES')
          : this.redis.zrangebyscore(key, '-inf', before.getTime(), 'WITHSCORES', 'LIMIT', 0, limit),
      ),
    );
    for (const [p, flat] of perPartition.entries()) {
      const strays = pairs(flat).filter(({ member }) => this.home(entryIdOf(member)) !== p);
      if (strays.length === 0) continue;
      const byHome = groupBy(strays, (s) => this.home(entryIdOf(s.member)));
      await Promise.all(
        [...byHome].map(([home, ms]) =>
          this.redis.zadd(keys[home]!, 'NX', ...ms.flatMap(({ member, score }) => [score, member])),
        ),
      );
      await this.redis.zrem(keys[p]!, ...strays.map((s) => s.member));
    }
    const due = perPartition.map((flat) => pairs(flat).filter(({ score }) => score <= before.getTime()));
    return oldestFirst(
      due.map((ps) => ps.flatMap(({ member, score }) => [member, String(score)])),
      limit,
    );
  }

  /** Puts back what an audit found (existing members keep their scores), each into its entry's partition. */
  async restore(
    pending: Array<{ entryId: string; createdAt: Date }>,
    locks: Array<{ entryId: string; createdAt: Date }>,
  ): Promise<void> {
    // One pipeline per partition: on a cluster each partition's keys live in a slot of their own.
    const pipelines = new Map<number, ReturnType<RedisClient['pipeline']>>();
    const pipelineOf = (entryId: string) => {
      const home = this.home(entryId);
      let pipeline = pipelines.get(home);
      if (!pipeline) pipelines.set(home, (pipeline = this.redis.pipeline()));
      return pipeline;
    };
    for (const e of pending)
      pipelineOf(e.entryId).zadd(
        this.pendingKey(e.entryId),
        'NX',
        e.createdAt.getTime(),
        `${e.entryId}@${e.createdAt.getTime()}`,
      );
    for (const l of locks) pipelineOf(l.entryId).zadd(this.lockKey(l.entryId), 'NX', l.createdAt.getTime(), l.entryId);
    await Promise.all([...pipelines.values()].map((pipeline) => pipeline.exec()));
  }

  /** Lets the next sweep audit at once (after Redis lost writes: its claim may have outlived what it vouched for). */
  async forgetAuditClaim(): Promise<void> {
    await this.redis.del(this.auditKey);
  }

  /**
   * True for the one caller that may audit now: the claim lasts `everyMs`, so all processes together audit at most
   * that often, and at once after Redis lost its data (the claim went with it).
   */
  async claimAudit(everyMs: number): Promise<boolean> {
    return (await this.redis.set(this.auditKey, AUDIT_KEY_VALUE, 'PX', everyMs, 'NX')) === 'OK';
  }
}

/** Members of a partition above K moved home per read. */
const DRAIN_BATCH = 1_000;

/** A WITHSCORES reply as members with their scores. */
function pairs(flat: string[]): Array<{ member: string; score: number }> {
  return Array.from({ length: flat.length / 2 }, (_, i) => ({ member: flat[2 * i]!, score: Number(flat[2 * i + 1]) }));
}

/** WITHSCORES replies of several partitions merged: the members, lowest score first, at most `limit`, each once. */
function oldestFirst(perPartition: string[][], limit: number): string[] {
  const all = perPartition.flatMap(pairs).sort((a, b) => a.score - b.score);
  return [...new Set(all.map((p) => p.member))].slice(0, limit);
}
