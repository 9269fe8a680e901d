import type { Collection, Db, Document } from 'mongodb';
import { insertFirst } from './mongo.ts';

export interface Revisioned {
  _id: string;
  /** 0 when created; every change inserts revision rev+1. */
  rev: number;
}

interface RevisionDoc<T> {
  _id: string;
  doc: T;
}

/**
 * A document whose changes are inserted revisions: a change from revision r is the unique insert of `<id>#<r+1>`
 * holding the whole new state, so two concurrent changes of one revision can never both win (FerretDB's conditional
 * updates can have two winners and lose writes; see docs/money.md, "Why unique inserts"). The document itself, under
 * its id, is a cache of the latest revision: reads follow `<id>#<rev+1>` … until one is missing and repair the cache,
 * so a lost or stale cache write only costs a lookup. Every read and write is by exact `_id`.
 */
export class RevisionLog<T extends Revisioned & Document> {
  readonly docs: Collection<T>;
  readonly revisions: Collection<RevisionDoc<T>>;

  constructor(db: Db, docsCollection: string, revisionsCollection: string) {
    this.docs = db.collection<T>(docsCollection);
    this.revisions = db.collection<RevisionDoc<T>>(revisionsCollection);
  }

  /** Creates the document at revision 0; false when it exists already. */
  create(doc: T): Promise<boolean> {
    return insertFirst(this.docs, doc as never);
  }

  async get(id: string): Promise<T | null> {
    const cached = (await this.docs.findOne({ _id: id } as never)) as T | null;
    if (!cached) return null;
    let doc: T = cached;
    let moved = false;
    for (;;) {
      const next: RevisionDoc<T> | null = await this.revisions.findOne({ _id: `${id}#${doc.rev + 1}` });
      if (!next) break;
      doc = next.doc;
      moved = true;
    }
    if (moved) this.writeCache(doc);
    return doc;
  }

  /** The document at exactly revision `rev` if that is still its latest; null otherwise (one round trip). */
  async getAt(id: string, rev: number): Promise<T | null> {
    const [atRev, next] = await Promise.all([
      rev === 0
        ? (this.docs.findOne({ _id: id } as never) as Promise<T | null>)
        : this.revisions.findOne({ _id: `${id}#${rev}` }).then((r) => r?.doc ?? null),
      this.revisions.findOne({ _id: `${id}#${rev + 1}` }),
    ]);
    return atRev && atRev.rev === rev && !next ? atRev : null;
  }

  /** Moves `current` to its next revision; null when another writer changed it first (re-read and decide again). */
  async commit(current: T, changes: Partial<T>): Promise<T | null> {
    const next = { ...current, ...changes, rev: current.rev + 1 } as T;
    if (!(await insertFirst(this.revisions, { _id: `${current._id}#${next.rev}`, doc: next }))) return null;
    this.writeCache(next);
    return next;
  }

  /**
   * Cache only, so nobody waits for it: a write that is late, lost or fails is corrected by the next read, which
   * follows the revisions from whatever revision the cache holds.
   */
  private writeCache(doc: T): void {
    this.docs.replaceOne({ _id: doc._id } as never, doc as never).catch(() => undefined);
  }
}
