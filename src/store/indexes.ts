import type { Db } from 'mongodb';

/** Creates every index the stores rely on; idempotent, run at start-up by every process. */
export async function ensureIndexes(db: Db): Promise<void> {
  await Promise.all([
    db.collection('api_keys').createIndex({ tenantId: 1, createdAt: -1 }),
    db.collection('tenants').createIndex({ createdAt: -1 }),
    db.collection('outbox_events').createIndex({ fannedOutAt: 1, createdAt: 1 }),
  ]);
}
