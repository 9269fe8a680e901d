import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import { readFeed } from '../../src/services/webhook-feed.ts';
import { sweepWebhookRetention } from '../../src/services/webhook-retention.ts';
import type { WebhookDeliveryDoc } from '../../src/store/webhook-deliveries.ts';
import { WebhookRetentionIndex } from '../../src/store/webhook-retention.ts';
import { DELIVERY_OVERRIDES, startHarness, type Harness } from './harness.ts';

// Retention without TTL indexes: deliveries, their attempts and revisions, and index and parked entries are removed
// by the webhook sweeper WEBHOOK_RETENTION_DAYS after the delivery's last change (FerretDB, the default backend,
// refuses TTL indexes). The sweep is driven with a clock one retention period ahead instead of waiting a day.

const DAY_MS = 86_400_000;

describe('webhook retention sweep', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_RETENTION_DAYS: '1' } });
  });
  afterAll(() => h.close());

  const attempt = (ok: boolean) => ({
    startedAt: new Date(),
    durationMs: 3,
    statusCode: ok ? 204 : 500,
    error: ok ? null : 'receiver answered HTTP 500',
    succeeded: ok,
  });
  const pause = () => new Promise((resolve) => setTimeout(resolve, 20));

  it('removes records past retention with everything they own, keeps recent and pending ones, and counts what it did', async () => {
    expect(h.config.webhooks.retentionDays).toBe(1);
    const { auth } = await h.tenantWithKey();
    const { id: endpointId } = await h.createEndpoint(auth, 'https://hooks.example.com/retained', ['run.finalized']);
    const endpoint = (await h.runtime.stores.webhookEndpoints.get(endpointId))!;
    const deliveries = h.runtime.stores.webhookDeliveries;
    const create = async () => {
      const event = await h.runtime.stores.outbox.record(
        endpoint.tenantId,
        'run.finalized',
        { runId: `run_${randomUUID()}` },
        `retention:${randomUUID()}`,
        { test: false, fanOut: true, createdAt: new Date() },
      );
      return deliveries.ensure({ eventId: event._id, eventType: 'run.finalized', endpoint, now: new Date() });
    };
    const finish = async (d: WebhookDeliveryDoc, ok: boolean) =>
      (await deliveries.transition(
        d,
        {
          status: ok ? 'succeeded' : 'failed',
          nextAttemptAt: null,
          lastError: ok ? null : 'receiver answered HTTP 500',
        },
        attempt(ok),
      ))!;

    // Old: delivered, failed (so also parked), still pending, and one whose last attempt comes after the cutoff.
    const delivered = await finish(await create(), true);
    const failed = await finish(await create(), false);
    const pending = await create();
    const retriedLater = await create();
    await pause();
    const cutoff = Date.now();
    await pause();
    const lastAttemptRecent = await finish(retriedLater, false);
    const recent = await finish(await create(), true);

    const counts = await sweepWebhookRetention(h.runtime, { batch: 100, now: cutoff + DAY_MS });
    // delivered + failed go; their 2 index entries and failed's parked entry go; pending's delivery and entry and
    // retriedLater's index entry are kept (looked at, retention counting on); the rest is not due yet.
    expect(counts).toEqual({ deliveries: 2, entries: 3, kept: 3, forgotten: 0, failed: 0 });

    const db = h.runtime.db;
    for (const d of [delivered, failed]) {
      expect(await deliveries.get(d._id)).toBeNull();
      expect(await db.collection('webhook_attempts').findOne({ _id: `${d._id}#1` as never })).toBeNull();
      expect(await db.collection('webhook_delivery_revisions').findOne({ _id: `${d._id}#1` as never })).toBeNull();
      expect(
        await db.collection('webhook_index').findOne({ _id: `deliveries:${endpointId}#${d.seq}` as never }),
      ).toBeNull();
    }
    expect(await db.collection('webhook_index').findOne({ _id: `parked:${endpointId}#1` as never })).toBeNull();
    for (const d of [pending, lastAttemptRecent, recent]) {
      expect(await deliveries.atPosition(endpointId, d.seq)).toMatchObject({ _id: d._id });
    }
    expect(await deliveries.attemptsOf(lastAttemptRecent)).toHaveLength(1);
    // The parked entry of the delivery that failed after the cutoff is kept (enabling the endpoint replays it).
    expect(await deliveries.parkedAt(endpointId, 2)).toMatchObject({ _id: lastAttemptRecent._id });

    // The same sweep again finds nothing due: the kept ones count on from when they were looked at.
    expect(await sweepWebhookRetention(h.runtime, { batch: 100, now: cutoff + DAY_MS })).toEqual({
      deliveries: 0,
      entries: 0,
      kept: 0,
      forgotten: 0,
      failed: 0,
    });

    // The pull feed starts past the positions that expired: it does not wait at them as at a delivery being written.
    expect(await deliveries.retention.expiredThrough(endpointId)).toBe(failed.seq);
    const feed = await readFeed(h.runtime, endpoint.tenantId, endpointId, {});
    expect(feed.items.map((i) => i.delivery._id)).toEqual([pending._id, lastAttemptRecent._id, recent._id]);

    // A day after the pending one finally failed, it goes too.
    const finallyFailed = await finish((await deliveries.get(pending._id))!, false);
    const later = finallyFailed.updatedAt.getTime() + DAY_MS + 1;
    const laterCounts = await sweepWebhookRetention(h.runtime, { batch: 100, now: later });
    expect(laterCounts.failed).toBe(0);
    expect(await deliveries.get(pending._id)).toBeNull();
    expect(await deliveries.get(recent._id)).toBeNull();
  });

  it('one record that cannot be removed backs off alone and is counted; the others go', async () => {
    const { auth } = await h.tenantWithKey();
    const { id: endpointId } = await h.createEndpoint(auth, 'https://hooks.example.com/broken', ['run.finalized']);
    const endpoint = (await h.runtime.stores.webhookEndpoints.get(endpointId))!;
    const deliveries = h.runtime.stores.webhookDeliveries;
    const fine = await deliveries.ensure({
      eventId: 'evt_fine_one',
      eventType: 'run.finalized',
      endpoint,
      now: new Date(),
    });
    const done = (await deliveries.transition(
      fine,
      { status: 'succeeded', nextAttemptAt: null, lastError: null },
      attempt(true),
    ))!;
    // A record the sweep cannot make sense of (a date that is not one): removing it throws.
    const brokenId = `whd_broken_${randomUUID().slice(0, 8)}`;
    await h.runtime.db
      .collection('webhook_deliveries')
      .insertOne({ _id: brokenId as never, rev: 0, status: 'failed', updatedAt: 'not a date' });
    await deliveries.retention.noteDelivery(brokenId, new Date(done.updatedAt.getTime() - 1));
    const now = Date.now() + 2 * DAY_MS;

    const first = await sweepWebhookRetention(h.runtime, { batch: 100, now });
    expect(first.failed).toBe(1);
    expect(first.deliveries).toBeGreaterThanOrEqual(1);
    expect(await deliveries.get(done._id)).toBeNull();
    expect(h.logs()).toContain('webhook record not removed');
    // Backing off: not tried again at once, tried again once its backoff has passed.
    expect((await sweepWebhookRetention(h.runtime, { batch: 100, now })).failed).toBe(0);
    expect((await sweepWebhookRetention(h.runtime, { batch: 100, now: now + 60_000 })).failed).toBe(1);
    // Removed by hand, it is forgotten by the next sweep that gets to it.
    await h.runtime.db.collection('webhook_deliveries').deleteOne({ _id: brokenId as never });
    const last = await sweepWebhookRetention(h.runtime, { batch: 100, now: now + 3_600_000 * 2 });
    expect(last).toMatchObject({ failed: 0, forgotten: 1 });
    expect(
      await h.runtime.redis.zscore(
        `${h.config.redisPrefix}:{webhook-retention}:due`,
        WebhookRetentionIndex.deliveryMember(brokenId),
      ),
    ).toBeNull();
  });
});
