import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';

interface Delivery {
  headers: IncomingHttpHeaders;
  body: string;
}

describe('run and settlement events reach a subscriber, signed, with the contract fields', () => {
  let t: TestApp;
  let server: Server;
  const received: Delivery[] = [];
  let url = '';
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize', 'settle', 'webhook-dispatch'],
      overrides: {
        WEBHOOK_ALLOW_INSECURE_URLS: 'true',
        WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
        WEBHOOK_RETRY_SCALE: '0.001',
      },
    });
    server = createServer((req, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        received.push({ headers: req.headers, body });
        res.statusCode = 204;
        res.end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}/hooks`;
  });
  afterAll(async () => {
    await new Promise((resolve) => server.close(resolve));
    await t.close();
  });

  it('delivers run.finalized, settlement.completed and dispute.opened from real work', async () => {
    const auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write', 'webhooks:write'])).auth;
    const hook = await t.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { url, events: ['run.finalized', 'settlement.completed', 'settlement.held', 'dispute.opened'] },
    });
    expect(hook.statusCode, hook.body).toBe(201);
    const verifier = new Webhook(hook.json().secret);

    const p = await parties(t, auth, 5_000);
    const runId = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 1_000,
      disputeWindowSeconds: 3_600,
    });
    await settle(t, auth, runId);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'completed');
    const dispute = (
      await t.app.inject({
        method: 'POST',
        url: `/v1/runs/${runId}/disputes`,
        headers: auth,
        payload: { reason: 'wrong answer' },
      })
    ).json();
    const run = (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();

    const deadline = Date.now() + 20_000;
    while (received.length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    const events = received.map((d) => {
      // A stock Standard Webhooks verifier accepts the raw body and headers as delivered.
      const payload = verifier.verify(d.body, {
        'webhook-id': String(d.headers['webhook-id']),
        'webhook-timestamp': String(d.headers['webhook-timestamp']),
        'webhook-signature': String(d.headers['webhook-signature']),
      });
      expect(d.headers['service-signature']).toBe(d.headers['webhook-signature']);
      const event = JSON.parse(d.body);
      expect(payload).toEqual(event);
      expect(Object.keys(event).sort()).toEqual(['createdAt', 'data', 'id', 'test', 'type']);
      expect(event.test, 'real work is not test traffic').toBe(false);
      expect(d.headers['webhook-id']).toBe(event.id);
      return event;
    });
    const byType = Object.fromEntries(events.map((e) => [e.type, e.data]));
    expect(byType['run.finalized']).toEqual({
      runId,
      artifactId: run.artifactId,
      verdict: 'pass',
      status: 'finalized',
    });
    expect(byType['settlement.completed']).toEqual({
      runId,
      gateId: null,
      sessionId: null,
      settlementId: s.settlementId,
      amount: 900,
      holdback: 100,
      currency: 'USD',
    });
    expect(byType['dispute.opened']).toEqual({
      disputeId: dispute.disputeId,
      runId,
      gateId: null,
      sessionId: null,
      settlementId: s.settlementId,
    });
    expect(events).toHaveLength(3);

    // The run's own deliveries (what the console's run detail shows): every event that names it, to every endpoint.
    const ofRun = await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}/deliveries`, headers: auth });
    expect(ofRun.statusCode, ofRun.body).toBe(200);
    const listed = ofRun.json().items as Array<{
      eventId: string;
      eventType: string;
      endpointId: string;
      status: string;
    }>;
    expect(listed.map((d) => d.eventType).sort()).toEqual(['dispute.opened', 'run.finalized', 'settlement.completed']);
    expect(new Set(listed.map((d) => d.endpointId))).toEqual(new Set([hook.json().id]));
    expect(listed.map((d) => d.eventId).sort()).toEqual(events.map((e) => e.id).sort());
    const stranger = (await t.tenantWithKey(['runs:read', 'webhooks:write'])).auth;
    expect(
      (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}/deliveries`, headers: stranger })).statusCode,
    ).toBe(404);
  }, 60_000);
});
