import { Redis } from 'ioredis';
import { MongoClient } from 'mongodb';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { partitionOf } from '../../src/queues/index.ts';
import { createRuntime, type Runtime } from '../../src/runtime.ts';
import { sweepDue, type DueLook } from '../../src/services/sweep-items.ts';
import { DueWorkStore, type DuePartitions } from '../../src/store/due-work.ts';
import { startWorkers, type RunningWorkers } from '../../src/workers/runner.ts';
import { eventually } from '../faults/service.ts';
import { testEnv } from '../helpers/context.ts';

const silent = pino({ level: 'silent' });

/** `count` ids whose owner hash lands on `partition` of `k` (the store's default owner is the id). */
function idsIn(partition: number, k: number, count: number, tag: string): string[] {
  const ids: string[] = [];
  for (let i = 0; ids.length < count; i++) if (partitionOf(`${tag}_${i}`, k) === partition) ids.push(`${tag}_${i}`);
  return ids;
}

/**
 * Real Redis, real FerretDB, real BullMQ workers started by the runner: each finalize partition's sweep job sweeps
 * that partition of a due index (as the hot queues' sweeps do theirs), and the look is the
 * test's, so it can stall one partition, fail one item, and count what each sweep looked at.
 */
describe('sweeps split by partition', () => {
  const env = testEnv({ SWEEP_INTERVAL_MS: '250' });
  let mongo: MongoClient;
  let redis: Redis;
  let runtime: Runtime;
  const running: RunningWorkers[] = [];
  /** Every id a look finished, with how often. */
  const looked = new Map<string, number>();
  /** How many sweep jobs of each partition ran. */
  const swept = new Map<number, number>();
  /** Looks that wait here until the test lets them go (a stalled partition). */
  let stall: { ids: Set<string>; release: () => void; released: Promise<void> } | null = null;
  const failing = new Set<string>();

  beforeAll(async () => {
    mongo = new MongoClient(env.vars.MONGO_URL!);
    await mongo.connect();
    redis = new Redis(env.vars.REDIS_URL!, { maxRetriesPerRequest: null });
    runtime = createRuntime(loadConfig(env.vars), silent);
  });
  afterAll(async () => {
    stall?.release();
    for (const w of running) await w.close();
    await runtime.close();
    await mongo
      .db()
      .dropDatabase()
      .catch(() => undefined);
    await mongo.close();
    const keys = await redis.keys(`${env.redisPrefix}:*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  const storeWith = (name: string, partitions: DuePartitions) =>
    new DueWorkStore(mongo.db(), name, redis, env.redisPrefix, { partitions });

  async function look(id: string): Promise<DueLook> {
    if (stall?.ids.has(id)) await stall.released;
    if (failing.has(id)) throw new Error(`${id} fails on purpose`);
    looked.set(id, (looked.get(id) ?? 0) + 1);
    return 'done';
  }

  /** Workers of the finalize queue whose sweep sweeps `due` (built for the same K), with these settings. */
  function workersWith(due: DueWorkStore, vars: Record<string, string>): RunningWorkers {
    const workers = startWorkers(
      loadConfig({ ...env.vars, ...vars }),
      silent,
      {
        finalize: {
          process: async () => undefined,
          sweepsPerPartition: true,
          sweep: async (partition) => {
            if (partition !== undefined) swept.set(partition, (swept.get(partition) ?? 0) + 1);
            return sweepDue(runtime, `test-${due.partitions.partitions}`, due, 10_000, look, partition);
          },
        },
      },
      ['finalize'],
    );
    running.push(workers);
    return workers;
  }
  async function stop(workers: RunningWorkers): Promise<void> {
    await workers.close();
    running.splice(running.indexOf(workers), 1);
  }

  it('writes each record to its owner partition, and keeps the key of old with K=1', async () => {
    const one = storeWith('layout', { partitions: 1, readPartitions: 1 });
    expect(one.dueKey(0)).toBe(`${env.redisPrefix}:{due:layout}:at`);
    const four = storeWith('layout', { partitions: 4, readPartitions: 4 });
    expect(four.dueKey(3)).toBe(`${env.redisPrefix}:{due:layout-p3}:at`);
    const [id] = idsIn(3, 4, 1, 'layout');
    await four.mark(id!, 'ten_a', new Date());
    expect(await redis.zscore(four.dueKey(3), id!)).not.toBeNull();
    expect(await redis.zscore(four.dueKey(0), id!)).toBeNull();
    // An owner other than the id (a settlement's run) names the partition.
    const owner = idsIn(2, 4, 1, 'run')[0]!;
    await four.mark('stl_x', 'ten_a', new Date(), owner);
    expect(await redis.zscore(four.dueKey(2), 'stl_x')).not.toBeNull();
    await four.done('stl_x');
    expect(await redis.zscore(four.dueKey(2), 'stl_x')).toBeNull();
  });

  it('sweeps only the partitions a worker group consumes (WORKER_PARTITIONS)', async () => {
    const due = storeWith('subset', { partitions: 3, readPartitions: 3 });
    const [in0, in1, in2] = [0, 1, 2].map((p) => idsIn(p, 3, 1, 'subset')[0]!);
    for (const id of [in0, in1, in2]) await due.mark(id!, 'ten_a', new Date());
    const group = workersWith(due, { QUEUE_PARTITIONS: '3', WORKER_PARTITIONS: '0,1' });
    await eventually(() => looked.has(in0!) && looked.has(in1!), 30_000, 'partitions 0 and 1 swept');
    // Three more sweeps of 0 and of 1 come and go; partition 2's record waits for its own group.
    const [at0, at1] = [swept.get(0)!, swept.get(1)!];
    await eventually(() => swept.get(0)! >= at0 + 3 && swept.get(1)! >= at1 + 3, 30_000, 'more sweeps of 0 and 1');
    expect([...swept.keys()].sort()).toEqual([0, 1]);
    expect(looked.has(in2!)).toBe(false);
    const other = workersWith(due, { QUEUE_PARTITIONS: '3', WORKER_PARTITIONS: '2' });
    await eventually(() => looked.has(in2!), 30_000, 'partition 2 swept by its own group');
    await stop(group);
    await stop(other);
  });

  it('goes on sweeping every other partition while one partition stalls, and past an item that fails', async () => {
    const due = storeWith('stall', { partitions: 3, readPartitions: 3 });
    const [stalled] = idsIn(1, 3, 1, 'stall');
    const [fails, fine, later] = idsIn(2, 3, 3, 'stall');
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    stall = { ids: new Set([stalled!]), release, released };
    failing.add(fails!);
    const entered = new Date(Date.now() - 1_000);
    for (const id of [stalled, fails, fine]) await due.mark(id!, 'ten_a', entered);
    const workers = workersWith(due, { QUEUE_PARTITIONS: '3' });
    await eventually(() => looked.has(fine!), 30_000, "partition 2's record handled beside the failing one");
    // Partition 1's sweep is still stuck in its look; partition 2's sweeps keep coming: new work is found.
    await due.mark(later!, 'ten_a', new Date());
    await eventually(() => looked.has(later!), 30_000, 'partition 2 swept again while partition 1 stalls');
    expect(looked.has(stalled!)).toBe(false);
    // The failing item backs off alone: still recorded, due again later, never finished.
    expect(await due.has(fails!)).toBe(true);
    expect(looked.has(fails!)).toBe(false);
    release();
    await eventually(() => looked.has(stalled!), 30_000, 'the stalled partition finishes once let go');
    stall = null;
    await stop(workers);
  });

  it('sweeps every record written under K=1 after a restart with K=4, and moves it to its new partition', async () => {
    const before = storeWith('grow', { partitions: 1, readPartitions: 1 });
    const now = Array.from({ length: 12 }, (_, i) => `grow_now_${i}`);
    const later = Array.from({ length: 6 }, (_, i) => `grow_later_${i}`);
    const tomorrow = new Date(Date.now() + 86_400_000);
    for (const id of now) await before.mark(id, 'ten_a', new Date());
    for (const id of later) await before.mark(id, 'ten_a', tomorrow);
    expect(await redis.zcard(before.dueKey(0))).toBe(18);

    const after = storeWith('grow', { partitions: 4, readPartitions: 4 });
    const workers = workersWith(after, { QUEUE_PARTITIONS: '4' });
    await eventually(() => now.every((id) => looked.has(id)), 30_000, 'every record of K=1 swept');
    await stop(workers);
    // Those due tomorrow wait in partition 0, still read under K=4: found when they fall due (and moved home then).
    const found = await after.overdue(new Date(tomorrow.getTime() + 1), 100);
    expect(found.map((r) => r._id).sort()).toEqual([...later].sort());
  });

  it('drains the partitions above a lowered K (QUEUE_PARTITIONS_DRAIN), records due tomorrow included', async () => {
    const wide = storeWith('shrink', { partitions: 4, readPartitions: 4 });
    const now = Array.from({ length: 16 }, (_, i) => `shrink_now_${i}`);
    const later = Array.from({ length: 16 }, (_, i) => `shrink_later_${i}`);
    const tomorrow = new Date(Date.now() + 86_400_000);
    for (const id of now) await wide.mark(id, 'ten_a', new Date());
    for (const id of later) await wide.mark(id, 'ten_a', tomorrow);
    const high = (await redis.zcard(wide.dueKey(2))) + (await redis.zcard(wide.dueKey(3)));
    expect(high).toBeGreaterThan(0);

    const narrow = storeWith('shrink', { partitions: 2, readPartitions: 4 });
    const workers = workersWith(narrow, { QUEUE_PARTITIONS: '2', QUEUE_PARTITIONS_DRAIN: '4' });
    await eventually(() => now.every((id) => looked.has(id)), 30_000, 'every due record of the wider layout swept');
    await eventually(
      async () => (await redis.zcard(narrow.dueKey(2))) + (await redis.zcard(narrow.dueKey(3))) === 0,
      30_000,
      'partitions 2 and 3 empty',
    );
    await stop(workers);
    // Tomorrow's records wait in their partitions under K=2, where the sweeps of K=2 alone will find them.
    const settled = storeWith('shrink', { partitions: 2, readPartitions: 2 });
    for (const id of later) {
      const home = partitionOf(id, 2);
      expect(await redis.zscore(settled.dueKey(home), id)).toBe(String(tomorrow.getTime()));
    }
    const found = await settled.overdue(new Date(tomorrow.getTime() + 1), 100);
    expect(found.map((r) => r._id).sort()).toEqual([...later].sort());
  });
});
