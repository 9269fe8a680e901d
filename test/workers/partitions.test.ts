import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config.ts';
import {
  jobIdFor,
  partitionOf,
  Producers,
  QueueLayout,
  type PartitionCoverageListener,
} from '../../src/queues/index.ts';
import { consumedPartitions, startWorkers, type RunningWorkers } from '../../src/workers/runner.ts';
import { eventually } from '../faults/service.ts';
import { testEnv } from '../helpers/context.ts';

const silent = pino({ level: 'silent' });

describe('routing a job to its partition', () => {
  it('is a stable function of the owner id (SHA-256), spread over every partition', () => {
    // Fixed values: every process and every version must agree on where a job lives.
    expect(partitionOf('ten_a/run_1', 1)).toBe(0);
    expect(partitionOf('ten_a/run_1', 4)).toBe(partitionOf('ten_a/run_1', 4));
    expect([0, 1, 2, 3]).toContain(partitionOf('ten_a/run_1', 4));
    const seen = new Set(Array.from({ length: 200 }, (_, i) => partitionOf(`ten_a/run_${i}`, 8)));
    expect([...seen].sort()).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it('keeps every key name of one Redis with K=1, and gives each queue and partition its own tag on a cluster', () => {
    const single = new QueueLayout('as');
    expect(single.name('settle', 0)).toBe('settle');
    expect(single.prefix('settle', 0)).toBe('as:bull');
    const cluster = new QueueLayout('as', true, 4);
    expect(cluster.prefix('settle', 0)).toBe('{as:bull:settle}');
    expect(cluster.name('settle', 3)).toBe('settle-p3');
    expect(cluster.prefix('settle', 3)).toBe('{as:bull:settle-p3}');
    expect(cluster.count('smoke-test')).toBe(1);
    expect(cluster.count('webhook-dispatch')).toBe(4);
  });

  it('routes every job of one run to one partition, whatever the job', () => {
    const layout = new QueueLayout('as', false, 8);
    const run = { tenantId: 'ten_a', runId: 'run_1' };
    expect(layout.partitionFor('settle', { ...run, settlementId: 'stl_1' })).toBe(layout.partitionFor('finalize', run));
  });
});

describe('settings', () => {
  const base = testEnv().vars;
  it('refuses a worker partition outside K and a drain below K', () => {
    expect(() => loadConfig({ ...base, QUEUE_PARTITIONS: '4', WORKER_PARTITIONS: '0,4' })).toThrow(ConfigError);
    expect(() => loadConfig({ ...base, QUEUE_PARTITIONS: '4', WORKER_PARTITIONS: 'one' })).toThrow(/WORKER_PARTITIONS/);
    expect(() => loadConfig({ ...base, QUEUE_PARTITIONS: '4', QUEUE_PARTITIONS_DRAIN: '2' })).toThrow(
      /QUEUE_PARTITIONS_DRAIN/,
    );
    const config = loadConfig({
      ...base,
      QUEUE_PARTITIONS: '4',
      WORKER_PARTITIONS: '2, 0',
      QUEUE_PARTITIONS_DRAIN: '6',
    });
    expect(config.queues).toEqual({ partitions: 4, readPartitions: 6, workerPartitions: [0, 2] });
    const layout = new QueueLayout('as', false, 4, 6);
    // Its own partitions of the K, then every partition above K that is still drained; a queue not split: one.
    expect(consumedPartitions(config, layout, 'settle')).toEqual([0, 2, 4, 5]);
    expect(consumedPartitions(config, layout, 'smoke-test')).toEqual([0]);
  });
});

/**
 * Real Redis, real BullMQ workers started by the runner: what a deployment sees when it changes K or leaves a
 * partition without a worker. The processor records each finalize job it runs.
 */
describe('changing K, and a partition no worker consumes', () => {
  const env = testEnv({ SWEEP_INTERVAL_MS: '3600000' });
  const redis = new Redis(env.vars.REDIS_URL!, { maxRetriesPerRequest: null });
  const processed = new Map<string, number>();
  const running: RunningWorkers[] = [];
  const producers: Producers[] = [];
  afterAll(async () => {
    for (const w of running) await w.close();
    for (const p of producers) await p.close();
    redis.disconnect();
  });

  const configWith = (vars: Record<string, string>) => loadConfig({ ...env.vars, ...vars });
  const workersWith = (vars: Record<string, string>) => {
    const workers = startWorkers(
      configWith(vars),
      silent,
      {
        finalize: {
          process: async ({ runId }) => {
            processed.set(runId, (processed.get(runId) ?? 0) + 1);
          },
        },
      },
      ['finalize'],
    );
    running.push(workers);
    return workers;
  };
  const producersWith = (partitions: number, onCoverage?: PartitionCoverageListener) => {
    const p = new Producers(redis, env.redisPrefix, false, undefined, { partitions, onCoverage });
    producers.push(p);
    return p;
  };
  const enqueue = (p: Producers, runId: string, delayMs = 0) =>
    p.enqueue('finalize', { tenantId: 'ten_k', runId }, jobIdFor('finalize', runId), delayMs ? { delay: delayMs } : {});

  it('processes every job enqueued under K=1, delayed ones too, after a restart with K=4', async () => {
    const before = producersWith(1);
    const now = Array.from({ length: 12 }, (_, i) => `run_now_${i}`);
    const later = Array.from({ length: 6 }, (_, i) => `run_later_${i}`);
    for (const runId of now) await enqueue(before, runId);
    for (const runId of later) await enqueue(before, runId, 1_500);
    // Enqueued twice with its derived id: still one job.
    await enqueue(before, now[0]!);
    expect(await before.queues.finalize.getJobCountByTypes('wait', 'delayed')).toBe(18);

    // The restart: K=4 everywhere. New work spreads over the four partitions.
    const workers = workersWith({ QUEUE_PARTITIONS: '4' });
    const after = producersWith(4);
    const fresh = Array.from({ length: 16 }, (_, i) => `run_k4_${i}`);
    for (const runId of fresh) await enqueue(after, runId);
    const counts = await Promise.all(
      after.partitions.finalize.map((q) => q.getJobCountByTypes('wait', 'active', 'completed')),
    );
    expect(counts.filter((n) => n > 0).length).toBeGreaterThan(1);

    await eventually(() => [...now, ...later, ...fresh].every((id) => processed.has(id)), 30_000, 'every job run');
    expect(processed.get(now[0]!)).toBe(1);
    await workers.close();
    running.splice(running.indexOf(workers), 1);
  });

  it('drains the partitions above K after K is lowered (QUEUE_PARTITIONS_DRAIN)', async () => {
    const wide = producersWith(4);
    const runIds = Array.from({ length: 16 }, (_, i) => `run_wide_${i}`);
    for (const runId of runIds) await enqueue(wide, runId, 500);
    const high = await Promise.all(wide.partitions.finalize.slice(2).map((q) => q.getJobCountByTypes('delayed')));
    expect(high.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    const workers = workersWith({ QUEUE_PARTITIONS: '2', QUEUE_PARTITIONS_DRAIN: '4' });
    await eventually(() => runIds.every((id) => processed.has(id)), 30_000, 'every job of the wider layout run');
    await workers.close();
    running.splice(running.indexOf(workers), 1);
  });

  it('reports a partition no worker consumes, keeps its jobs, and runs them once a worker comes', async () => {
    const events: Array<{ kind: string; partition: number }> = [];
    const p = producersWith(4, ({ kind, partition }) => events.push({ kind, partition }));
    workersWith({ QUEUE_PARTITIONS: '4', WORKER_PARTITIONS: '0,1' });
    const layout = p.layout;
    // Owners that land on partitions 2 and 3, which no worker consumes.
    const orphans = Array.from({ length: 40 }, (_, i) => `run_orphan_${i}`).filter(
      (runId) => layout.partitionFor('finalize', { tenantId: 'ten_k', runId }) >= 2,
    );
    expect(orphans.length).toBeGreaterThan(2);
    for (const runId of orphans) await enqueue(p, runId);
    await eventually(() => events.some((e) => e.kind === 'unconsumed'), 10_000, 'the unconsumed partition reported');
    for (const runId of orphans) await enqueue(p, runId); // a repeat: no new job
    const unconsumed = events.filter((e) => e.kind === 'unconsumed');
    // One report per partition, never one per job.
    expect(new Set(unconsumed.map((e) => e.partition)).size).toBe(unconsumed.length);
    expect(unconsumed.every((e) => e.partition >= 2)).toBe(true);
    expect(events.some((e) => e.kind === 'routed')).toBe(true);
    expect(orphans.some((id) => processed.has(id))).toBe(false);
    const waiting = await Promise.all(p.partitions.finalize.slice(2).map((q) => q.getJobCountByTypes('wait')));
    expect(waiting.reduce((a, b) => a + b, 0)).toBe(orphans.length);

    workersWith({ QUEUE_PARTITIONS: '4', WORKER_PARTITIONS: '2,3' });
    await eventually(() => orphans.every((id) => processed.get(id) === 1), 30_000, 'the waiting jobs run');
  });
});
