import { MongoClient, MongoServerError, type Collection, type Db, type Document, type OptionalUnlessRequiredId } from 'mongodb';
import type { Config } from '../config.ts';

/** `monitorCommands` lets tests observe every command the stores send (see test/store/id-lookups.test.ts). */
export function createMongoClient(config: Config, options: { monitorCommands?: boolean } = {}): MongoClient {
  // A short server-selection timeout makes a request fail fast (503) instead of hanging while MongoDB is down.
  return new MongoClient(config.mongoUrl, {
    serverSelectionTimeoutMS: config.mongoServerSelectionTimeoutMs,
    connectTimeoutMS: 2_000,
    maxPoolSize: 50,
    appName: 'agent-settlement',
    monitorCommands: options.monitorCommands ?? false,
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
  try {
    await db.command({ ping: 1 }, { timeoutMS: timeoutMs });
    return true;
  } catch {
    return false;
  }
}

/**
 * The comment on the only queries allowed to read a growing collection whole: a due index's rare reconciliation
 * pass (bounded and logged), never a request or job path. test/store/id-lookups.test.ts lets exactly these through.
 */
export const RECONCILIATION_COMMENT = 'due-index-reconciliation';
