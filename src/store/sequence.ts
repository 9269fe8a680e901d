import type { RedisClient } from '../redis.ts';
import type { Collection, Db, Document } from 'mongodb';
import { insertFirst } from './mongo.ts';

/**
 * Records kept in order under an owner key, each stored under `_id` `<owner>#<n>` (n = 1, 2, 3 …), so that reading
 * an owner's records is a run of exact `_id` lookups whose cost follows the owner's records, never the collection
 * (on FerretDB any other filter scans the whole collection).
 *
 * n comes from a Redis counter (INCR: atomic and contention-free) and is claimed by a unique insert: the insert is
 * the fact, the counter only a hint. A counter lost with Redis restarts low: `append` then skips the taken slots
 * and `head` probes past it (and raises it again). A writer that dies between INCR and its insert leaves a gap,
 * which readers skip: every slot up to `head` is read, a missing one is simply not there. Records are removed only
 * from the end backwards (or all at once), so removal leaves no gap either.
 */
export type SequenceEntry<T> = T & { _id: string; owner: string; n: number };

const GAP_LOOKAHEAD = 3;
const RAISE_TO =
  "local c = tonumber(redis.call('get', KEYS[1]) or '0') if c < tonumber(ARGV[1]) then redis.call('set', KEYS[1], ARGV[1]) end return 0";

export class Sequence<T extends Document> {
  readonly collection: Collection<SequenceEntry<T>>;

  constructor(
    db: Db,
    collectionName: string,
    private readonly redis: RedisClient,
    private readonly counterPrefix: string,
  ) {
    this.collection = db.collection<SequenceEntry<T>>(collectionName);
  }

  private counterKey(owner: string): string {
    return `${this.counterPrefix}:${this.collection.collectionName}:${owner}`;
  }

  static slotId(owner: string, n: number): string {
    return `${owner}#${n}`;
  }

  /**
   * Appends `value` after the owner's last record; returns its position. `beforeInsert` runs with the slot's `_id`
   * before the insert that claims it (to record something about the entry first, e.g. when it expires).
   */
  async append(owner: string, value: T, beforeInsert?: (slotId: string) => Promise<void>): Promise<number> {
    for (;;) {
      const n = await this.redis.incr(this.counterKey(owner));
      const entry = { ...value, _id: Sequence.slotId(owner, n), owner, n } as SequenceEntry<T>;
      if (beforeInsert) await beforeInsert(entry._id);
      if (await insertFirst(this.collection, entry as never)) return n;
    }
  }

  /** The position of the owner's last record (0 when it has none). */
  async head(owner: string): Promise<number> {
    return this.headFrom(owner, await this.redis.get(this.counterKey(owner)));
  }

  /** head() from the counter as just read (null: none). */
  private async headFrom(owner: string, counter: string | null): Promise<number> {
    const hinted = Number(counter ?? 0);
    // Without a counter (lost with Redis), look a few slots past each missing one: a dead writer's gap must not
    // hide the records after it.
    const lookahead = counter === null ? GAP_LOOKAHEAD : 1;
    let n = hinted;
    for (let step = 1; step <= lookahead; step++) {
      if (await this.get(owner, n + step)) {
        n += step;
        step = 0;
      }
    }
    if (n > hinted) await this.redis.eval(RAISE_TO, 1, this.counterKey(owner), String(n));
    return n;
  }

  /**
   * Whether the owner has no record, as head() would answer, in one Redis read when a position was ever taken. An
   * owner found empty gets a counter of 0, so that its next look is the counter and one probe (head() always reads
   * one slot past the counter) instead of the lookahead a missing counter needs.
   */
  async isEmpty(owner: string): Promise<boolean> {
    const counter = await this.redis.get(this.counterKey(owner));
    if (Number(counter ?? 0) > 0) return false;
    if (counter !== null) return (await this.get(owner, 1)) === null;
    const empty = (await this.headFrom(owner, counter)) === 0;
    if (empty) await this.redis.set(this.counterKey(owner), '0', 'NX');
    return empty;
  }

  get(owner: string, n: number): Promise<SequenceEntry<T> | null> {
    return this.collection.findOne({ _id: Sequence.slotId(owner, n) } as never) as Promise<SequenceEntry<T> | null>;
  }

  async remove(owner: string, n: number): Promise<void> {
    await this.collection.deleteOne({ _id: Sequence.slotId(owner, n) } as never);
  }

  /** Drops the owner's counter once all its records are removed (the owner is not appended to again). */
  async forget(owner: string): Promise<void> {
    await this.redis.del(this.counterKey(owner));
  }
}
