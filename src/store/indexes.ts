import type { Db } from 'mongodb';

/** Creates every index the stores rely on; idempotent, run at start-up by every process. */
export async function ensureIndexes(db: Db): Promise<void> {
  await Promise.all([
    db.collection('api_keys').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('tenants').createIndex({ createdAt: -1 }),
    db.collection('agents').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('runs').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('runs').createIndex({ status: 1, finalizeRequestedAt: 1 }),
    // One batch per starting position (the id runId:firstSeq enforces it; this index serves reads by run).
    db.collection('run_batches').createIndex({ runId: 1, firstSeq: 1 }, { unique: true }),
    db.collection('artifacts').createIndex({ runId: 1 }, { unique: true }),
    db.collection('settlements').createIndex({ runId: 1 }, { unique: true }),
    db.collection('settlements').createIndex({ nextCheckAt: 1 }),
    db.collection('settlement_facts').createIndex({ kind: 1, 'data.disputeId': 1 }),
    // One spend per x402 wallet decision, whatever position of the day's chain it would take.
    db.collection('x402_daily_spends').createIndex({ decisionKey: 1 }, { unique: true }),
    // Batches now keep their events in one string (store/runs.ts), so this index would see every batch of a run
    // as the same missing key; an event id's once-per-run rule is kept by the appender (store/event-id-index.ts).
    db.collection('run_batches').dropIndex('runId_1_events.id_1').catch(() => undefined),
  ]);
}
