import { emitEvent } from '../../src/services/events.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deliveryIdFor } from '../../src/store/webhook-deliveries.ts';
import { sendWebhook, type Resolver } from '../../src/webhooks/send.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, waitUntil, type Harness, type Receiver } from './harness.ts';

describe('outbound requests (SSRF guard)', () => {
  let r: Receiver;
  beforeAll(async () => {
    r = await startReceiver((req) =>
      req.url === '/redirect'
        ? { status: 302, headers: { location: '/elsewhere' } }
        : req.url === '/slow'
          ? 'hold'
          : 204,
    );
  });
  afterAll(() => r.close());

  const body = '{"id":"evt_x","type":"run.finalized","createdAt":"2025-01-01T00:00:00.000Z","data":{}}';
  const headers = {
    'webhook-id': 'evt_x',
    'webhook-timestamp': '1',
    'webhook-signature': 'v1,x',
    'service-signature': 'v1,x',
  };

  it('connects to the address it checked, not to a second DNS answer (rebinding)', async () => {
    let calls = 0;
    // First answer passes the check; any later lookup would point somewhere nothing listens.
    const rebinding: Resolver = async () => [{ address: calls++ === 0 ? '127.0.0.1' : '127.0.0.2', family: 4 }];
    const before = r.received.length;
    const result = await sendWebhook(`http://rebind.test:${r.port}/hook`, body, headers, {
      timeoutMs: 2_000,
      allowPrivateAddresses: true,
      resolver: rebinding,
    });
    expect(result).toMatchObject({ ok: true, statusCode: 204, address: '127.0.0.1' });
    expect(calls).toBe(1);
    expect(r.received[before]!.headers.host).toBe(`rebind.test:${r.port}`);
  });

  it('refuses a name when any of its addresses is private, before connecting', async () => {
    let calls = 0;
    const mixed: Resolver = async () => {
      calls++;
      return [
        { address: '93.184.216.34', family: 4 },
        { address: '10.0.0.7', family: 4 },
      ];
    };
    const result = await sendWebhook('https://hooks.example.com/in', body, headers, {
      timeoutMs: 2_000,
      allowPrivateAddresses: false,
      resolver: mixed,
    });
    expect(result).toMatchObject({ ok: false, refused: true, statusCode: null });
    expect(!result.ok && result.error).toBe(
      'refused: hooks.example.com resolves to 10.0.0.7, which is a private address (private destinations are not allowed)',
    );
    expect(calls).toBe(1);
  });

  it('refuses loopback, link-local, CGNAT and unique-local literals; metadata even when private addresses are allowed', async () => {
    const before = r.received.length;
    for (const url of [
      `http://127.0.0.1:${r.port}/hook`,
      `http://[::1]:${r.port}/hook`,
      'http://169.254.10.10/',
      'http://100.64.0.1/',
      'http://[fd00::1]/',
      'http://0.0.0.0/',
    ]) {
      const result = await sendWebhook(url, body, headers, { timeoutMs: 2_000, allowPrivateAddresses: false });
      expect(result, url).toMatchObject({ ok: false, refused: true });
    }
    for (const url of ['http://169.254.169.254/latest/meta-data', 'http://[fd00:ec2::254]/']) {
      const result = await sendWebhook(url, body, headers, { timeoutMs: 2_000, allowPrivateAddresses: true });
      expect(!result.ok && result.error, url).toMatch(/is a metadata address/);
    }
    expect(r.received.length).toBe(before);
  });

  it('does not follow redirects and gives up at the timeout', async () => {
    const before = r.received.length;
    const redirected = await sendWebhook(`http://127.0.0.1:${r.port}/redirect`, body, headers, {
      timeoutMs: 2_000,
      allowPrivateAddresses: true,
    });
    expect(redirected).toMatchObject({
      ok: false,
      statusCode: 302,
      error: 'receiver answered HTTP 302 (redirects are not followed)',
    });
    expect(r.received.slice(before).map((q) => q.url)).toEqual(['/redirect']);

    const slow = await sendWebhook(`http://127.0.0.1:${r.port}/slow`, body, headers, {
      timeoutMs: 300,
      allowPrivateAddresses: true,
    });
    expect(slow).toMatchObject({ ok: false, statusCode: null, error: 'timed out after 300 ms' });
    expect(slow.durationMs).toBeGreaterThanOrEqual(290);
    expect(slow.durationMs).toBeLessThan(1_500);
  });
});

describe('deliveries to private addresses when the configuration does not allow them', () => {
  let h: Harness;
  let r: Receiver;
  beforeAll(async () => {
    h = await startHarness({
      overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'false' },
      workers: true,
    });
    r = await startReceiver();
  });
  afterAll(async () => {
    await r.close();
    await h.close();
  });

  it('refuses to register an address literal, and records a refused attempt for a name that resolves to loopback', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const literal = await h.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { url: `http://127.0.0.1:${r.port}/hook`, events: ['run.finalized'] },
    });
    expect(literal.statusCode).toBe(422);
    expect(literal.json().message).toMatch(/loopback/);
    // It says which setting allows it (a local receiver in development needs it).
    expect(literal.json().details.errors[0].message).toMatch(/WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true/);

    const ep = await h.createEndpoint(auth, `http://localhost:${r.port}/hook`);
    const event = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_ssrf' }, 'ssrf:1');
    const attempts = h.runtime.db.collection('webhook_attempts');
    const id = deliveryIdFor(event._id, ep.id);
    await waitUntil(async () => (await attempts.countDocuments({ deliveryId: id })) >= 2, 5_000, 'refused attempts');
    const list = (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}/deliveries`, headers: auth })).json();
    expect(list.items[0].status).toBe('pending'); // refused attempts are failures, retried on the schedule
    expect(list.items[0].attempts[0]).toMatchObject({
      statusCode: null,
      succeeded: false,
      error: expect.stringMatching(/^refused: localhost resolves to (127\.0\.0\.1|::1), which is a loopback address/),
    });
    expect(r.received).toHaveLength(0);
  });
});
