import type { RedisClient } from '../redis.ts';

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
 * Redis keeps these with AOF like the queues themselves; `claimAudit` lets one process now and then rebuild them
 * from MongoDB in case Redis lost writes.
 */
export class LedgerDueIndex {
  private readonly pendingKey: string;
  private readonly locksKey: string;
  private readonly auditKey: string;

  constructor(
    private readonly redis: RedisClient,
    prefix: string,
  ) {
    // One hash tag for all three: a pipeline touching two of them stays in one Redis Cluster slot.
    this.pendingKey = `${prefix}:{ledger}:pending`;
    this.locksKey = `${prefix}:{ledger}:locks`;
    this.auditKey = `${prefix}:{ledger}:audit`;
  }

  async entryStarted(entryId: string, now = Date.now()): Promise<string> {
    const member = `${entryId}@${now}`;
    await this.redis.zadd(this.pendingKey, now, member);
    return member;
  }

  async entryDone(member: string): Promise<void> {
    await this.redis.zrem(this.pendingKey, member);
  }

  /** Looks at a started entry again at `at` instead of at once. */
  async postpone(member: string, at: number): Promise<void> {
    await this.redis.zadd(this.pendingKey, 'XX', at, member);
  }

  async startedBefore(before: Date, limit: number): Promise<StartedEntry[]> {
    return (await this.redis.zrangebyscore(this.pendingKey, '-inf', before.getTime(), 'LIMIT', 0, limit)).map(
      startedEntry,
    );
  }

  /**
   * Every started entry, oldest score first, at most `limit` (the ledger audit's look at what is in flight; a
   * postponed member keeps its start time in its name, so the caller reads that, not the score).
   */
  async startedEntries(limit: number): Promise<StartedEntry[]> {
    return (await this.redis.zrange(this.pendingKey, 0, limit - 1)).map(startedEntry);
  }

  async lockApplied(entryId: string, appliedAt: Date): Promise<void> {
    await this.redis.zadd(this.locksKey, 'NX', appliedAt.getTime(), entryId);
  }

  /** Looks at the lock again at `at` (its reserve's deadline), whatever time it was indexed under before. */
  async lockCheckAt(entryId: string, at: Date): Promise<void> {
    await this.redis.zadd(this.locksKey, at.getTime(), entryId);
  }

  async lockReconciled(entryId: string): Promise<void> {
    await this.redis.zrem(this.locksKey, entryId);
  }

  locksAppliedBefore(before: Date, limit: number): Promise<string[]> {
    return this.redis.zrangebyscore(this.locksKey, '-inf', before.getTime(), 'LIMIT', 0, limit);
  }

  /** Puts back what an audit found (existing members keep their scores). */
  async restore(
    pending: Array<{ entryId: string; createdAt: Date }>,
    locks: Array<{ entryId: string; createdAt: Date }>,
  ): Promise<void> {
    const pipeline = this.redis.pipeline();
    for (const e of pending)
      pipeline.zadd(this.pendingKey, 'NX', e.createdAt.getTime(), `${e.entryId}@${e.createdAt.getTime()}`);
    for (const l of locks) pipeline.zadd(this.locksKey, 'NX', l.createdAt.getTime(), l.entryId);
    await pipeline.exec();
  }

  /**
   * True for the one caller that may audit now: the claim lasts `everyMs`, so all processes together audit at most
   * that often, and at once after Redis lost its data (the claim went with it).
   */
  /** Lets the next sweep audit at once (after Redis lost writes: its claim may have outlived what it vouched for). */
  async forgetAuditClaim(): Promise<void> {
    await this.redis.del(this.auditKey);
  }

  async claimAudit(everyMs: number): Promise<boolean> {
    return (await this.redis.set(this.auditKey, AUDIT_KEY_VALUE, 'PX', everyMs, 'NX')) === 'OK';
  }
}
