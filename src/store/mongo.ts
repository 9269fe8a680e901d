import {
  MongoBulkWriteError,
  MongoClient,
  MongoServerError,
  type Collection,
  type Db,
  type Document,
  type OptionalUnlessRequiredId,
} from 'mongodb';
import type { Config } from '../config.ts';

export function createMongoClient(config: Config): MongoClient {
  // A short server-selection timeout makes a request fail fast (503) instead of hanging while MongoDB is down.
  return new MongoClient(config.mongoUrl, {
    serverSelectionTimeoutMS: config.mongoServerSelectionTimeoutMs,
    connectTimeoutMS: 2_000,
    maxPoolSize: 50,
    appName: 'agent-settlement',
    // Off unless asked for (tests observing every command the stores send, round-trip diagnostics): each event copies
    // its command and reply, ~50 µs of CPU a command here. MongoHealthWatch needs only the pool's events.
    monitorCommands: config.mongoCommandMonitoring,
  });
}

/**
 * Inserts `doc` unless a record with its unique key exists: true when this insert won, false when another writer
 * got there first. Every "first writer wins" claim in the stores is this one call: a unique insert is atomic on
 * MongoDB and on FerretDB alike (FerretDB's updates are not; see docs/money.md, "Why unique inserts").
 *
 * Concurrent claims on one collection travel together (group commit, see InsertGroup): each document still wins or
 * loses on its own, and a lone claim goes out at once, as its own command.
 */
export function insertFirst<T extends Document>(
  collection: Collection<T>,
  doc: OptionalUnlessRequiredId<T>,
): Promise<boolean> {
  let group = insertGroups.get(collection);
  if (!group) insertGroups.set(collection, (group = new InsertGroup(collection as unknown as Collection<Document>)));
  return group.insert(doc as Document);
}

/**
 * Group commit for unique inserts. Under load each FerretDB command costs about the same whatever it carries (50
 * single inserts from 50 callers queue for ~50 ms; one 50-document insert takes ~5 ms), so claims that arrive while
 * earlier ones are in flight wait for a slot and go out as one unordered `insert`, in which every document succeeds or
 * fails by itself. Claims made in the same tick share a command from the start; with a slot free nothing waits.
 */
class InsertGroup {
  /** Commands in flight on this collection at once: enough that a request's parallel claims never queue. */
  static readonly MAX_IN_FLIGHT = 4;
  /** Documents per command: bounded so that one command never holds the others up for long. */
  static readonly MAX_DOCS = 128;

  private readonly waiting: Array<{ doc: Document; settle: (won: boolean) => void; fail: (err: unknown) => void }> = [];
  private inFlight = 0;
  private scheduled = false;

  constructor(private readonly collection: Collection<Document>) {}

  insert(doc: Document): Promise<boolean> {
    return new Promise<boolean>((settle, fail) => {
      this.waiting.push({ doc, settle, fail });
      if (!this.scheduled && this.inFlight < InsertGroup.MAX_IN_FLIGHT) {
        this.scheduled = true;
        queueMicrotask(() => this.send());
      }
    });
  }

  private send(): void {
    this.scheduled = false;
    while (this.waiting.length > 0 && this.inFlight < InsertGroup.MAX_IN_FLIGHT) {
      const batch = this.waiting.splice(0, InsertGroup.MAX_DOCS);
      this.inFlight += 1;
      void this.commit(batch).finally(() => {
        this.inFlight -= 1;
        this.send();
      });
    }
  }

  private async commit(batch: InsertGroup['waiting']): Promise<void> {
    try {
      await this.collection.insertMany(
        batch.map((w) => w.doc),
        { ordered: false },
      );
      for (const w of batch) w.settle(true);
    } catch (err) {
      // Anything but per-document errors (the connection, or a write concern not met) leaves every claim unsure.
      if (
        !(err instanceof MongoBulkWriteError) ||
        !Array.isArray(err.writeErrors) ||
        err.result?.getWriteConcernError()
      ) {
        for (const w of batch) w.fail(err);
        return;
      }
      const failed = new Map(err.writeErrors.map((e) => [e.index, e]));
      batch.forEach((w, i) => {
        const e = failed.get(i);
        if (!e) w.settle(true);
        else if (e.code === 11000) w.settle(false);
        else w.fail(new MongoServerError({ message: e.errmsg ?? 'insert failed', code: e.code, errmsg: e.errmsg }));
      });
    }
  }
}

/**
 * Unique inserts of `docs` in order, as one command that stops at the first one already taken: how many were
 * inserted (a prefix of `docs`). Document i is inserted only if every one before it was (an ordered insert, on
 * MongoDB and FerretDB alike), so a claim can be made on the condition that the claims before it won.
 */
export async function insertInOrder<T extends Document>(
  collection: Collection<T>,
  docs: Array<OptionalUnlessRequiredId<T>>,
): Promise<number> {
  try {
    await collection.insertMany(docs, { ordered: true });
    return docs.length;
  } catch (err) {
    const first =
      err instanceof MongoBulkWriteError && Array.isArray(err.writeErrors) && !err.result?.getWriteConcernError()
        ? err.writeErrors[0]
        : undefined;
    if (first?.code === 11000) return first.index;
    throw err; // the connection, or a write concern not met: unsure which were inserted
  }
}

/** Per collection object: each store holds its collections for its lifetime. */
const insertGroups = new WeakMap<object, InsertGroup>();

export function isDuplicateKey(err: unknown): boolean {
  return err instanceof MongoServerError && err.code === 11000;
}

export async function pingMongo(db: Db, timeoutMs: number): Promise<boolean> {
  // The driver (v7) ignores timeoutMS, and a hung server never answers: the bound is ours.
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      db.command({ ping: 1 }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('timeout')), timeoutMs);
      }),
    ]);
    return true;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * What this process knows about MongoDB without asking it: whether any data-bearing server is known, and how long
 * the oldest operation in flight has been waiting. A hung server (socket open, no answer) shows as a pooled
 * connection that is never checked back in; neither the driver's server selection nor its socket (no timeout by
 * default) notices for seconds, so the request deadline (http/plugins/deadline.ts) reads this instead. The pool's
 * check-out events are always emitted and cost nothing like command monitoring, which copies every command.
 */
export class MongoHealthWatch {
  /** Connections checked out (an operation in flight on each), in check-out order, so the first is the oldest. */
  private readonly pending = new Map<string, number>();
  private reachable = true;

  constructor(client: MongoClient) {
    const key = (e: { address: string; connectionId: string | number }) => `${e.address}#${e.connectionId}`;
    client.on('connectionCheckedOut', (e) => this.pending.set(key(e), performance.now()));
    client.on('connectionCheckedIn', (e) => this.pending.delete(key(e)));
    // A connection closed while out (a timeout, a dead server) is never checked back in.
    client.on('connectionClosed', (e) => this.pending.delete(key(e)));
    client.on('topologyDescriptionChanged', (e) => {
      this.reachable = e.newDescription.hasDataBearingServers;
    });
  }

  get serverReachable(): boolean {
    return this.reachable;
  }

  /** How long the oldest operation in flight has waited (0 when none is). */
  oldestPendingMs(now = performance.now()): number {
    for (const started of this.pending.values()) return now - started;
    return 0;
  }
}

/**
 * The comment on the only queries allowed to read a collection whole: a due index's rare reconciliation pass
 * (bounded and logged), and the ledger audit's reads of small collections (wallets, its own checkpoints and open
 * reserves); never a request or job path. test/store/id-lookups.test.ts lets exactly these through.
 */
export const RECONCILIATION_COMMENT = 'due-index-reconciliation';
