import { randomBytes } from 'node:crypto';
import { Worker, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { bullPrefix, Producers } from '../../src/queues/index.ts';
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
    redis = new Redis({
      host: '127.0.0.1',
      port: await freePort(),
      lazyConnect: true,
      maxRetriesPerRequest: null,
      retryStrategy: () => 200,
    });
    redis.on('error', () => undefined);
    producers = new Producers(redis, 'unreachable', false, (cause) => causes.push(cause));
    const started = Date.now();
    const failure = await producers
      .enqueue('smoke-test', { tenantId: 'ten_x', smokeTestId: 'smk_1' }, 'smoke-test__smk_1')
      .catch((err: unknown) => err);
    expect(failure).toMatchObject({ status: 503, code: 'UNAVAILABLE' });
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(causes).toEqual(['no answer within 1000 ms']);
  });
});

describe('making sure overdue work runs (what the sweepers call)', () => {
  const prefix = `t${randomBytes(5).toString('hex')}`;
  const connection = new Redis(inject('redisUrl'), { maxRetriesPerRequest: null });
  const producers = new Producers(connection, prefix);
  const attempts: Array<{ jobId: string; at: number }> = [];
  const worker = new Worker(
    'smoke-test',
    async (job: Job) => {
      attempts.push({ jobId: job.id!, at: Date.now() });
      if (job.attemptsMade === 0 && job.id!.includes('fails-once')) throw new Error('the backend was away');
    },
    { connection, prefix: bullPrefix(prefix) },
  );
  afterAll(async () => {
    await worker.close();
    await producers.close();
    connection.disconnect();
  });
  const attemptsOf = (jobId: string) => attempts.filter((a) => a.jobId === jobId);
  const stateOf = async (jobId: string) => (await producers.queues['smoke-test'].getJob(jobId))?.getState();
  const waitFor = async (done: () => boolean | Promise<boolean>, what: string) => {
    for (const started = Date.now(); !(await done()); await new Promise((r) => setTimeout(r, 50))) {
      if (Date.now() - started > 10_000) throw new Error(`timed out waiting for ${what}`);
    }
  };
  const payload = { tenantId: 'ten_x', smokeTestId: 'smk_1' };

  it('runs a job waiting out a retry backoff now, not when its backoff ends', async () => {
    const jobId = 'smoke-test__fails-once';
    // A backoff as long as the later retries of a job that failed all through an outage.
    await producers.enqueue('smoke-test', payload, jobId, { backoff: { type: 'fixed', delay: 120_000 } });
    await waitFor(async () => (await stateOf(jobId)) === 'delayed', 'the failed first attempt to back off');
    expect(attemptsOf(jobId)).toHaveLength(1);

    const asked = Date.now();
    expect(await producers.ensure('smoke-test', payload, jobId)).toBe('promoted');
    await waitFor(async () => (await stateOf(jobId)) === 'completed', 'the second attempt');
    expect(attemptsOf(jobId)).toHaveLength(2);
    expect(attemptsOf(jobId)[1]!.at - asked).toBeLessThan(5_000);
  });

  it('leaves a job scheduled for later (a holdback timer, a webhook attempt) at its time', async () => {
    const jobId = 'smoke-test__scheduled';
    await producers.schedule('smoke-test', payload, jobId, 120_000);
    expect(await producers.ensure('smoke-test', payload, jobId)).toBe('live');
    expect(await stateOf(jobId)).toBe('delayed');
    expect(attemptsOf(jobId)).toHaveLength(0);
  });
});
