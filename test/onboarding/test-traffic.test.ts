// Onboarding's first paid call moves real money through a real gate, but it is test traffic: its events are marked
// `"test": true` and delivered only to webhook endpoints created with `includeTestEvents`, never to the others.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestApp } from '../helpers/context.ts';
import { onboardingTenant, startListeningApp } from './helpers.ts';

/** A loopback receiver keeping every body it is sent, per path. */
class Receiver {
  readonly bodies = new Map<string, Array<Record<string, any>>>();
  private server: Server | null = null;
  base = '';

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const list = this.bodies.get(req.url!) ?? [];
        list.push(JSON.parse(Buffer.concat(chunks).toString('utf8')));
        this.bodies.set(req.url!, list);
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.base = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  received(path: string): Array<Record<string, any>> {
    return this.bodies.get(path) ?? [];
  }

  close(): Promise<void> {
    return new Promise((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

describe('onboarding test traffic', () => {
  let t: TestApp & { baseUrl: string };
  const receiver = new Receiver();
  beforeAll(async () => {
    await receiver.start();
    t = await startListeningApp({
      workers: ['x402-verify', 'settle', 'webhook-dispatch'],
      overrides: {
        WEBHOOK_ALLOW_INSECURE_URLS: 'true',
        WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
        WEBHOOK_RETRY_SCALE: '0.001',
      },
    });
  });
  afterAll(async () => {
    await t?.close();
    await receiver.close();
  });

  it('reaches only endpoints that include test events, marked "test": true', { timeout: 60_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const key = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: tenant.tenantId, scopes: ['webhooks:write'] },
    });
    expect(key.statusCode, key.body).toBe(201);
    const auth = { authorization: `Bearer ${key.json().token}` };
    const events = ['settlement.completed', 'settlement.refunded', 'x402.gate.expired'];
    const normal = await t.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { url: `${receiver.base}/normal`, events },
    });
    expect(normal.statusCode, normal.body).toBe(201);
    expect(normal.json().includeTestEvents).toBe(false);
    const subscribed = await t.app.inject({
      method: 'POST',
      url: '/x402/webhooks/endpoints',
      headers: auth,
      payload: { url: `${receiver.base}/test`, events, includeTestEvents: true },
    });
    expect(subscribed.statusCode, subscribed.body).toBe(201);
    expect(subscribed.json().includeTestEvents).toBe(true);
    const listed = await t.app.inject({ method: 'GET', url: '/v1/webhooks', headers: auth });
    expect(
      Object.fromEntries(
        listed.json().items.map((e: { id: string; includeTestEvents: boolean }) => [e.id, e.includeTestEvents]),
      ),
    ).toEqual({ [normal.json().id]: false, [subscribed.json().id]: true });

    const paid = await t.app.inject({
      method: 'POST',
      url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call`,
      headers: tenant.headers,
      payload: {},
    });
    expect(paid.statusCode, paid.body).toBe(200);
    const { gateId, settlementId } = paid.json().ids;

    const deadline = Date.now() + 30_000;
    while (receiver.received('/test').length === 0) {
      if (Date.now() > deadline) throw new Error('the subscribed endpoint received nothing');
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(receiver.received('/test')).toEqual([
      {
        id: expect.stringMatching(/^evt_/),
        type: 'settlement.completed',
        createdAt: expect.any(String),
        test: true,
        data: { runId: null, gateId, sessionId: null, settlementId, amount: 100, holdback: 0, currency: 'USD' },
      },
    ]);
    // Deliveries are created together, one per subscribed endpoint, when the event fans out: the other has none.
    const deliveries = await t.app.inject({
      method: 'GET',
      url: `/v1/webhooks/${normal.json().id}/deliveries`,
      headers: auth,
    });
    expect(deliveries.statusCode, deliveries.body).toBe(200);
    expect(deliveries.json().items).toEqual([]);
    expect(receiver.received('/normal')).toEqual([]);
    const gate = await t.runtime.stores.x402.gates.findOne({ _id: gateId });
    expect(gate?.test).toBe(true);
  });
});
