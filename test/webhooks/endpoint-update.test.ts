import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { emitEvent } from '../../src/services/events.ts';
import {
  DELIVERY_OVERRIDES,
  signatureHeaders,
  startHarness,
  startReceiver,
  waitUntil,
  type Harness,
  type Receiver,
} from './harness.ts';

// PATCH /v1/webhooks/{id}: an endpoint's URL, events and description change in place. It keeps its id, its secret
// and its delivery history; a URL goes through the checks of registration (SSRF rules included); an attempt in flight
// to the old URL finishes there and is listed with the URL it went to, the next one goes to the new URL.

describe('webhook endpoint update', () => {
  let h: Harness;
  let strict: Harness; // private and loopback addresses refused, as in production
  const receivers: Receiver[] = [];
  beforeAll(async () => {
    h = await startHarness({ overrides: DELIVERY_OVERRIDES, workers: true });
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
  const patch = (id: string, auth: Record<string, string>, payload: unknown, app = h.app) =>
    app.inject({ method: 'PATCH', url: `/v1/webhooks/${id}`, headers: auth, payload: payload as object });
  const get = (url: string, auth: Record<string, string>, app = h.app) =>
    app.inject({ method: 'GET', url, headers: auth });

  it('changes URL, events and description in place: same id and secret, history kept, later events to the new URL', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const oldReceiver = await receiver();
    const newReceiver = await receiver();
    const ep = await h.createEndpoint(auth, oldReceiver.url, ['run.finalized']);
    await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_before' }, `upd:1:${ep.id}`);
    await oldReceiver.waitFor(1);

    const updated = await patch(ep.id, auth, {
      url: newReceiver.url,
      events: ['run.finalized', 'settlement.completed'],
      description: 'billing v2',
    });
    expect(updated.statusCode, updated.body).toBe(200);
    expect(updated.json()).toMatchObject({
      id: ep.id,
      url: newReceiver.url,
      events: ['run.finalized', 'settlement.completed'],
      description: 'billing v2',
      status: 'active',
    });
    expect(updated.json()).not.toHaveProperty('secret');
    expect((await get(`/v1/webhooks/${ep.id}`, auth)).json()).toMatchObject({ url: newReceiver.url });

    await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_after' }, `upd:2:${ep.id}`);
    await emitEvent(h.runtime, tenantId, 'settlement.completed', { runId: 'run_after' }, `upd:3:${ep.id}`);
    const got = await newReceiver.waitFor(2);
    expect(got.map((q) => JSON.parse(q.body).type).sort()).toEqual(['run.finalized', 'settlement.completed']);
    expect(oldReceiver.received).toHaveLength(1);
    // Signed with the secret shown at registration: the endpoint kept it.
    for (const q of got) expect(() => new Webhook(ep.secret).verify(q.body, signatureHeaders(q))).not.toThrow();

    // History: the delivery made before the change is still listed, its attempt with the URL it went to.
    let items: Array<{ eventType: string; status: string; attempts: Array<{ url: string | null }> }> = [];
    await waitUntil(
      async () => {
        items = (await get(`/v1/webhooks/${ep.id}/deliveries`, auth)).json().items;
        return items.length === 3 && items.every((d) => d.status === 'succeeded');
      },
      15_000,
      'three deliveries recorded',
    );
    expect(items.map((d) => d.attempts[0]!.url)).toEqual([newReceiver.url, newReceiver.url, oldReceiver.url]);

    // Clearing the description, and a PATCH that changes nothing, answer the endpoint as it is.
    expect((await patch(ep.id, auth, { description: null })).json()).toMatchObject({ description: null });
    const same = await patch(ep.id, auth, { events: ['settlement.completed', 'run.finalized'] });
    expect(same.statusCode).toBe(200);
    expect(same.json().updatedAt).toBe((await get(`/v1/webhooks/${ep.id}`, auth)).json().updatedAt);
  });

  it('an attempt in flight to the old URL finishes there and is recorded so; the retry goes to the new URL', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const oldReceiver = await receiver(() => 'hold');
    const newReceiver = await receiver();
    const ep = await h.createEndpoint(auth, oldReceiver.url, ['run.finalized']);
    await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_inflight' }, `upd:inflight:${ep.id}`);
    await oldReceiver.waitFor(1);
    expect((await patch(ep.id, auth, { url: newReceiver.url })).statusCode).toBe(200);
    oldReceiver.held.shift()!.writeHead(500).end();
    // The failed attempt is retried on the schedule (scaled down here), now at the new URL.
    await newReceiver.waitFor(1);
    const [d] = (await get(`/v1/webhooks/${ep.id}/deliveries`, auth)).json().items;
    await waitUntil(
      async () => (await h.runtime.stores.webhookDeliveries.get(d.id))?.status === 'succeeded',
      15_000,
      'the retry recorded',
    );
    const listed = (await get(`/v1/webhooks/${ep.id}/deliveries`, auth)).json().items[0];
    expect(listed.attempts.map((a: { url: string; statusCode: number }) => [a.url, a.statusCode])).toEqual([
      [oldReceiver.url, 500],
      [newReceiver.url, 204],
    ]);
    expect(newReceiver.received[0]!.headers['webhook-id']).toBe(oldReceiver.received[0]!.headers['webhook-id']);
  });

  it('refuses a URL the SSRF rules refuse, as registration does, and changes nothing', async () => {
    const { auth } = await strict.tenantWithKey();
    const ep = await strict.createEndpoint(auth, 'https://hooks.example.com/in', ['run.finalized']);
    for (const url of [
      'https://127.0.0.1/hook',
      'https://10.1.2.3/hook',
      'https://169.254.169.254/latest/meta-data',
      'https://[::1]/hook',
      'https://user:pw@hooks.example.com/in',
      'ftp://hooks.example.com/in',
    ]) {
      const res = await patch(ep.id, auth, { url }, strict.app);
      expect(res.statusCode, `${url}: ${res.body}`).toBe(422);
      expect(res.json()).toMatchObject({
        code: 'VALIDATION_FAILED',
        details: { errors: [expect.objectContaining({ path: 'body.url' })] },
      });
    }
    const unknown = await patch(ep.id, auth, { events: ['run.nope'] }, strict.app);
    expect(unknown.statusCode).toBe(422);
    expect(unknown.json().details.unknownEventTypes).toEqual(['run.nope']);
    const after = (await get(`/v1/webhooks/${ep.id}`, auth, strict.app)).json();
    expect(after).toMatchObject({ url: 'https://hooks.example.com/in', events: ['run.finalized'] });
  });

  it('refuses an empty or unknown change, a pull endpoint URL, another tenant and a read-only key', async () => {
    const { auth } = await h.tenantWithKey();
    const ep = await h.createEndpoint(auth, 'http://127.0.0.1:9/hook', ['run.finalized']);
    expect((await patch(ep.id, auth, {})).statusCode).toBe(400);
    expect((await patch(ep.id, auth, { secret: 'whsec_x' })).statusCode).toBe(400);
    expect((await patch(ep.id, auth, { status: 'active' })).statusCode).toBe(400);
    const pull = await h.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { delivery: 'pull', events: ['run.finalized'] },
    });
    const pulled = await patch(pull.json().id, auth, { url: 'http://127.0.0.1:9/hook' });
    expect(pulled.statusCode).toBe(422);
    expect((await patch(pull.json().id, auth, { events: ['settlement.completed'] })).json()).toMatchObject({
      delivery: 'pull',
      url: null,
      events: ['settlement.completed'],
    });
    const other = await h.tenantWithKey();
    expect((await patch(ep.id, other.auth, { description: 'mine' })).statusCode).toBe(404);
    const reader = await h.tenantWithKey(['webhooks:read']);
    expect((await patch(ep.id, reader.auth, { description: 'x' })).statusCode).toBe(403);
    expect((await get(`/v1/webhooks/${ep.id}`, auth)).json().description).toBeNull();
  });
});
