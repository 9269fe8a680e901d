import type { Db } from 'mongodb';
import type { Logger } from 'pino';

/** What `ensureIndexes` needs beside the database: the webhook retention (TTL) and where to say what it skipped. */
export interface IndexOptions {
  webhookRetentionDays: number;
  logger?: Pick<Logger, 'warn'>;
}

/**
 * Webhook deliveries, their revisions and attempts, and their index and parked entries expire `retentionDays` after
 * their last change, by TTL indexes on those dates (entries without the field, e.g. endpoint entries, never expire).
 * A changed retention is applied to an existing index with collMod. FerretDB 1.24 refuses TTL indexes
 * (NotImplemented: "Index option expireAfterSeconds is not implemented yet"): there the records are kept, and this
 * says so once at start-up instead of failing it.
 */
export const WEBHOOK_TTL_INDEXES = [
  { collection: 'webhook_deliveries', field: 'updatedAt' },
  { collection: 'webhook_delivery_revisions', field: 'doc.updatedAt' },
  { collection: 'webhook_attempts', field: 'startedAt' },
  { collection: 'webhook_index', field: 'indexedAt' },
] as const;

const NOT_IMPLEMENTED = 238;
const INDEX_OPTIONS_CONFLICT = 85;

async function ensureWebhookRetention(db: Db, options: IndexOptions): Promise<void> {
  const expireAfterSeconds = options.webhookRetentionDays * 86_400;
  for (const { collection, field } of WEBHOOK_TTL_INDEXES) {
    const name = `retention_${field.replace(/\./g, '_')}`;
    try {
      await db.collection(collection).createIndex({ [field]: 1 }, { name, expireAfterSeconds });
    } catch (err) {
      const code = (err as { code?: number }).code;
      if (code === NOT_IMPLEMENTED) {
        options.logger?.warn(
          { collection, field },
          'this MongoDB-compatible server has no TTL indexes: the webhook sweeper removes records past WEBHOOK_RETENTION_DAYS through its retention index alone',
        );
        return;
      }
      if (code !== INDEX_OPTIONS_CONFLICT) throw err;
      await db.command({ collMod: collection, index: { name, expireAfterSeconds } });
    }
  }
}

/** Creates every index the stores rely on; idempotent, run at start-up by every process. */
export async function ensureIndexes(db: Db, options: IndexOptions = { webhookRetentionDays: 30 }): Promise<void> {
  await ensureWebhookRetention(db, options);
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
    db
      .collection('run_batches')
      .dropIndex('runId_1_events.id_1')
      .catch(() => undefined),
  ]);
}
