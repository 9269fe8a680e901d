import type { Collection, Db } from 'mongodb';
import type { RedisClient } from '../redis.ts';
import { partitionOf } from '../queues/index.ts';
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
  /**
   * The id its work is routed by (the job's owner: `tenantId/runId` for a settlement), which names the record's
   * partition. Records written before partitions have none: their store's default owner stands in.
   */
  owner?: string;
}

/**
 * How a due index is split, the way the hot queues are (docs/queues.md): `partitions` (K) is where records are
 * written, by their owner's hash; `readPartitions` (at least K) is how many are swept, above K while K is lowered.
 */
export interface DuePartitions {
  partitions: number;
  readPartitions: number;
}

export const ONE_PARTITION: DuePartitions = { partitions: 1, readPartitions: 1 };

/** The reconciliation reads every record: rare, and at most this many (logged, with how many it put back). */
const AUDIT_EVERY_MS = 6 * 3_600_000;
const AUDIT_LIMIT = 200_000;

export class DueWorkStore {
  readonly records: Collection<DueRecord>;
  readonly partitions: DuePartitions;
  private readonly dueKeys: string[];
  private readonly auditKey: string;
  private readonly defaultOwner: (id: string, tenantId: string) => string;

  constructor(
    db: Db,
    private readonly name: string,
    private readonly redis: RedisClient,
    redisPrefix: string,
    options: {
      partitions?: DuePartitions;
      /** The owner of a record marked without one (the id, unless the store's work routes by something else). */
      ownerOf?: (id: string, tenantId: string) => string;
    } = {},
  ) {
    this.records = db.collection<DueRecord>(`due_${name}`);
    this.partitions = options.partitions ?? ONE_PARTITION;
    this.defaultOwner = options.ownerOf ?? ((id) => id);
    // A hash tag per partition, so a cluster spreads them over its masters; partition 0 keeps the key it always had,
    // so K=1 changes no key name. The audit claim is one for the whole index (the audit reads every record).
    this.dueKeys = Array.from(
      { length: this.partitions.readPartitions },
      (_, p) => `${redisPrefix}:{due:${name}${p === 0 ? '' : `-p${p}`}}:at`,
    );
    this.auditKey = `${redisPrefix}:{due:${name}}:audit`;
  }

  /** The Redis key of a partition's index (tests and the drain look at it). */
  dueKey(partition: number): string {
    const key = this.dueKeys[partition];
    if (key === undefined) throw new Error(`due index ${this.name} has no partition ${partition}`);
    return key;
  }

  /** The partition a record is written to under the current K. */
  homeOf(record: Pick<DueRecord, '_id' | 'tenantId' | 'owner'>): number {
    return partitionOf(record.owner ?? this.defaultOwner(record._id, record.tenantId), this.partitions.partitions);
  }

  /** Every partition a sweep reads: 0…K-1, and those above K still drained. */
  readPartitionList(): number[] {
    return Array.from({ length: this.partitions.readPartitions }, (_, p) => p);
  }

  /** Whether `partition` is above K, left from a larger K: swept until empty, never written to. */
  isDraining(partition: number): boolean {
    return partition >= this.partitions.partitions;
  }

  /** Marks `id` due at `dueAt` (creating or moving the record), in its owner's partition. */
  async mark(id: string, tenantId: string, dueAt: Date, owner = this.defaultOwner(id, tenantId)): Promise<void> {
    const record = { tenantId, dueAt, owner };
    try {
      await this.records.replaceOne({ _id: id }, record, { upsert: true });
    } catch (err) {
      // Two concurrent upserts both tried the insert; the record exists now, so move it.
      if (!isDuplicateKey(err)) throw err;
      await this.records.replaceOne({ _id: id }, record);
    }
    await this.redis.zadd(this.dueKey(this.homeOf({ _id: id, ...record })), dueAt.getTime(), id);
  }

  /**
   * Forgets `id` (its work is finished): the record first, then its index entry, found through the record's owner.
   * An entry left elsewhere (written under another K) has no record any more and goes when a sweep reads it.
   */
  async done(id: string): Promise<void> {
    const record = await this.records.findOneAndDelete({ _id: id });
    if (record) await this.redis.zrem(this.dueKey(this.homeOf(record)), id);
  }

  /**
   * Records of `partition` due at `now`, oldest first, at most `limit`: read by `_id`, only those its index says
   * have fallen due. A record found in a partition that is not its home (written under another K) is answered when
   * due (this sweep does its work, and its mark or done lands home; the entry left here goes on the next read, as
   * a done or moved one), and moved home when not due yet.
   */
  async due(now: Date, limit: number, partition = 0): Promise<DueRecord[]> {
    const key = this.dueKey(partition);
    const ids = await this.redis.zrangebyscore(key, '-inf', now.getTime(), 'LIMIT', 0, limit);
    const records = await Promise.all(ids.map((id) => this.records.findOne({ _id: id })));
    const due: DueRecord[] = [];
    const fixes = this.redis.pipeline();
    const strays: DueRecord[] = [];
    for (const [i, record] of records.entries()) {
      if (!record) {
        fixes.zrem(key, ids[i]!); // its work was done (the record goes first)
        continue;
      }
      if (record.dueAt.getTime() <= now.getTime()) due.push(record);
      else if (this.homeOf(record) !== partition) strays.push(record);
      else fixes.zadd(key, 'XX', record.dueAt.getTime(), record._id); // moved later
    }
    if (fixes.length > 0) await fixes.exec();
    await this.moveHome(partition, strays);
    return due;
  }

  /**
   * A partition above K (K was lowered): moves up to `limit` of its entries, due or not, to their home partitions,
   * so that it empties without waiting for work due days from now. Answers how many it moved and how many are left.
   */
  async drain(partition: number, limit: number): Promise<{ moved: number; left: number }> {
    const key = this.dueKey(partition);
    const ids = await this.redis.zrange(key, 0, limit - 1);
    const records = await Promise.all(ids.map((id) => this.records.findOne({ _id: id })));
    const gone = ids.filter((_, i) => !records[i]);
    if (gone.length > 0) await this.redis.zrem(key, ...gone);
    const strays = records.filter((r): r is DueRecord => r !== null);
    await this.moveHome(partition, strays);
    return { moved: strays.length, left: await this.redis.zcard(key) };
  }

  /** Home first, then out of `from`: a crash between the two leaves an entry in both (harmless), never in neither. */
  private async moveHome(from: number, records: DueRecord[]): Promise<void> {
    if (records.length === 0) return;
    // One command per key (on a cluster each partition's key lives in its own slot).
    const byHome = groupBy(
      records.filter((r) => this.homeOf(r) !== from),
      (r) => this.homeOf(r),
    );
    await Promise.all(
      [...byHome].map(([home, rs]) =>
        this.redis.zadd(this.dueKey(home), ...rs.flatMap((r) => [r.dueAt.getTime(), r._id])),
      ),
    );
    const moved = [...byHome.values()].flat().map((r) => r._id);
    if (moved.length > 0) await this.redis.zrem(this.dueKey(from), ...moved);
  }

  /**
   * Records due before `before`, at most `limit`, read without changing the index (the ledger audit's look for
   * work left behind): every partition's ids by score, then each record by `_id`, kept when its own `dueAt` agrees.
   */
  async overdue(before: Date, limit: number): Promise<DueRecord[]> {
    const perPartition = await Promise.all(
      this.dueKeys.map((key) =>
        this.redis.zrangebyscore(key, '-inf', before.getTime(), 'WITHSCORES', 'LIMIT', 0, limit),
      ),
    );
    const scored = perPartition.flatMap((flat) =>
      Array.from({ length: flat.length / 2 }, (_, i) => ({ id: flat[2 * i]!, at: Number(flat[2 * i + 1]) })),
    );
    const ids = [...new Set(scored.sort((a, b) => a.at - b.at).map((s) => s.id))].slice(0, limit);
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
      .find({}, { projection: { dueAt: 1, tenantId: 1, owner: 1 }, comment: RECONCILIATION_COMMENT })
      .limit(AUDIT_LIMIT)
      .toArray();
    // Each record into its home partition, one pipeline per partition (one slot each on a cluster).
    const byHome = groupBy(records, (r) => this.homeOf(r));
    let restored = 0;
    for (const [home, rs] of byHome) {
      for (let i = 0; i < rs.length; i += 1_000) {
        const pipeline = this.redis.pipeline();
        for (const r of rs.slice(i, i + 1_000)) pipeline.zadd(this.dueKey(home), 'NX', r.dueAt.getTime(), r._id);
        for (const [err, added] of (await pipeline.exec()) ?? []) {
          if (err) throw err;
          restored += Number(added);
        }
      }
    }
    return { read: records.length, restored, limit: AUDIT_LIMIT };
  }
}

/** Items grouped by a key, in their order. */
export function groupBy<T, K>(items: readonly T[], keyOf: (item: T) => K): Map<K, T[]> {
  const groups = new Map<K, T[]>();
  for (const item of items) {
    const key = keyOf(item);
    const group = groups.get(key);
    if (group) group.push(item);
    else groups.set(key, [item]);
  }
  return groups;
}
