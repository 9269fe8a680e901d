import type { Collection, Db } from 'mongodb';
import type { RedisClient } from '../redis.ts';
import { isDuplicateKey, RECONCILIATION_COMMENT } from './mongo.ts';

/**
 * A due-work index: one small record per piece of work that is not finished yet, written BEFORE the work it stands
 * for and removed once it is done, so a crash at any point leaves the work findable.
 *
 * The records (MongoDB) are the truth; a Redis sorted set scores each record's id by when it is due. A sweeper reads
 * the ids that have fallen due and then their records by `_id`, so it costs what is due now, never what waits for
 * later: a settlement sits here for its whole dispute window, and reading them all on every sweep (as this did) cost
 * FerretDB more with every settlement in its window. A record is written before its id is scored, so an id without a
 * record is work already done (removed on sight). What Redis may lose (a crash between the two writes, Redis losing
 * its data) `audit` puts back: one process at a time, at most once per AUDIT_EVERY_MS, it reads the records whole.
 *
 * `dueAt` is when the sweeper should look; it is a hint (updating it is a cache write and may be lost on FerretDB),
 * so a record is only ever removed by the one who has seen the work finished.
 */
export interface DueRecord {
  _id: string;
  tenantId: string;
  dueAt: Date;
}

/** The reconciliation reads every record: rare, and at most this many (logged, with how many it put back). */
const AUDIT_EVERY_MS = 6 * 3_600_000;
const AUDIT_LIMIT = 200_000;

export class DueWorkStore {
  readonly records: Collection<DueRecord>;
  private readonly dueKey: string;
  private readonly auditKey: string;

  constructor(
    db: Db,
    name: string,
    private readonly redis: RedisClient,
    redisPrefix: string,
  ) {
    this.records = db.collection<DueRecord>(`due_${name}`);
    // One hash tag for both keys, so they stay in one Redis Cluster slot.
    this.dueKey = `${redisPrefix}:{due:${name}}:at`;
    this.auditKey = `${redisPrefix}:{due:${name}}:audit`;
  }

  /** Marks `id` due at `dueAt` (creating or moving the record). */
  async mark(id: string, tenantId: string, dueAt: Date): Promise<void> {
    try {
      await this.records.replaceOne({ _id: id }, { tenantId, dueAt }, { upsert: true });
    } catch (err) {
      // Two concurrent upserts both tried the insert; the record exists now, so move it.
      if (!isDuplicateKey(err)) throw err;
      await this.records.replaceOne({ _id: id }, { tenantId, dueAt });
    }
    await this.redis.zadd(this.dueKey, dueAt.getTime(), id);
  }

  async done(id: string): Promise<void> {
    await this.records.deleteOne({ _id: id });
    await this.redis.zrem(this.dueKey, id);
  }

  /** Records due at `now`, oldest first, at most `limit`: read by `_id`, only those the index says have fallen due. */
  async due(now: Date, limit: number): Promise<DueRecord[]> {
    const ids = await this.redis.zrangebyscore(this.dueKey, '-inf', now.getTime(), 'LIMIT', 0, limit);
    const records = await Promise.all(ids.map((id) => this.records.findOne({ _id: id })));
    const due: DueRecord[] = [];
    const fixes = this.redis.pipeline();
    for (const [i, record] of records.entries()) {
      if (!record)
        fixes.zrem(this.dueKey, ids[i]!); // its work was done (the record goes first)
      else if (record.dueAt.getTime() > now.getTime())
        fixes.zadd(this.dueKey, 'XX', record.dueAt.getTime(), record._id); // moved later
      else due.push(record);
    }
    if (fixes.length > 0) await fixes.exec();
    return due;
  }

  /**
   * Records due before `before`, at most `limit`, read without changing the index (the ledger audit's look for
   * work left behind): the index's ids by score, then each record by `_id`, kept when its own `dueAt` agrees.
   */
  async overdue(before: Date, limit: number): Promise<DueRecord[]> {
    const ids = await this.redis.zrangebyscore(this.dueKey, '-inf', before.getTime(), 'LIMIT', 0, limit);
    const records = await Promise.all(ids.map((id) => this.records.findOne({ _id: id })));
    return records.filter((r): r is DueRecord => r !== null && r.dueAt.getTime() <= before.getTime());
  }

  /** Whether `id` has a record (work not finished yet). */
  async has(id: string): Promise<boolean> {
    return (await this.records.findOne({ _id: id }, { projection: { _id: 1 } })) !== null;
  }

  /** Every record's id, at most `limit` (a scan of the records: only after Redis lost writes). */
  async allIds(limit: number): Promise<string[]> {
    const records = await this.records
      .find({}, { projection: { _id: 1 }, comment: RECONCILIATION_COMMENT })
      .limit(limit)
      .toArray();
    return records.map((r) => r._id);
  }

  /** Lets the next sweep audit at once (after Redis lost writes: its claim may have outlived what it vouched for). */
  async forgetAuditClaim(): Promise<void> {
    await this.redis.del(this.auditKey);
  }

  /**
   * Puts back into the index every record it lacks (those it has keep their time), when this process may: the
   * claim lasts AUDIT_EVERY_MS, so all processes together audit at most that often, and at once after Redis lost
   * its data (the claim went with it). Null when it was not this process's turn.
   */
  async audit(): Promise<{ read: number; restored: number; limit: number } | null> {
    if ((await this.redis.set(this.auditKey, '1', 'PX', AUDIT_EVERY_MS, 'NX')) !== 'OK') return null;
    const records = await this.records
      .find({}, { projection: { dueAt: 1 }, comment: RECONCILIATION_COMMENT })
      .limit(AUDIT_LIMIT)
      .toArray();
    let restored = 0;
    for (let i = 0; i < records.length; i += 1_000) {
      const pipeline = this.redis.pipeline();
      for (const r of records.slice(i, i + 1_000)) pipeline.zadd(this.dueKey, 'NX', r.dueAt.getTime(), r._id);
      for (const [err, added] of (await pipeline.exec()) ?? []) {
        if (err) throw err;
        restored += Number(added);
      }
    }
    return { read: records.length, restored, limit: AUDIT_LIMIT };
  }
}
