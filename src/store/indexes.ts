import type { Db } from 'mongodb';

/** Creates every index the stores rely on; idempotent, run at start-up by every process. */
export async function ensureIndexes(db: Db): Promise<void> {
  await Promise.all([
    db.collection('api_keys').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('tenants').createIndex({ createdAt: -1 }),
    db.collection('outbox_events').createIndex({ fannedOutAt: 1, createdAt: 1 }),
    db.collection('agents').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('runs').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('runs').createIndex({ status: 1, finalizeRequestedAt: 1 }),
    // The contract's guard: one event per position in a run (the _id runId:seq enforces it too; this orders reads).
    db.collection('run_events').createIndex({ runId: 1, seq: 1 }, { unique: true }),
    db.collection('run_events').createIndex({ runId: 1, id: 1 }, { unique: true }),
    db.collection('artifacts').createIndex({ runId: 1 }, { unique: true }),
  ]);
}
