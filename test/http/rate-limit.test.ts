import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';

describe('rate limits (Redis, shared by every API process)', () => {
  let a: TestApp;
  let b: TestApp;
  beforeAll(async () => {
    const env = testEnv({ RATE_LIMIT_MAX: '6', RATE_LIMIT_WINDOW_SECONDS: '30' });
    a = await startTestApp({ env });
    b = await startTestApp({ env, dropOnClose: false });
  });
  afterAll(async () => {
    await b.close();
    await a.close();
  });

  it('draws two app instances from one budget and answers 429 with Retry-After and RateLimit headers', async () => {
    const statuses: number[] = [];
    let last;
    for (let i = 0; i < 8; i++) {
      last = await (i % 2 === 0 ? a : b).app.inject({ method: 'GET', url: '/ops/tenants', headers: a.admin });
      statuses.push(last.statusCode);
      expect(last.headers['ratelimit-policy']).toBe('"default";q=6;w=30');
    }
    expect(statuses).toEqual([200, 200, 200, 200, 200, 200, 429, 429]);
    expect(last!.json()).toMatchObject({ code: 'RATE_LIMITED' });
    const retryAfter = Number(last!.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(30);
    expect(last!.headers['ratelimit']).toBe(`"default";r=0;t=${retryAfter}`);
  });

  it('counts remaining requests in the RateLimit header and keeps budgets per credential', async () => {
    // The admin budget is spent by the test above; set up through the stores so this key starts fresh.
    const tenant = await a.runtime.stores.tenants.create({ name: 'fresh' });
    const { token } = await a.runtime.stores.apiKeys.issue({ tenantId: tenant._id, scopes: ['ops'] });
    const first = await a.app.inject({
      method: 'GET',
      url: '/ops/tenants',
      headers: { authorization: `Bearer ${token}` },
    });
    expect(first.statusCode).toBe(200);
    expect(first.headers['ratelimit']).toMatch(/^"default";r=5;t=\d+$/);
  });

  it('applies a tenant override of the limit to every key of that tenant', async () => {
    const tenant = await a.runtime.stores.tenants.create({ name: 'small', rateLimit: { limit: 2, windowSeconds: 60 } });
    const keys = await Promise.all(
      [1, 2].map(() => a.runtime.stores.apiKeys.issue({ tenantId: tenant._id, scopes: ['ops'] })),
    );
    const call = (token: string) =>
      b.app.inject({ method: 'GET', url: '/ops/tenants', headers: { authorization: `Bearer ${token}` } });
    const first = await call(keys[0]!.token);
    expect(first.headers['ratelimit-policy']).toBe('"default";q=2;w=60');
    expect((await call(keys[0]!.token)).statusCode).toBe(200);
    expect((await call(keys[0]!.token)).statusCode).toBe(429);
    expect((await call(keys[1]!.token)).statusCode).toBe(200); // each key has its own budget under the tenant's policy
  });

  it('does not limit health probes', async () => {
    for (let i = 0; i < 10; i++) {
      expect((await a.app.inject({ method: 'GET', url: '/healthz' })).statusCode).toBe(200);
    }
  });
});
