import { MongoClient, MongoServerError, type Db } from 'mongodb';
import type { Config } from '../config.ts';

export function createMongoClient(config: Config): MongoClient {
  // A short server-selection timeout makes a request fail fast (503) instead of hanging while MongoDB is down.
  return new MongoClient(config.mongoUrl, {
    serverSelectionTimeoutMS: config.mongoServerSelectionTimeoutMs,
    connectTimeoutMS: 2_000,
    maxPoolSize: 50,
    appName: 'agent-settlement',
  });
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
