import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { bullPrefix } from '../../src/queues/index.ts';
import { startWorkers, type RunningWorkers } from '../../src/workers/runner.ts';
import { eventually } from '../faults/service.ts';
import { testEnv } from '../helpers/context.ts';

/**
 * The workers' watchdog replaces a BullMQ worker that takes no job while its queue has waiting ones (after a Redis
 * failover it can stay blocked on a connection left behind). Here the queue's global concurrency holds a worker back
 * instead, right after a job whose completion BullMQ could not record (its lock gone, as after a failover; the job
 * stays active in Redis). Such a job ends in neither `completed` nor `failed`: a watchdog that counted running jobs
 * from those events never saw the worker idle again (the Redis Cluster fault test's flow then stopped for good).
 */
describe('worker watchdog', () => {
  const env = testEnv({ LOG_LEVEL: 'info', SWEEP_INTERVAL_MS: '3600000' });
  const config = loadConfig(env.vars);
  const prefix = bullPrefix(config.redisPrefix, false);
  const lines: Array<{ msg: string; queue?: string }> = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line)) });
  const redis = new Redis(config.redisUrl, { maxRetriesPerRequest: null });
  const smokeTests = new Queue('smoke-test', { connection: redis, prefix });
  const processed: string[] = [];
  let workers: RunningWorkers;

  beforeAll(() => {
    workers = startWorkers(
      config,
      logger,
      {
        'smoke-test': {
          process: async ({ smokeTestId }, job) => {
            if (smokeTestId === 'lost' && !processed.includes('lost')) {
              // What a failover does to a job in flight: its completion can no longer be recorded (the job stays
              // active in Redis). And with one job at a time allowed, the worker takes nothing more: it stands for a
              // worker blocked on the connection a failover left behind.
              await smokeTests.setGlobalConcurrency(1);
              await redis.del(`${prefix}:smoke-test:${job.id}:lock`);
            }
            processed.push(smokeTestId);
          },
        },
        finalize: { process: async () => undefined },
      },
      ['smoke-test', 'finalize'],
    );
  });
  afterAll(async () => {
    await workers.close();
    await smokeTests.obliterate({ force: true }).catch(() => undefined);
    await smokeTests.close();
    redis.disconnect();
  });

  it('replaces a worker that takes nothing while jobs wait, also after a job whose completion was lost, and the others with it', async () => {
    await smokeTests.add('smoke', { tenantId: 't', smokeTestId: 'lost' });
    await eventually(() => processed.includes('lost'), 10_000, 'the first job', 100);
    await smokeTests.add('smoke', { tenantId: 't', smokeTestId: 'second' });
    await smokeTests.add('smoke', { tenantId: 't', smokeTestId: 'third' });
    // Two checks 5 s apart see the jobs waiting and nothing running.
    await eventually(
      () => lines.some((l) => l.queue === 'smoke-test' && l.msg === 'worker idle while jobs wait; replacing it'),
      20_000,
      'the stuck worker replaced',
      100,
    );
    // The finalize worker shares the connection: it is replaced with it, though its queue is empty.
    expect(lines.filter((l) => l.queue === 'finalize').map((l) => l.msg)).toContain(
      'worker of the same process replaced with it (a connection left behind blocks them all)',
    );
    // Once one job at a time is no longer the rule, the new worker takes the jobs that waited.
    expect(processed).toEqual(['lost']);
    await smokeTests.removeGlobalConcurrency();
    await eventually(
      () => processed.includes('second') && processed.includes('third'),
      30_000,
      'the waiting jobs processed',
      100,
    );
  }, 60_000);
});
