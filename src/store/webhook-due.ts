import type { RedisClient } from '../redis.ts';
import type { Collection, Db } from 'mongodb';
import { partitionOf } from '../queues/index.ts';
import { ONE_PARTITION, type DuePartitions } from './due-work.ts';
import { insertFirst } from './mongo.ts';
import { Sequence, type SequenceEntry } from './sequence.ts';

/**
 * The webhook sweeper's due index: what must happen by when, so that work whose job was lost (a crash between a
 * write and its enqueue, a job removed from Redis) is found in time proportional to the due work, never by
 * scanning outbox events or deliveries.
 *
 * Entries live in one-minute buckets: bucket b holds entries `b#1`, `b#2`, … (a Sequence), read by exact `_id`.
 * Every writer adds the entry BEFORE the write that makes the work due (an outbox event; a delivery becoming
 * pending at nextAttemptAt), so a crash at any point leaves either no work or work with an entry. The sweeper walks
 * the buckets from its cursor to the current one, re-checks each entry that has fallen due against the record it
 * names (stale entries are harmless), re-enqueues what has no live job, and removes a past bucket once every entry
 * in it is done, moving the cursor past it. Which entries are done is remembered in Redis, so a sweep reads only
 * entries that may still be due. Known limit: a writer that stalls for longer than the sweeper's grace
 * between computing a bucket and inserting into it may land behind the cursor; its job, enqueued right after,
 * still carries the work, so only a second failure (that job lost too) leaves it to be found by hand.
 *
 * Split like the webhook-dispatch queue: an entry goes to the partition of its job's owner (the event or the
 * delivery), each partition with its own buckets, hints and cursor, swept by that partition's sweep job. Partition 0
 * keeps the names of old (bucket `b`, cursor `sweeper`), so K=1 changes none; partition n has `pn:b` and `sweeper-pn`.
 */
export const DUE_BUCKET_MS = 60_000;

export type DueWork =
  | { kind: 'fan-out'; tenantId: string; eventId: string; dueAt: Date }
  | { kind: 'deliver'; tenantId: string; deliveryId: string; dueAt: Date };

export type DueEntry = SequenceEntry<DueWork>;

interface CursorDoc {
  _id: string;
  /** The oldest bucket not yet cleared. */
  bucket: number;
}

const CURSOR_ID = 'sweeper';

/** The Sequence owner of a partition's bucket (partition 0: the bucket alone, as before partitions). */
function bucketOwner(bucket: number, partition: number): string {
  return partition === 0 ? String(bucket) : `p${partition}:${bucket}`;
}

function cursorId(partition: number): string {
  return partition === 0 ? CURSOR_ID : `${CURSOR_ID}-p${partition}`;
}
/** A bucket's done-entry hints outlive any sweep of it; a bucket still swept after that is read in full again. */
const HINT_TTL_MS = 7 * 24 * 3600 * 1000;

export function bucketOf(at: Date | number): number {
  return Math.floor((typeof at === 'number' ? at : at.getTime()) / DUE_BUCKET_MS);
}

export function bucketEnd(bucket: number): number {
  return (bucket + 1) * DUE_BUCKET_MS;
}

export class WebhookDueIndex {
  readonly entries: Sequence<DueWork>;
  readonly cursors: Collection<CursorDoc>;
  readonly partitions: DuePartitions;
  private readonly cursorsCreated = new Set<number>();

  constructor(
    db: Db,
    private readonly redis: RedisClient,
    private readonly counterPrefix: string,
    partitions: DuePartitions = ONE_PARTITION,
  ) {
    this.entries = new Sequence<DueWork>(db, 'webhook_due', redis, counterPrefix);
    this.cursors = db.collection<CursorDoc>('webhook_due_cursor');
    this.partitions = partitions;
  }

  /** The partition of the work's job (webhook-dispatch routes by the delivery, else the event). */
  partitionFor(work: DueWork): number {
    return partitionOf(work.kind === 'deliver' ? work.deliveryId : work.eventId, this.partitions.partitions);
  }

  /** Every partition a sweep reads: 0…K-1, and those above K still drained. */
  readPartitionList(): number[] {
    return Array.from({ length: this.partitions.readPartitions }, (_, p) => p);
  }

  /** Records that `work` is due at `work.dueAt` (work already due goes into the current bucket), in its partition. */
  async add(work: DueWork): Promise<void> {
    const bucket = Math.max(bucketOf(work.dueAt), bucketOf(Date.now()));
    const partition = this.partitionFor(work);
    if (!this.cursorsCreated.has(partition)) {
      // A partition's first entry ever starts its sweeper's walk; afterwards only the sweeper moves the cursor.
      await insertFirst(this.cursors, { _id: cursorId(partition), bucket: bucket - 1 });
      this.cursorsCreated.add(partition);
    }
    await this.entries.append(bucketOwner(bucket, partition), work);
  }

  /** Where the sweeper's walk of a partition starts; null while nothing was ever added to it. */
  async cursor(partition = 0): Promise<number | null> {
    return (await this.cursors.findOne({ _id: cursorId(partition) }))?.bucket ?? null;
  }

  /** Only the sweeper writes this; two overlapping sweeps may move it back, which only re-reads empty buckets. */
  async moveCursor(bucket: number, partition = 0): Promise<void> {
    await this.cursors.updateOne({ _id: cursorId(partition) }, { $set: { bucket } });
  }

  /**
   * The bucket's entries that are not known to be done. What is known is a hint in Redis (lost with Redis, every
   * entry is read and checked again): the position of the first entry not done (entries before it are done, and
   * new ones only ever come after), and the positions found done after it.
   */
  async read(bucket: number, partition = 0): Promise<DueEntry[]> {
    const owner = bucketOwner(bucket, partition);
    const [head, first, done] = await Promise.all([
      this.entries.head(owner),
      this.redis.get(this.firstKey(owner)),
      this.redis.smembers(this.doneKey(owner)),
    ]);
    const from = Math.max(1, Number(first ?? 1));
    const skip = new Set(done.map(Number));
    const positions = Array.from({ length: Math.max(0, head - from + 1) }, (_, i) => from + i).filter(
      (n) => !skip.has(n),
    );
    const slots = await Promise.all(positions.map((n) => this.entries.get(owner, n)));
    return slots.filter((e): e is DueEntry => e !== null);
  }

  /** Remembers which entries of the bucket are done: all before `firstLive`, and `done` after it. */
  async remember(bucket: number, firstLive: number, done: number[], partition = 0): Promise<void> {
    const owner = bucketOwner(bucket, partition);
    const pipeline = this.redis.multi().set(this.firstKey(owner), String(firstLive), 'PX', HINT_TTL_MS);
    const after = done.filter((n) => n > firstLive);
    if (after.length > 0)
      pipeline.sadd(this.doneKey(owner), ...after.map(String)).pexpire(this.doneKey(owner), HINT_TTL_MS);
    await pipeline.exec();
  }

  /** Removes a past bucket whose entries are all done, last entry first (an interrupted clear leaves no gap). */
  async clear(bucket: number, partition = 0): Promise<void> {
    const owner = bucketOwner(bucket, partition);
    for (let n = await this.entries.head(owner); n >= 1; n--) await this.entries.remove(owner, n);
    await this.entries.forget(owner);
    await this.redis.del(this.firstKey(owner), this.doneKey(owner));
  }

  // A bucket's two keys share a hash tag (its owner), so MULTI and DEL over both stay in one Redis Cluster slot.
  private doneKey(owner: string): string {
    return `${this.counterPrefix}:webhook-due:{${owner}}:done`;
  }

  private firstKey(owner: string): string {
    return `${this.counterPrefix}:webhook-due:{${owner}}:first`;
  }
}
