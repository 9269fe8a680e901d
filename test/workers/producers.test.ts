import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { Producers } from '../../src/queues/index.ts';
import { freePort } from '../helpers/redis-instance.ts';

describe('enqueueing while Redis cannot take the job', () => {
  const causes: string[] = [];
  let redis: Redis;
  let producers: Producers;
  afterAll(async () => {
    await producers.close().catch(() => undefined);
    redis.disconnect();
  });

  it('answers 503 UNAVAILABLE within the enqueue deadline and tells the operator why', async () => {
    // Nothing listens on this port: the client keeps retrying, and the enqueue must not wait for it.
    redis = new Redis({ host: '127.0.0.1', port: await freePort(), lazyConnect: true, maxRetriesPerRequest: null, retryStrategy: () => 200 });
    redis.on('error', () => undefined);
    producers = new Producers(redis, 'unreachable', false, (cause) => causes.push(cause));
    const started = Date.now();
    const failure = await producers.enqueue('smoke-test', { tenantId: 'ten_x', smokeTestId: 'smk_1' }, 'smoke-test__smk_1').catch((err: unknown) => err);
    expect(failure).toMatchObject({ status: 503, code: 'UNAVAILABLE' });
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(causes).toEqual(['no answer within 1000 ms']);
  });
});
