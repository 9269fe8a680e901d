import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';
import { RedisInstance } from '../helpers/redis-instance.ts';

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

  const post = () =>
    t.app.inject({ method: 'POST', url: '/ops/tenants', headers: { ...t.admin, 'idempotency-key': `k-${Math.random()}` }, payload: { name: 'outage' } });

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
    const deadline = Date.now() + 10_000;
    let recovered = false;
    while (Date.now() < deadline && !recovered) {
      recovered = (await t.app.inject({ method: 'GET', url: '/readyz' })).statusCode === 200;
      if (!recovered) await new Promise((r) => setTimeout(r, 100));
    }
    expect(recovered).toBe(true);
    expect((await post()).statusCode).toBe(201);
  });
});
