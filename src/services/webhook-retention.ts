import type { Runtime } from '../runtime.ts';
import type { WebhookDeliveryDoc } from '../store/webhook-deliveries.ts';
import type { DueMember } from '../store/webhook-retention.ts';

// The retention sweep: removes webhook deliveries (with their attempts and revisions) and index and parked entries
// once WEBHOOK_RETENTION_DAYS have passed since the delivery's last change. It pops what is due from the retention
// index (store/webhook-retention.ts), re-reads each record by `_id` and decides on what it reads, so it costs what
// expires, never what is stored, and works where TTL indexes do not (FerretDB). A delivery still pending (an attempt
// due or running) is never removed. One record that fails to go backs off alone; the others go on.

/** Records removed at once (each one's own deletes run one after another; see WebhookDeliveryStore.expire). */
const PARALLEL = 8;

export interface RetentionSweep {
  /** Deliveries removed with their attempts and revisions. */
  deliveries: number;
  /** Index and parked entries removed (each once its delivery is past retention or gone). */
  entries: number;
  /** Records looked at and kept: changed since, or still pending (their retention counts on). */
  kept: number;
  /** Members whose record was already gone (removed before, or never written). */
  forgotten: number;
  /** Records that could not be removed this time (they back off and are tried again). */
  failed: number;
}

type Outcome = 'deliveries' | 'entries' | 'kept' | 'forgotten';

function retainedFrom(d: WebhookDeliveryDoc, now: number): number {
  if (d.status === 'pending') return now; // an attempt is due or running: counts from now until it finishes
  return d.updatedAt.getTime();
}

async function expireOne(runtime: Runtime, { member }: DueMember, cutoff: number, now: number): Promise<Outcome> {
  const deliveries = runtime.stores.webhookDeliveries;
  const retention = deliveries.retention;
  if (member.kind === 'delivery') {
    const d = await deliveries.get(member.id);
    if (!d) {
      await retention.forget(member);
      return 'forgotten';
    }
    const from = retainedFrom(d, now);
    if (from > cutoff) {
      await retention.keep(member, from);
      return 'kept';
    }
    await deliveries.expire(d);
    await retention.forget(member);
    return 'deliveries';
  }
  const entry = await deliveries.indexEntry(member.id);
  if (!entry) {
    await retention.forget(member);
    return 'forgotten';
  }
  // An entry is kept while its delivery is.
  const d = await deliveries.get(entry.deliveryId);
  const from = d ? retainedFrom(d, now) : -Infinity;
  if (from > cutoff) {
    await retention.keep(member, from);
    return 'kept';
  }
  const endpointId = await deliveries.removeIndexEntry(entry);
  if (endpointId) await retention.raiseExpiredThrough(endpointId, entry.n);
  await retention.forget(member);
  return 'entries';
}

/** One sweep: up to `batch` due records, each removed, kept (re-scored) or backed off. */
export async function sweepWebhookRetention(
  runtime: Runtime,
  options: { batch: number; now?: number },
): Promise<RetentionSweep> {
  const now = options.now ?? Date.now();
  const cutoff = now - runtime.config.webhooks.retentionDays * 86_400_000;
  const retention = runtime.stores.webhookDeliveries.retention;
  const due = await retention.due(cutoff, options.batch);
  const counts: RetentionSweep = { deliveries: 0, entries: 0, kept: 0, forgotten: 0, failed: 0 };
  for (let i = 0; i < due.length; i += PARALLEL) {
    await Promise.all(
      due.slice(i, i + PARALLEL).map(async (item) => {
        try {
          counts[await expireOne(runtime, item, cutoff, now)]++;
        } catch (err) {
          counts.failed++;
          const failures = await retention.backOff(item.member, cutoff).catch(() => null);
          runtime.logger.warn(
            { record: item.member.member, failures, err: (err as Error).message },
            'webhook record not removed; it backs off and is tried again',
          );
        }
      }),
    );
  }
  if (due.length > 0) runtime.logger.info(counts, 'webhook retention sweep');
  return counts;
}
