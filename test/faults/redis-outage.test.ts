import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { outageScenario } from './outage.ts';
import { RedisServer } from './servers.ts';
import type { ServiceProcess } from './service.ts';

describe('Redis hangs, then is stopped for 10 s and restarted (a Redis of this test only)', () => {
  let redis: RedisServer;
  const processes: ServiceProcess[] = [];
  beforeAll(async () => {
    // As production runs it (scripts/services.sh): AOF on, so a restart keeps the queues.
    redis = await RedisServer.start(['--appendonly', 'yes', '--appendfsync', 'everysec']);
  });
  afterAll(async () => {
    for (const p of processes) await p.stop().catch(() => undefined);
    await redis.destroy();
  });

  it('answers 503 within 1 s throughout, recovers within 5 s, and finishes every run exactly once', async () => {
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_redis_${randomBytes(4).toString('hex')}`;
    const figures = await outageScenario(
      {
        name: 'redis',
        mongoUrl: mongoUrl.toString(),
        redisUrl: redis.url,
        freeze: () => redis.freeze(),
        thaw: () => redis.thaw(),
        down: () => redis.down(),
        up: () => redis.up(),
      },
      processes,
    );
    console.log(`fault figures: ${JSON.stringify(figures)}`);
    expect(figures.recoveryMs).toBeLessThan(5_000);
  });
});
