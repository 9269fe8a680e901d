// The credential cache's invalidation subscriber is one of the process's Redis connections: while Redis is away its
// failed attempts count into the process's Redis outage (one line when it goes, one when it is back, with the
// count), never a line each, and a cache started while Redis is down goes live by itself once Redis is back.
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DependencyOutages } from '../../src/outages.ts';
import { CredentialCache } from '../../src/store/credentials.ts';
import { RedisInstance } from '../helpers/redis-instance.ts';

async function until(check: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('credential cache subscriber during a Redis outage (a private Redis instance)', () => {
  let redis: RedisInstance;
  let publisher: Redis;
  let cache: CredentialCache;
  const lines: Array<Record<string, any>> = [];
  // The outage log and the cache write to one log, as in a process: every line either writes is here.
  const logger = pino(
    { level: 'info' },
    new Writable({
      write(chunk, _enc, done) {
        for (const line of String(chunk).split('\n').filter(Boolean)) lines.push(JSON.parse(line));
        done();
      },
    }),
  );
  const outages = new DependencyOutages(logger);

  beforeAll(async () => {
    redis = await RedisInstance.start();
    await redis.down();
    publisher = new Redis(redis.url, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1 });
    cache = new CredentialCache(publisher, redis.url, `cc${randomBytes(4).toString('hex')}`, logger, outages);
  });
  afterAll(async () => {
    await cache?.close();
    publisher?.disconnect();
    await redis?.down();
  });

  it('started with Redis down: one line down, one up counting the attempts, and caching once it is back', async () => {
    await cache.start();
    expect(cache.isLive(), 'nothing is served from memory without the invalidation channel').toBe(false);
    expect(outages.isDown('redis'), 'the failed subscriber opened the Redis outage').toBe(true);
    // Give it several reconnect attempts (every 200-2000 ms), none of which may write a line of its own.
    await new Promise((r) => setTimeout(r, 1_500));
    expect(lines.map((l) => l.msg)).toEqual(['redis unreachable']);

    await redis.up();
    await until(() => cache.isLive(), 'the cache to go live');
    await until(() => !outages.isDown('redis'), 'the outage to end');
    expect(lines.map((l) => [l.dependency, l.state])).toEqual([
      ['redis', 'down'],
      ['redis', 'up'],
    ]);
    expect(lines[1]!.failures, "the subscriber's failed attempts, counted").toBeGreaterThanOrEqual(2);
  });

  it('a later outage: dark while Redis is away, one line each way, live again by itself', async () => {
    expect(cache.isLive()).toBe(true);
    await redis.down();
    await until(() => !cache.isLive() && outages.isDown('redis'), 'the cache to go dark and the outage to open');
    await new Promise((r) => setTimeout(r, 1_500));
    await redis.up();
    await until(() => cache.isLive() && !outages.isDown('redis'), 'the cache to go live and the outage to end');
    expect(lines.map((l) => [l.dependency, l.state])).toEqual([
      ['redis', 'down'],
      ['redis', 'up'],
      ['redis', 'down'],
      ['redis', 'up'],
    ]);
    expect(lines[3]!.failures).toBeGreaterThanOrEqual(1);
  });
});
