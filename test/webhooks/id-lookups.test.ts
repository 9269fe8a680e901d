import type { CommandStartedEvent, Document } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { emitEvent } from '../../src/services/events.ts';
import { sweepWebhookWork } from '../../src/services/webhook-delivery.ts';
import { sweepWebhookRetention } from '../../src/services/webhook-retention.ts';
import type { OutboxEventDoc } from '../../src/store/outbox.ts';
import { deliveryIdFor } from '../../src/store/webhook-deliveries.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, waitUntil, type Harness, type Receiver } from './harness.ts';

// Cost follows the work: on FerretDB only a filter that is exactly {_id: <string>} uses an index, so every read,
// update and delete on the webhook collections must be one. The driver's command monitoring sees every command
// the runtime sends while the whole webhook life cycle runs: register, list, get, rotate, fan-out, deliver, retry,
// 410 and disable, enable and replay, deliveries paged and filtered, delete, and sweeps that find lost work and
// clear the due index.
const WATCHED = new Set([
  'outbox_events',
  'webhook_endpoints',
  'webhook_endpoint_revisions',
  'webhook_endpoint_activity',
  'webhook_deliveries',
  'webhook_delivery_revisions',
  'webhook_attempts',
  'webhook_index',
  'webhook_due',
  'webhook_due_cursor',
]);
const FILTERING = ['find', 'update', 'delete', 'findAndModify', 'aggregate', 'count', 'distinct'] as const;

/** The filters a command applies (an aggregate or distinct has none that can be a plain `_id` lookup). */
function filtersOf(name: string, command: Document): unknown[] {
  if (name === 'find') return [command.filter];
  if (name === 'update') return (command.updates as Document[]).map((u) => u.q);
  if (name === 'delete') return (command.deletes as Document[]).map((d) => d.q);
  if (name === 'findAndModify' || name === 'count') return [command.query];
  return [command.pipeline ?? command];
}

function isIdLookup(filter: unknown): boolean {
  return (
    typeof filter === 'object' &&
    filter !== null &&
    Object.keys(filter).length === 1 &&
    typeof (filter as Document)._id === 'string'
  );
}

describe('webhook paths touch the webhook collections by exact _id only', () => {
  let h: Harness;
  let r: Receiver;
  const seen: Array<{ command: string; collection: string; filter: unknown }> = [];
  beforeAll(async () => {
    h = await startHarness({ overrides: DELIVERY_OVERRIDES, workers: true });
    const tried = new Set<string>();
    // /gone answers 410; /hook fails each event's first attempt, so every delivery there is retried once.
    r = await startReceiver((req) => {
      if (req.url === '/gone') return 410;
      const id = String(req.headers['webhook-id']);
      if (tried.has(id)) return 204;
      tried.add(id);
      return 500;
    });
    h.runtime.mongo.on('commandStarted', (e: CommandStartedEvent) => {
      if (!(FILTERING as readonly string[]).includes(e.commandName)) return;
      const collection = String(e.command[e.commandName]);
      if (!WATCHED.has(collection)) return;
      for (const filter of filtersOf(e.commandName, e.command))
        seen.push({ command: e.commandName, collection, filter });
    });
  });
  afterAll(async () => {
    await r.close();
    await h.close();
  });

  it('registers, lists, delivers, retries, disables, replays, deletes and sweeps with _id lookups alone', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const call = async (method: 'GET' | 'POST' | 'DELETE', url: string, payload?: object) => {
      const res = await h.app.inject({ method, url, headers: auth, ...(payload ? { payload } : {}) });
      expect(res.statusCode, `${method} ${url}: ${res.body}`).toBeLessThan(300);
      return res.statusCode === 204 ? null : res.json();
    };
    const hook = await h.createEndpoint(auth, r.url, ['run.finalized', 'settlement.completed']);
    const gone = await h.createEndpoint(auth, r.url.replace('/hook', '/gone'), ['run.finalized']);
    const unsubscribed = await h.createEndpoint(auth, r.url, ['dispute.opened']);
    const first = await call('GET', '/v1/webhooks?limit=2');
    const second = await call('GET', `/v1/webhooks?limit=2&cursor=${first.nextCursor}`);
    expect([...first.items, ...second.items].map((e: { id: string }) => e.id)).toEqual([
      unsubscribed.id,
      gone.id,
      hook.id,
    ]);
    await call('GET', `/v1/webhooks/${hook.id}`);
    await call('POST', `/v1/webhooks/${hook.id}/rotate-secret`, { gracePeriodSeconds: 60 });

    const events: OutboxEventDoc[] = [];
    for (let i = 0; i < 3; i++)
      events.push(await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: `run_${i}` }, `ids:${i}`));
    // An event whose fan-out job was never enqueued, as if its emitter died right after recording it.
    const orphan = await h.runtime.stores.outbox.record(
      tenantId,
      'settlement.completed',
      { runId: 'run_orphan' },
      'ids:orphan',
      { test: false, fanOut: true, createdAt: new Date() },
    );
    await waitUntil(() => r.received.some((q) => q.headers['webhook-id'] === orphan._id), 15_000, 'the swept orphan');
    const deliveries = h.runtime.stores.webhookDeliveries;
    await waitUntil(
      async () => {
        const states = await Promise.all(
          [...events, orphan].map(async (e) => (await deliveries.get(deliveryIdFor(e._id, hook.id)))?.status),
        );
        return states.every((s) => s === 'succeeded');
      },
      15_000,
      'every delivery to succeed',
      200,
    );
    await waitUntil(
      async () => (await call('GET', `/v1/webhooks/${gone.id}`)).status === 'disabled',
      5_000,
      'the 410 endpoint disabled',
    );

    const page1 = await call('GET', `/v1/webhooks/${hook.id}/deliveries?limit=2`);
    const page2 = await call('GET', `/v1/webhooks/${hook.id}/deliveries?limit=2&cursor=${page1.nextCursor}`);
    expect([...page1.items, ...page2.items]).toHaveLength(4);
    expect(page2.nextCursor).toBeNull();
    expect((await call('GET', `/v1/webhooks/${hook.id}/deliveries?status=succeeded`)).items).toHaveLength(4);
    for (const d of [...page1.items, ...page2.items])
      expect(d.attempts.map((a: { statusCode: number }) => a.statusCode)).toEqual([500, 204]);

    r.respond = () => 204;
    expect((await call('POST', `/v1/webhooks/${gone.id}/enable`)).replayed).toBe(3);
    await waitUntil(
      async () => (await call('GET', `/v1/webhooks/${gone.id}/deliveries?status=succeeded`)).items.length === 3,
      10_000,
      'the replays',
    );
    await call('DELETE', `/v1/webhooks/${unsubscribed.id}`);
    expect((await call('GET', '/v1/webhooks')).items).toHaveLength(2);

    // Sweeps as the scheduler runs them, then one three minutes on, when every bucket written so far is in the past
    // and its work done: it clears them (deletes by _id) and moves the cursor.
    await sweepWebhookWork(h.runtime, { batch: 500 });
    const cursorBefore = await h.runtime.stores.webhookDue.cursor();
    await sweepWebhookWork(h.runtime, { batch: 500, now: Date.now() + 3 * 60_000 });
    expect(await h.runtime.stores.webhookDue.cursor()).toBeGreaterThan(cursorBefore!);

    // The pull feed, read to its end, and the retention sweep a retention period on (it removes everything above).
    let feed = await call('GET', `/v1/webhooks/${hook.id}/events?limit=2`);
    while (feed.hasMore) feed = await call('GET', `/v1/webhooks/${hook.id}/events?limit=2&after=${feed.nextCursor}`);
    const expired = await sweepWebhookRetention(h.runtime, {
      batch: 500,
      now: Date.now() + (h.config.webhooks.retentionDays + 1) * 86_400_000,
    });
    expect(expired.deliveries).toBeGreaterThanOrEqual(7);
    expect(expired.failed).toBe(0);

    const violations = seen.filter((s) => !isIdLookup(s.filter));
    expect(violations).toEqual([]);
    // The monitoring saw the work: reads on every collection that grows with it, and the writes that keep it.
    for (const collection of WATCHED)
      expect(
        seen.filter((s) => s.collection === collection && s.command === 'find').length,
        collection,
      ).toBeGreaterThan(0);
    expect(seen.some((s) => s.collection === 'webhook_due' && s.command === 'delete')).toBe(true);
    for (const collection of [
      'webhook_deliveries',
      'webhook_delivery_revisions',
      'webhook_attempts',
      'webhook_index',
    ]) {
      expect(
        seen.some((s) => s.collection === collection && s.command === 'delete'),
        collection,
      ).toBe(true);
    }
    expect(seen.some((s) => s.collection === 'webhook_deliveries' && s.command === 'update')).toBe(true);
    expect(seen.some((s) => s.collection === 'outbox_events' && s.command === 'update')).toBe(true);
  }, 60_000);
});
