import type { Collection, Db } from 'mongodb';
import { isDuplicateKey } from './mongo.ts';

/**
 * A due-work index: one small record per piece of work that is not finished yet, written BEFORE the work it stands
 * for and removed once it is done. A sweeper reads the whole collection, which costs what is due, not what was ever
 * stored (a record of finished work does not stay here). A crash at any point leaves the record, so the work stays
 * findable; a record whose work is already done is found, checked and removed.
 *
 * `dueAt` is when the sweeper should look; it is a hint (updating it is a cache write and may be lost on FerretDB),
 * so a record is only ever removed by the one who has seen the work finished.
 */
export interface DueRecord {
  _id: string;
  tenantId: string;
  dueAt: Date;
}

export class DueWorkStore {
  readonly records: Collection<DueRecord>;

  constructor(db: Db, name: string) {
    this.records = db.collection<DueRecord>(`due_${name}`);
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
  }

  async done(id: string): Promise<void> {
    await this.records.deleteOne({ _id: id });
  }

  /** Records due at `now`, oldest first, at most `limit`. */
  async due(now: Date, limit: number): Promise<DueRecord[]> {
    const all = await this.records.find({}).toArray();
    return all
      .filter((r) => r.dueAt.getTime() <= now.getTime())
      .sort((a, b) => a.dueAt.getTime() - b.dueAt.getTime())
      .slice(0, limit);
  }
}
