import { recorded } from '../domain/money.ts';
import type { Collection, Db } from 'mongodb';
import { insertFirst } from './mongo.ts';

/**
 * The fate of an escrow reserve (a run's lock entry): taken by its owner's settlement, or given back to the payer.
 * Decided once, by a unique insert under the lock entry's id that every path races through (the settlement's
 * capture, the sweeper's return of an orphaned or overdue reserve): the loser sees the winner's fate and acts on
 * it, so one reserve can never be both paid out and returned.
 */
export interface ReserveFateDoc {
  _id: string;
  fate: 'captured' | 'returned';
  /** The settlement that captured it, or why it was returned. */
  by: string;
  at: Date;
}

export class ReserveStore {
  readonly fates: Collection<ReserveFateDoc>;

  // A reserve's deadline is kept by the ledger's lock index (LedgerStore.checkLockAt), which the settle sweeper reads.
  constructor(db: Db) {
    this.fates = db.collection<ReserveFateDoc>('reserve_fates');
  }

  /** Claims the reserve's fate; answers the fate that stands (this claim's, or the one that got there first). */
  async claim(lockEntryId: string, fate: ReserveFateDoc['fate'], by: string): Promise<ReserveFateDoc> {
    const doc: ReserveFateDoc = { _id: lockEntryId, fate, by, at: new Date() };
    if (await insertFirst(this.fates, doc)) return doc;
    return recorded(await this.fates.findOne({ _id: lockEntryId }), `the fate of reserve ${lockEntryId}`);
  }

  fateOf(lockEntryId: string): Promise<ReserveFateDoc | null> {
    return this.fates.findOne({ _id: lockEntryId });
  }
}
