import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';
import { RedisInstance } from '../helpers/redis-instance.ts';
import { gateParties, post as postAs, X402_SCOPES } from '../x402/helpers.ts';

describe('Redis outage (a private Redis instance, stopped and restarted)', () => {
  let redis: RedisInstance;
  let t: TestApp;
  beforeAll(async () => {
    redis = await RedisInstance.start();
    t = await startTestApp({ env: testEnv({ REDIS_URL: redis.url }) });
  });
  afterAll(async () => {
    await redis.up().catch(() => undefined);
    await t.close();
    await redis.down();
  });

  /** Until the service is ready again after Redis came back (it recovers by itself, within seconds). */
  async function waitReady() {
    const deadline = Date.now() + 10_000;
    let recovered = false;
    while (Date.now() < deadline && !recovered) {
      recovered = (await t.app.inject({ method: 'GET', url: '/readyz' })).statusCode === 200;
      if (!recovered) await new Promise((r) => setTimeout(r, 100));
    }
    expect(recovered).toBe(true);
  }

  const post = () =>
    t.app.inject({
      method: 'POST',
      url: '/ops/tenants',
      headers: { ...t.admin, 'idempotency-key': `k-${Math.random()}` },
      payload: { name: 'outage' },
    });

  it('answers 503 to a paid session call while Redis is down; it charged nothing, and its retry charges once', async () => {
    const { auth } = await t.tenantWithKey([...X402_SCOPES]);
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const opened = await postAs(
      t,
      auth,
      '/x402/sessions',
      { currency: 'USD', payerAgentId: payer, payeeAgentIds: [payee], budget: 500, maxPerCall: 10 },
      { 'idempotency-key': `open-${payer}` },
    );
    expect(opened.statusCode, opened.body).toBe(201);
    const { sessionId } = opened.json() as { sessionId: string };
    const charge = (n: number) =>
      postAs(t, auth, `/x402/sessions/${sessionId}/charges`, {
        paymentId: `pay-${n}`,
        payeeAgentId: payee,
        amount: 10,
      });
    for (let n = 0; n < 4; n++) expect((await charge(n)).statusCode).toBe(201);
    await redis.down();
    const refused = await charge(4);
    expect(refused.statusCode, refused.body).toBe(503);
    expect(refused.json()).toMatchObject({ code: 'UNAVAILABLE' });
    await redis.up();
    await waitReady();
    // The refused call charged nothing: the same payment id now charges once, and the budget shows five calls.
    const retried = await charge(4);
    expect(retried.statusCode, retried.body).toBe(201);
    expect(retried.json()).toMatchObject({ amount: 10, remaining: 450, repeated: false });
  });

  it('answers 503 UNAVAILABLE fast while Redis is down, and recovers by itself when it returns', async () => {
    expect((await post()).statusCode).toBe(201);
    await redis.down();

    const started = performance.now();
    const res = await post();
    const elapsed = performance.now() - started;
    expect(res.statusCode).toBe(503);
    expect(res.json()).toMatchObject({ code: 'UNAVAILABLE', requestId: expect.any(String) });
    expect(res.headers['retry-after']).toBe('1');
    expect(elapsed).toBeLessThan(1_000);

    const readyStarted = performance.now();
    const ready = await t.app.inject({ method: 'GET', url: '/readyz' });
    expect(performance.now() - readyStarted).toBeLessThan(1_000);
    expect(ready.statusCode).toBe(503);
    expect(ready.json()).toEqual({ status: 'unavailable', checks: { redis: false, mongo: true } });
    expect((await t.app.inject({ method: 'GET', url: '/healthz' })).statusCode).toBe(200);

    await redis.up();
    await waitReady();
    expect((await post()).statusCode).toBe(201);
  });
});
