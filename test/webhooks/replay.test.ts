import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { emitEvent } from '../../src/services/events.ts';
import { fanOut, runRecovery } from '../../src/services/webhook-delivery.ts';
import { ensureIndexes } from '../../src/store/indexes.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, waitUntil, type Harness, type Receiver } from './harness.ts';

// Delivery replay against real receivers on 127.0.0.1: a test event, one delivery sent again, the failed ones since
// a time recovered by a job whose progress is read back, and the refusals (disabled endpoint, refused address).

describe('webhook delivery replay', () => {
  let h: Harness;
  let strict: Harness; // loopback refused, as in production
  const receivers: Receiver[] = [];
  beforeAll(async () => {
    // Retry scale 0: a failing delivery runs through its whole schedule at once and ends `failed`.
    h = await startHarness({ overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_RETRY_SCALE: '0' }, workers: true });
    strict = await startHarness({ overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'false' } });
  });
  afterAll(async () => {
    for (const r of receivers) await r.close();
    await h.close();
    await strict.close();
  });

  async function receiver(respond?: Parameters<typeof startReceiver>[0]) {
    const r = await startReceiver(respond);
    receivers.push(r);
    return r;
  }
  const call = (method: 'GET' | 'POST', url: string, auth: Record<string, string>, payload?: unknown, app = h.app) =>
    app.inject({ method, url, headers: auth, ...(payload ? { payload } : {}) });
  const delivery = (id: string) => h.runtime.stores.webhookDeliveries.get(id);

  it('a test event goes to that endpoint alone, signed like any delivery, and is listed with its deliveries', async () => {
    const { auth } = await h.tenantWithKey();
    const r = await receiver();
    const other = await receiver();
    const ep = await h.createEndpoint(auth, r.url, ['run.finalized']);
    await h.createEndpoint(auth, other.url, ['run.finalized']);
    const sent = await call('POST', `/v1/webhooks/${ep.id}/test`, auth);
    expect(sent.statusCode, sent.body).toBe(202);
    expect(sent.json()).toMatchObject({ eventType: 'webhook.test', status: 'pending' });
    const [req] = await r.waitFor(1);
    expect(req!.headers['webhook-id']).toBe(sent.json().eventId);
    expect(JSON.parse(req!.body)).toMatchObject({
      id: sent.json().eventId,
      type: 'webhook.test',
      data: { endpointId: ep.id },
    });
    await waitUntil(
      async () => (await delivery(sent.json().deliveryId))?.status === 'succeeded',
      10_000,
      'the test delivery recorded',
    );
    const listed = (await call('GET', `/v1/webhooks/${ep.id}/deliveries`, auth)).json();
    expect(listed.items.map((d: { id: string }) => d.id)).toContain(sent.json().deliveryId);
    expect(other.received).toHaveLength(0);
  });

  it('resend sends the same event id and body again as a new attempt; refused while one is due or the endpoint is disabled', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const r = await receiver();
    const ep = await h.createEndpoint(auth, r.url, ['run.finalized']);
    await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_resend' }, `run.finalized:resend:${ep.id}`);
    const [first] = await r.waitFor(1);
    const listed = (await call('GET', `/v1/webhooks/${ep.id}/deliveries`, auth)).json().items[0];
    await waitUntil(
      async () => (await delivery(listed.id))?.status === 'succeeded',
      10_000,
      'the first attempt recorded',
    );

    const resent = await call('POST', `/v1/webhooks/${ep.id}/deliveries/${listed.id}/resend`, auth);
    expect(resent.statusCode, resent.body).toBe(202);
    expect(resent.json()).toMatchObject({ id: listed.id, status: 'pending' });
    const [, second] = await r.waitFor(2);
    expect(second!.headers['webhook-id']).toBe(first!.headers['webhook-id']);
    expect(second!.body).toBe(first!.body);
    await waitUntil(async () => (await delivery(listed.id))?.attemptCount === 2, 10_000, 'the second attempt recorded');

    expect((await call('POST', `/v1/webhooks/${ep.id}/deliveries/whd_nope/resend`, auth)).statusCode).toBe(404);
    // Disabled: refused, nothing sent.
    const current = (await h.runtime.stores.webhookEndpoints.get(ep.id))!;
    await h.runtime.stores.webhookEndpoints.change(current, {
      status: 'disabled',
      disabledReason: 'test',
      disabledAt: new Date(),
    });
    const refused = await call('POST', `/v1/webhooks/${ep.id}/deliveries/${listed.id}/resend`, auth);
    expect(refused.statusCode).toBe(409);
    expect(refused.json().code).toBe('WEBHOOK_ENDPOINT_DISABLED');
    expect((await call('POST', `/v1/webhooks/${ep.id}/test`, auth)).json().code).toBe('WEBHOOK_ENDPOINT_DISABLED');
    expect((await delivery(listed.id))!.status).toBe('succeeded');
  });

  it('a resend or test to an endpoint whose address is now refused is refused with the SSRF rules of deliveries', async () => {
    const { tenantId, auth } = await strict.tenantWithKey();
    // A name (names are checked when sending): localhost resolves to loopback, which this deployment refuses.
    const ep = await strict.createEndpoint(auth, 'http://localhost:9/hook', ['run.finalized']);
    const event = await emitEvent(
      strict.runtime,
      tenantId,
      'run.finalized',
      { runId: 'run_ssrf' },
      `run.finalized:ssrf:${ep.id}`,
    );
    await fanOut(strict.runtime, { tenantId, eventId: event._id });
    const listed = (await call('GET', `/v1/webhooks/${ep.id}/deliveries`, auth, undefined, strict.app)).json().items[0];
    const d = (await strict.runtime.stores.webhookDeliveries.get(listed.id))!;
    await strict.runtime.stores.webhookDeliveries.transition(d, {
      status: 'failed',
      nextAttemptAt: null,
      lastError: 'refused',
    });

    const resend = await call(
      'POST',
      `/v1/webhooks/${ep.id}/deliveries/${listed.id}/resend`,
      auth,
      undefined,
      strict.app,
    );
    expect(resend.statusCode).toBe(422);
    expect(resend.json()).toMatchObject({
      code: 'WEBHOOK_DESTINATION_REFUSED',
      message: expect.stringMatching(/loopback/),
    });
    expect((await strict.runtime.stores.webhookDeliveries.get(listed.id))!.status).toBe('failed');
    expect((await call('POST', `/v1/webhooks/${ep.id}/test`, auth, undefined, strict.app)).statusCode).toBe(422);
    expect(
      (await call('POST', `/v1/webhooks/${ep.id}/recoveries`, auth, { since: new Date(0).toISOString() }, strict.app))
        .statusCode,
    ).toBe(422);
  });

  it('recovers every failed delivery since a time in a job whose progress reads back; a second run sends nothing again', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    let up = false;
    const r = await receiver(() => (up ? 204 : 500));
    const ep = await h.createEndpoint(auth, r.url, ['run.finalized']);
    const failedDelivery = async (n: number) => {
      await emitEvent(
        h.runtime,
        tenantId,
        'run.finalized',
        { runId: `run_${n}` },
        `run.finalized:recover:${ep.id}:${n}`,
      );
      await waitUntil(
        async () => {
          const page = (await call('GET', `/v1/webhooks/${ep.id}/deliveries?status=failed`, auth)).json();
          return page.items.length >= n;
        },
        20_000,
        `delivery ${n} failed`,
      );
    };
    await failedDelivery(1);
    await new Promise((resolve) => setTimeout(resolve, 5)); // `since` strictly after the first delivery's creation
    const since = new Date();
    await failedDelivery(2);
    await failedDelivery(3);
    up = true;
    const before = r.received.length;

    expect(
      (
        await call('POST', `/v1/webhooks/${ep.id}/recoveries`, auth, {
          since: new Date(Date.now() + 60_000).toISOString(),
        })
      ).statusCode,
    ).toBe(422);
    const asked = await call('POST', `/v1/webhooks/${ep.id}/recoveries`, auth, { since: since.toISOString() });
    expect(asked.statusCode, asked.body).toBe(202);
    const url = `/v1/webhooks/${ep.id}/recoveries/${asked.json().id}`;
    expect(asked.headers.location).toBe(url);
    await waitUntil(
      async () => {
        const p = (await call('GET', url, auth)).json();
        return p.status === 'finished' && p.counts.sent === 2;
      },
      20_000,
      'the recovery finished and both deliveries sent',
    );
    expect((await call('GET', url, auth)).json()).toMatchObject({
      status: 'finished',
      counts: { queued: 2, sent: 2, failed: 0, pending: 0 },
    });
    const resent = r.received.slice(before).map((q) => JSON.parse(q.body).data.runId);
    expect(resent.sort()).toEqual(['run_2', 'run_3']);

    // The job runs again (a redelivered job): every claimed delivery has moved on, nothing is sent twice.
    expect(await runRecovery(h.runtime, { tenantId, recoveryId: asked.json().id })).toMatchObject({ queued: 0 });
    expect(r.received.length).toBe(before + 2);
    // Another tenant cannot read it.
    const other = await h.tenantWithKey();
    expect((await call('GET', url, other.auth)).statusCode).toBe(404);
  });

  it('retention: the TTL indexes are asked for; FerretDB refuses TTL indexes and start-up goes on, saying so', async () => {
    const warned: unknown[] = [];
    await expect(
      ensureIndexes(h.runtime.db, {
        webhookRetentionDays: h.config.webhooks.retentionDays,
        logger: { warn: (...args: unknown[]) => warned.push(args) } as never,
      }),
    ).resolves.toBeUndefined();
    expect(h.config.webhooks.retentionDays).toBe(30);
    const indexes = await h.runtime.db
      .collection('webhook_deliveries')
      .indexes()
      .catch(() => []);
    const ttl = indexes.find((i) => i.name === 'retention_updatedAt');
    // On MongoDB the index exists with the retention; on FerretDB 1.24 it cannot, and the warning says so.
    if (ttl) expect(ttl.expireAfterSeconds).toBe(30 * 86_400);
    else expect(JSON.stringify(warned)).toMatch(/no TTL indexes/);
    // Index and parked entries carry the date their retention counts from.
    const entry = await h.runtime.db.collection('webhook_index').findOne({ deliveryId: { $exists: true } });
    expect(entry?.indexedAt).toBeInstanceOf(Date);
  });
});
