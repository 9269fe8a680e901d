import { randomBytes } from 'node:crypto';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { LeasedLimiter } from '../../src/http/rate-leases.ts';
import { createRedisClient } from '../../src/redis.ts';

// Two LeasedLimiters on one Redis key stand for two API processes serving one credential.
describe('rate-limit leases (real Redis)', () => {
  const redis = createRedisClient(inject('redisUrl'), {});
  afterAll(() => redis.disconnect());

  /** Two processes' limiters on one budget, with the Redis draws each one sends counted. */
  function processes(points: number, windowSeconds = 30) {
    const keyPrefix = `tleases${randomBytes(5).toString('hex')}`;
    const draws = [0, 0];
    const limiters = [0, 1].map((i) => {
      const counter = new RateLimiterRedis({ storeClient: redis, keyPrefix, points, duration: windowSeconds });
      const consume = counter.consume.bind(counter);
      counter.consume = (key, n) => {
        draws[i]! += 1;
        return consume(key, n);
      };
      return new LeasedLimiter(counter, points, () => redis.status === 'ready');
    });
    return { limiters, draws, counted: async (subject: string) => Number(await redis.get(`${keyPrefix}:${subject}`)) };
  }

  it('a fast caller costs Redis a draw per lease, not per request, and gets its whole budget', async () => {
    const { limiters, draws } = processes(1_000); // leases of up to 10
    const answers = [];
    for (let i = 0; i < 1_000; i++) answers.push(await limiters[0]!.draw('key'));
    expect(answers.every((a) => a.allowed)).toBe(true);
    expect(draws[0]).toBeLessThan(120);
    expect(answers.map((a) => a.remaining)).toEqual(Array.from({ length: 1_000 }, (_, i) => 999 - i));
    const over = await limiters[0]!.draw('key');
    expect(over).toMatchObject({ allowed: false, remaining: 0 });
    expect(over.msBeforeNext).toBeGreaterThan(0);
    expect(over.msBeforeNext).toBeLessThanOrEqual(30_000);
  });

  it('two processes drawing at once never let through more than the budget, and fall short by at most their leases', async () => {
    const { limiters, counted } = processes(1_000);
    const maxLease = limiters[0]!.maxLease;
    expect(maxLease).toBe(10);
    const results = await Promise.all(Array.from({ length: 1_400 }, (_, i) => limiters[i % 2]!.draw('key')));
    const allowed = results.filter((r) => r.allowed).length;
    expect(allowed).toBeLessThanOrEqual(1_000);
    expect(allowed).toBeGreaterThanOrEqual(1_000 - 2 * (maxLease - 1));
    expect(await counted('key')).toBeGreaterThanOrEqual(1_000); // every point handed out was counted in Redis
  });

  it('a budget under 200 is drawn a point at a time, exactly, across processes', async () => {
    const { limiters, draws } = processes(150);
    expect(limiters[0]!.maxLease).toBe(1);
    const results = await Promise.all(Array.from({ length: 200 }, (_, i) => limiters[i % 2]!.draw('key')));
    expect(results.filter((r) => r.allowed).length).toBe(150);
    expect(draws[0]! + draws[1]!).toBeGreaterThanOrEqual(150);
  });

  it('sees within a second what others spent: a lease and a remembered refusal last at most that long', async () => {
    const { limiters } = processes(1_000, 60);
    for (let i = 0; i < 40; i++) expect((await limiters[0]!.draw('key')).allowed).toBe(true);
    // Another process spends the rest of the budget.
    for (let spent = 0; spent < 1_000; ) {
      const r = await limiters[1]!.draw('key');
      if (!r.allowed) break;
      spent++;
    }
    await new Promise((r) => setTimeout(r, 1_050));
    expect(await limiters[0]!.draw('key')).toMatchObject({ allowed: false, remaining: 0 });
  });

  it('budgets are per subject', async () => {
    const { limiters } = processes(200);
    for (let i = 0; i < 200; i++) expect((await limiters[0]!.draw('a')).allowed).toBe(true);
    expect((await limiters[0]!.draw('a')).allowed).toBe(false);
    expect(await limiters[0]!.draw('b')).toMatchObject({ allowed: true, remaining: 199 });
  });
});
