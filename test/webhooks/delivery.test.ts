import { emitEvent } from '../../src/services/events.ts';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createWebhookHandler, type WebhookHooks } from '../../examples/receiver/server.ts';
import { deliveryIdFor } from '../../src/store/webhook-deliveries.ts';
import { verifyWebhook } from '../../src/webhooks/verify.ts';
import {
  DELIVERY_OVERRIDES,
  signatureHeaders,
  startHarness,
  startReceiver,
  waitUntil,
  type Harness,
  type Receiver,
} from './harness.ts';

// Real deliveries: the app, in-process webhook-dispatch workers and HTTP receivers on 127.0.0.1, with the retry
// schedule scaled to 1/1000 (5 min -> 300 ms, 30 min -> 1.8 s).
describe('webhook delivery', () => {
  let h: Harness;
  const receivers: Receiver[] = [];
  const secrets: string[] = [];
  beforeAll(async () => {
    h = await startHarness({ overrides: DELIVERY_OVERRIDES, workers: true });
  });
  afterAll(async () => {
    for (const r of receivers) await r.close();
    await h.close();
  });

  async function receiver(respond?: Parameters<typeof startReceiver>[0], port?: number) {
    const r = await startReceiver(respond, port);
    receivers.push(r);
    return r;
  }
  async function endpoint(auth: Record<string, string>, url: string, events?: string[]) {
    const ep = await h.createEndpoint(auth, url, events);
    secrets.push(ep.secret);
    return ep;
  }
  const deliveriesOf = async (auth: Record<string, string>, endpointId: string, query = '') =>
    (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${endpointId}/deliveries${query}`, headers: auth })).json();

  it('delivers each subscribed event so that a stock Standard Webhooks verifier accepts it unchanged', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const r = await receiver();
    const ep = await endpoint(auth, r.url, ['run.finalized']);
    const event = await emitEvent(
      h.runtime,
      tenantId,
      'run.finalized',
      { runId: 'run_1', verdict: 'pass' },
      'run.finalized:run_1',
    );
    await emitEvent(h.runtime, tenantId, 'settlement.held', { runId: 'run_1' }, 'settlement.held:run_1'); // not subscribed
    const [req] = await r.waitFor(1);

    expect(req!.method).toBe('POST');
    expect(req!.headers['content-type']).toBe('application/json');
    expect(req!.headers['webhook-id']).toBe(event._id);
    expect(Number(req!.headers['webhook-timestamp'])).toBeCloseTo(Date.now() / 1000, -1);
    expect(req!.headers['service-signature']).toBe(req!.headers['webhook-signature']);
    const stored = (await h.runtime.stores.outbox.get(event._id))!;
    // The envelope: every delivery says whether it is test traffic (see test/onboarding/test-traffic.test.ts).
    expect(req!.body).toBe(
      JSON.stringify({
        id: event._id,
        type: 'run.finalized',
        createdAt: stored.createdAt.toISOString(),
        test: false,
        data: { runId: 'run_1', verdict: 'pass' },
      }),
    );

    const stock = new Webhook(ep.secret);
    expect(stock.verify(req!.body, signatureHeaders(req!))).toEqual(JSON.parse(req!.body));
    expect(verifyWebhook(req!.body, req!.headers, ep.secret).id).toBe(event._id);
    expect(() => stock.verify(req!.body.replace('pass', 'fail'), signatureHeaders(req!))).toThrow(
      /No matching signature/,
    );
    // The same delivery replayed six minutes later is refused.
    const later = vi.spyOn(Date, 'now').mockReturnValue(Date.now() + 6 * 60_000);
    try {
      expect(() => stock.verify(req!.body, signatureHeaders(req!))).toThrow(/too old/);
    } finally {
      later.mockRestore();
    }

    await waitUntil(
      async () => (await deliveriesOf(auth, ep.id)).items[0]?.status === 'succeeded',
      5_000,
      'delivery recorded',
    );
    const list = await deliveriesOf(auth, ep.id);
    expect(list.items).toHaveLength(1); // settlement.held was not subscribed
    expect(list.items[0]).toMatchObject({
      eventId: event._id,
      eventType: 'run.finalized',
      status: 'succeeded',
      attemptCount: 1,
      nextAttemptAt: null,
    });
    expect(list.items[0].attempts).toEqual([
      expect.objectContaining({
        attempt: 1,
        statusCode: 204,
        error: null,
        succeeded: true,
        durationMs: expect.any(Number),
      }),
    ]);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(r.received).toHaveLength(1);
  });

  it("signs with both secrets during a rotation's grace period, and with the new one only after it", async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const r = await receiver();
    const ep = await endpoint(auth, r.url);
    const rotated = (
      await h.app.inject({
        method: 'POST',
        url: `/v1/webhooks/${ep.id}/rotate-secret`,
        headers: auth,
        payload: { gracePeriodSeconds: 2 },
      })
    ).json();
    secrets.push(rotated.secret);

    await emitEvent(h.runtime, tenantId, 'settlement.completed', { runId: 'run_r1', amount: 100 }, 'rot:1');
    const [during] = await r.waitFor(1);
    expect(during!.headers['webhook-signature']!.toString().split(' ')).toHaveLength(2);
    expect(() => new Webhook(ep.secret).verify(during!.body, signatureHeaders(during!))).not.toThrow();
    expect(() => new Webhook(rotated.secret).verify(during!.body, signatureHeaders(during!))).not.toThrow();

    await waitUntil(() => Date.now() > Date.parse(rotated.previousSecretExpiresAt) + 50, 5_000, 'grace period end');
    await emitEvent(h.runtime, tenantId, 'settlement.completed', { runId: 'run_r2', amount: 100 }, 'rot:2');
    const after = (await r.waitFor(2))[1]!;
    expect(after.headers['webhook-signature']!.toString().split(' ')).toHaveLength(1);
    expect(() => new Webhook(rotated.secret).verify(after.body, signatureHeaders(after))).not.toThrow();
    expect(() => new Webhook(ep.secret).verify(after.body, signatureHeaders(after))).toThrow(/No matching signature/);
  });

  it('retries a failing receiver with one event id (honouring Retry-After); the example receiver processes it once', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    let processedCount = 0;
    const count = () => {
      processedCount++;
    };
    const hooks: WebhookHooks = {
      'run.finalized': count,
      'settlement.completed': count,
      'settlement.held': count,
      'dispute.opened': count,
      'dispute.resolved': count,
      x402: count,
    };
    const r = await receiver();
    const ep = await endpoint(auth, r.url);
    const handle = createWebhookHandler({ secrets: [ep.secret], hooks });
    // The example's logic sees every attempt; a proxy in front of it turns the first three answers into 500s.
    r.respond = async (req) => {
      const { status } = await handle(Buffer.from(req.body), req.headers);
      if (req.n === 1) return { status: 500, headers: { 'retry-after': '1000' } }; // 1000 s, scaled: 1 s
      return req.n <= 3 ? 500 : status;
    };
    const event = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_retry' }, 'retry:1');
    const got = await r.waitFor(4, 20_000);
    await waitUntil(
      async () => (await deliveriesOf(auth, ep.id)).items[0]?.status === 'succeeded',
      5_000,
      'delivery succeeded',
    );

    expect(got.map((g) => g.headers['webhook-id'])).toEqual([event._id, event._id, event._id, event._id]);
    expect(new Set(got.map((g) => g.body)).size).toBe(1);
    for (const g of got) expect(() => new Webhook(ep.secret).verify(g.body, signatureHeaders(g))).not.toThrow();
    expect(processedCount).toBe(1);
    expect(got[1]!.at - got[0]!.at).toBeGreaterThanOrEqual(950); // Retry-After beat the 5 ms of the schedule
    expect(got[2]!.at - got[1]!.at).toBeLessThan(got[1]!.at - got[0]!.at); // back on the schedule: 5 min scaled = 300 ms

    const [delivery] = (await deliveriesOf(auth, ep.id)).items;
    expect(delivery).toMatchObject({ status: 'succeeded', attemptCount: 4, nextAttemptAt: null, lastError: null });
    expect(delivery.attempts.map((a: { statusCode: number }) => a.statusCode)).toEqual([500, 500, 500, 204]);
    expect(delivery.attempts[0]).toMatchObject({ succeeded: false, error: 'receiver answered HTTP 500' });
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(r.received).toHaveLength(4);
  });

  it('disables an endpoint whose receiver answers 410, and replays its deliveries when re-enabled', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const r = await receiver(() => 410);
    const ep = await endpoint(auth, r.url);
    const first = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_gone' }, 'gone:1');
    await r.waitFor(1);
    await waitUntil(
      async () =>
        (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}`, headers: auth })).json().status ===
        'disabled',
      5_000,
      'endpoint disabled',
    );
    const disabled = (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}`, headers: auth })).json();
    expect(disabled.disabledReason).toMatch(/410/);
    const second = await emitEvent(h.runtime, tenantId, 'settlement.completed', { runId: 'run_gone' }, 'gone:2');
    await waitUntil(
      async () => (await deliveriesOf(auth, ep.id)).items.length === 2,
      5_000,
      'second delivery recorded',
    );
    const abandoned = (await deliveriesOf(auth, ep.id)).items;
    expect(abandoned.map((d: { status: string }) => d.status)).toEqual(['abandoned', 'abandoned']);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(r.received).toHaveLength(1); // nothing more went out while disabled

    r.respond = () => 204;
    const enabled = await h.app.inject({ method: 'POST', url: `/v1/webhooks/${ep.id}/enable`, headers: auth });
    expect(enabled.statusCode).toBe(200);
    expect(enabled.json()).toMatchObject({ status: 'active', disabledReason: null, replayed: 2 });
    const got = await r.waitFor(3);
    expect(
      got
        .slice(1)
        .map((g) => g.headers['webhook-id'])
        .sort(),
    ).toEqual([first._id, second._id].sort());
    await waitUntil(
      async () => (await deliveriesOf(auth, ep.id, '?status=succeeded')).items.length === 2,
      5_000,
      'replays succeeded',
    );
    // Paged one at a time, newest first: both deliveries, no repeats, then no cursor.
    const page1 = await deliveriesOf(auth, ep.id, '?limit=1');
    const page2 = await deliveriesOf(auth, ep.id, `?limit=1&cursor=${page1.nextCursor}`);
    expect([...page1.items, ...page2.items].map((d: { eventId: string }) => d.eventId)).toEqual([
      second._id,
      first._id,
    ]);
    expect(page2.nextCursor).toBeNull(); // nothing older
    expect(page2.items[0].attempts.map((a: { statusCode: number }) => a.statusCode)).toEqual([410, 204]);
  });

  it('stops delivering to a deleted endpoint: a pending retry is cancelled when it comes due and new events skip it', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const r = await receiver(() => ({ status: 503, headers: { 'retry-after': '1500' } })); // 1.5 s at this scale
    const ep = await endpoint(auth, r.url);
    const event = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_del' }, 'deleted:1');
    await r.waitFor(1);
    const deliveries = h.runtime.stores.webhookDeliveries;
    const id = deliveryIdFor(event._id, ep.id);
    await waitUntil(async () => (await deliveries.get(id))?.attemptCount === 1, 5_000, 'first attempt recorded');
    expect((await h.app.inject({ method: 'DELETE', url: `/v1/webhooks/${ep.id}`, headers: auth })).statusCode).toBe(
      204,
    );
    // What a stale writer can do: put back the endpoint's cached document as it was before the deletion. The
    // deletion is an inserted revision, so it holds all the same.
    const endpoints = h.runtime.stores.webhookEndpoints.log;
    const deleted = (await endpoints.get(ep.id))!;
    await endpoints.docs.replaceOne(
      { _id: ep.id },
      { ...deleted, rev: deleted.rev - 1, status: 'active', revokedAt: null },
    );
    expect((await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}`, headers: auth })).statusCode).toBe(404);
    await waitUntil(
      async () => (await deliveries.get(id))?.status === 'cancelled',
      5_000,
      'the retry to be cancelled',
      200,
    );
    expect(await deliveries.get(id)).toMatchObject({
      status: 'cancelled',
      nextAttemptAt: null,
      lastError: 'endpoint deleted',
      attemptCount: 1,
    });
    const later = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_del2' }, 'deleted:2');
    await waitUntil(async () => Boolean((await h.runtime.stores.outbox.get(later._id))?.fannedOutAt), 5_000, 'fan-out');
    expect(await deliveries.get(deliveryIdFor(later._id, ep.id))).toBeNull();
    expect(r.received).toHaveLength(1);
  });

  it('never wrote a secret to the logs while delivering', () => {
    expect(secrets.length).toBeGreaterThan(4);
    const logs = h.logs();
    expect(logs).toContain('webhook delivered');
    for (const secret of secrets) expect(logs).not.toContain(secret.slice('whsec_'.length));
  });
});
