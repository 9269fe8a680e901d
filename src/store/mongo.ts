import { MongoClient, MongoServerError, type Collection, type Db, type Document, type OptionalUnlessRequiredId } from 'mongodb';
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
 * MongoDB and on FerretDB alike (FerretDB's updates are not; see README "Why unique inserts").
 */
export async function insertFirst<T extends Document>(collection: Collection<T>, doc: OptionalUnlessRequiredId<T>): Promise<boolean> {
  try {
    await collection.insertOne(doc);
    return true;
  } catch (err) {
    if (isDuplicateKey(err)) return false;
    throw err;
  }
}

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
 * The comment on the only queries allowed to read a growing collection whole: a due index's rare reconciliation
 * pass (bounded and logged), never a request or job path. test/store/id-lookups.test.ts lets exactly these through.
 */
export const RECONCILIATION_COMMENT = 'due-index-reconciliation';
