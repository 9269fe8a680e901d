import { MongoClient, MongoServerError, type Collection, type Db, type Document, type OptionalUnlessRequiredId } from 'mongodb';
import type { Config } from '../config.ts';

/** Command monitoring is always on: MongoHealthWatch needs it, and tests observe every command the stores send. */
export function createMongoClient(config: Config): MongoClient {
  // A short server-selection timeout makes a request fail fast (503) instead of hanging while MongoDB is down.
  return new MongoClient(config.mongoUrl, {
    serverSelectionTimeoutMS: config.mongoServerSelectionTimeoutMs,
    connectTimeoutMS: 2_000,
    maxPoolSize: 50,
    appName: 'agent-settlement',
    // Command events feed MongoHealthWatch (a request answers 503 when MongoDB stalls); tests observe them too.
    monitorCommands: true,
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
 * the oldest command in flight has been waiting. A hung server (socket open, no answer) shows as a command that
 * never completes; neither the driver's server selection nor its socket (no timeout by default) notices for
 * seconds, so the request deadline (http/plugins/deadline.ts) reads this instead.
 */
export class MongoHealthWatch {
  /** Commands in flight by connection and request id, in start order, so the first entry is the oldest. */
  private readonly pending = new Map<string, number>();
  private reachable = true;

  constructor(client: MongoClient) {
    const key = (e: { address: string; connectionId?: string | number; requestId: number }) => `${e.address}#${e.connectionId}#${e.requestId}`;
    client.on('commandStarted', (e) => this.pending.set(key(e), performance.now()));
    client.on('commandSucceeded', (e) => this.pending.delete(key(e)));
    client.on('commandFailed', (e) => this.pending.delete(key(e)));
    // A command whose connection is closed never reports back; forget it with its connection.
    client.on('connectionClosed', (e) => {
      const prefix = `${e.address}#${e.connectionId}#`;
      for (const k of this.pending.keys()) if (k.startsWith(prefix)) this.pending.delete(k);
    });
    client.on('topologyDescriptionChanged', (e) => {
      this.reachable = e.newDescription.hasDataBearingServers;
    });
  }

  get serverReachable(): boolean {
    return this.reachable;
  }

  /** How long the oldest command in flight has waited (0 when none is). */
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
