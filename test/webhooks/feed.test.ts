import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { emitEvent } from '../../src/services/events.ts';
import { fanOut } from '../../src/services/webhook-delivery.ts';
import { FEED_GAP_GRACE_MS, FEED_SCAN_LIMIT, readFeed } from '../../src/services/webhook-feed.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, type Harness, type Receiver } from './harness.ts';

// The pull feed: GET /v1/webhooks/{endpointId}/events?after=… hands out, oldest first, the events the endpoint
// subscribes to, each with the exact body and the signed headers of a delivery, checked here by the stock Standard
// Webhooks verifier and against what a real receiver got.

interface FeedItem {
  deliveryId: string;
  eventId: string;
  eventType: string;
  body: string;
  headers: Record<string, string>;
}

describe('webhook pull feed', () => {
  let h: Harness;
  const receivers: Receiver[] = [];
  beforeAll(async () => {
    h = await startHarness({ overrides: DELIVERY_OVERRIDES, workers: true });
  });
  afterAll(async () => {
    for (const r of receivers) await r.close();
    await h.close();
  });

  const get = (url: string, auth: Record<string, string>) => h.app.inject({ method: 'GET', url, headers: auth });
  const feedUrl = (endpointId: string, after?: string, limit?: number) =>
    `/v1/webhooks/${endpointId}/events?${new URLSearchParams({ ...(after ? { after } : {}), ...(limit ? { limit: String(limit) } : {}) })}`;

  /** Emits an event and creates its deliveries (the fan-out the worker would also do; it runs once either way). */
  async function emit(tenantId: string, type: 'run.finalized' | 'settlement.completed', runId: string) {
    const event = await emitEvent(h.runtime, tenantId, type, { runId }, `${type}:feed:${tenantId}:${runId}`);
    await fanOut(h.runtime, { tenantId, eventId: event._id });
    return event._id;
  }

  it('hands out each event with the body a delivery carries and headers a stock verifier accepts', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const r = await startReceiver(() => 204);
    receivers.push(r);
    const ep = await h.createEndpoint(auth, r.url, ['run.finalized']);
    const eventId = await emit(tenantId, 'run.finalized', 'run_same_bytes');
    const [delivered] = await r.waitFor(1);

    const res = await get(feedUrl(ep.id), auth);
    expect(res.statusCode, res.body).toBe(200);
    const page = res.json();
    expect(page.items).toHaveLength(1);
    const item: FeedItem = page.items[0];
    expect(item).toMatchObject({ eventId, eventType: 'run.finalized' });
    expect(item.body).toBe(delivered!.body); // byte for byte what the receiver was POSTed
    expect(item.headers['webhook-id']).toBe(delivered!.headers['webhook-id']);
    expect(new Webhook(ep.secret).verify(item.body, item.headers)).toMatchObject({
      id: eventId,
      type: 'run.finalized',
      data: { runId: 'run_same_bytes' },
    });
    expect(() =>
      new Webhook(ep.secret).verify(item.body.replace('run_same_bytes', 'run_other_bytes'), item.headers),
    ).toThrow();

    // After a rotation the items are signed with the new secret (and the previous one during its grace period).
    const rotated = (
      await h.app.inject({
        method: 'POST',
        url: `/v1/webhooks/${ep.id}/rotate-secret`,
        headers: auth,
        payload: { gracePeriodSeconds: 0 },
      })
    ).json();
    const after = (await get(feedUrl(ep.id), auth)).json().items[0] as FeedItem;
    expect(new Webhook(rotated.secret).verify(after.body, after.headers)).toMatchObject({ id: eventId });
    expect(() => new Webhook(ep.secret).verify(after.body, after.headers)).toThrow();
  });

  it('resumes from its cursor with no gap or duplicate while new events arrive, and only what the endpoint subscribes to', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const other = await h.tenantWithKey();
    const ep = await h.createEndpoint(auth, 'https://pull-only.example.com/unused', ['run.finalized']);
    await h.createEndpoint(other.auth, 'https://pull-only.example.com/other', ['run.finalized']);
    const expected: string[] = [];
    for (let i = 0; i < 5; i++) expected.push(await emit(tenantId, 'run.finalized', `run_${i}`));
    await emit(tenantId, 'settlement.completed', 'run_not_subscribed');
    await emit(other.tenantId, 'run.finalized', 'run_of_another_tenant');

    const seen: string[] = [];
    let cursor: string | undefined;
    let reads = 0;
    for (;;) {
      const res = await get(feedUrl(ep.id, cursor, 2), auth);
      expect(res.statusCode, res.body).toBe(200);
      const page = res.json();
      for (const item of page.items as FeedItem[]) {
        expect(new Webhook(ep.secret).verify(item.body, item.headers)).toMatchObject({
          id: item.eventId,
          type: 'run.finalized',
        });
        seen.push(item.eventId);
      }
      expect(typeof page.nextCursor).toBe('string');
      cursor = page.nextCursor;
      if (++reads === 2) for (let i = 5; i < 8; i++) expected.push(await emit(tenantId, 'run.finalized', `run_${i}`)); // arrive mid-read
      if (!page.hasMore) break;
    }
    expect(seen).toEqual(expected);
    // Read again from the last cursor: nothing new, the same cursor back; a new event then comes next.
    const idle = (await get(feedUrl(ep.id, cursor), auth)).json();
    expect(idle).toEqual({ items: [], nextCursor: cursor, hasMore: false });
    const latest = await emit(tenantId, 'run.finalized', 'run_latest');
    expect((await get(feedUrl(ep.id, cursor), auth)).json().items.map((i: FeedItem) => i.eventId)).toEqual([latest]);
  });

  it('pauses at a position whose delivery is not written yet and goes past it once its writer must be dead', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const ep = await h.createEndpoint(auth, 'https://pull-only.example.com/gap', ['run.finalized']);
    const first = await emit(tenantId, 'run.finalized', 'run_before_gap');
    // A writer took the next position and died before writing anything.
    await h.runtime.redis.incr(`${h.config.redisPrefix}:webhook_index:deliveries:${ep.id}`);
    const behind = await emit(tenantId, 'run.finalized', 'run_behind_gap');

    const now = await readFeed(h.runtime, tenantId, ep.id, {});
    expect(now.items.map((i) => i.delivery.eventId)).toEqual([first]);
    expect(now.hasMore).toBe(false);
    const later = await readFeed(
      h.runtime,
      tenantId,
      ep.id,
      { after: now.nextCursor },
      new Date(Date.now() + FEED_GAP_GRACE_MS + 1_000),
    );
    expect(later.items.map((i) => i.delivery.eventId)).toEqual([behind]);

    // A run of missing positions longer than one page may read does not hold the feed either.
    await h.runtime.redis.incrby(`${h.config.redisPrefix}:webhook_index:deliveries:${ep.id}`, FEED_SCAN_LIMIT + 5);
    const farBehind = await emit(tenantId, 'run.finalized', 'run_far_behind_gap');
    const afterGrace = new Date(Date.now() + FEED_GAP_GRACE_MS + 1_000);
    const across = await readFeed(h.runtime, tenantId, ep.id, { after: later.nextCursor }, afterGrace);
    expect(across.items).toEqual([]);
    expect(across.hasMore).toBe(true);
    expect(
      (await readFeed(h.runtime, tenantId, ep.id, { after: across.nextCursor }, afterGrace)).items.map(
        (i) => i.delivery.eventId,
      ),
    ).toEqual([farBehind]);
    // Before the grace has passed it waits at the run instead.
    const waiting = await readFeed(h.runtime, tenantId, ep.id, { after: later.nextCursor });
    expect(waiting).toMatchObject({ items: [], hasMore: false, nextCursor: later.nextCursor });
  });

  it("refuses another tenant's endpoint, a cursor it never issued and a key without a webhooks scope; webhooks:read suffices", async () => {
    const { auth } = await h.tenantWithKey();
    const ep = await h.createEndpoint(auth, 'https://pull-only.example.com/mine', ['run.finalized']);
    const stranger = await h.tenantWithKey();
    const notFound = await get(feedUrl(ep.id), stranger.auth);
    expect(notFound.statusCode).toBe(404);
    expect(notFound.body).not.toContain(ep.id.slice(4));

    const bad = await get(feedUrl(ep.id, Buffer.from('nonsense').toString('base64url')), auth);
    expect(bad.statusCode).toBe(422);
    expect(bad.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'querystring.after' }] },
    });
    expect((await get(feedUrl(ep.id, 'not a cursor!'), auth)).statusCode).toBe(400);
    expect((await get(`/v1/webhooks/${ep.id}/events?limit=0`, auth)).statusCode).toBe(400);

    // A key of the same tenant with only webhooks:read reads the feed and the endpoints, and changes nothing.
    const owner = await h.tenantWithKey();
    const own = await h.createEndpoint(owner.auth, 'https://pull-only.example.com/own', ['run.finalized']);
    const ownerId = (await h.runtime.stores.webhookEndpoints.get(own.id))!.tenantId;
    const issued = await h.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: { authorization: `Bearer ${h.env.adminKey}` },
      payload: { tenantId: ownerId, scopes: ['webhooks:read'] },
    });
    expect(issued.statusCode, issued.body).toBe(201);
    const reader = { authorization: `Bearer ${issued.json().token}` };
    expect((await get(feedUrl(own.id), reader)).statusCode).toBe(200);
    expect((await get(`/v1/webhooks/${own.id}/deliveries`, reader)).statusCode).toBe(200);
    expect(
      (await h.app.inject({ method: 'POST', url: `/v1/webhooks/${own.id}/test`, headers: reader })).statusCode,
    ).toBe(403);
    const runsOnly = await h.tenantWithKey(['runs:read']);
    expect((await get(feedUrl(ep.id), runsOnly.auth)).statusCode).toBe(403);
  });

  it('a pull endpoint (no url) is never sent to: its events are stored for the feed, signed like deliveries', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const post = (url: string, payload: Record<string, unknown>) =>
      h.app.inject({ method: 'POST', url, headers: auth, payload });
    // A push endpoint needs a url; a pull endpoint must not have one. Both refusals register nothing.
    expect((await post('/v1/webhooks', { events: ['run.finalized'] })).statusCode).toBe(422);
    expect(
      (await post('/v1/webhooks', { delivery: 'pull', url: 'https://hooks.example.com/in', events: ['run.finalized'] }))
        .statusCode,
    ).toBe(422);
    expect((await get('/v1/webhooks', auth)).json().items).toEqual([]);

    const created = await post('/v1/webhooks', { delivery: 'pull', events: ['run.finalized'] });
    expect(created.statusCode, created.body).toBe(201);
    const ep = created.json();
    expect(ep).toMatchObject({
      url: null,
      delivery: 'pull',
      status: 'active',
      secret: expect.stringMatching(/^whsec_/),
    });

    const eventId = await emit(tenantId, 'run.finalized', 'run_pulled');
    const test = await post(`/v1/webhooks/${ep.id}/test`, {});
    expect(test.statusCode, test.body).toBe(202);
    const items = (await get(feedUrl(ep.id), auth)).json().items as FeedItem[];
    expect(items.map((x) => x.eventType)).toEqual(['run.finalized', 'webhook.test']);
    expect(new Webhook(ep.secret).verify(items[0]!.body, items[0]!.headers)).toMatchObject({
      id: eventId,
      data: { runId: 'run_pulled' },
    });

    // Stored, never attempted, so nothing to resend or recover.
    const deliveries = (await get(`/v1/webhooks/${ep.id}/deliveries`, auth)).json().items as Array<{
      id?: string;
      deliveryId?: string;
      status: string;
      attempts: unknown[];
    }>;
    expect(deliveries.map((d) => [d.status, d.attempts.length])).toEqual([
      ['stored', 0],
      ['stored', 0],
    ]);
    const resend = await post(`/v1/webhooks/${ep.id}/deliveries/${items[0]!.deliveryId}/resend`, {});
    expect(resend.statusCode, resend.body).toBe(409);
    expect(resend.json().code).toBe('WEBHOOK_ENDPOINT_PULL');
    expect((await post(`/v1/webhooks/${ep.id}/recoveries`, { since: new Date(0).toISOString() })).json().code).toBe(
      'WEBHOOK_ENDPOINT_PULL',
    );
  });
});
