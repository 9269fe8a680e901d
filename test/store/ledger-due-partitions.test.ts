import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { partitionOf } from '../../src/queues/index.ts';
import { LedgerDueIndex } from '../../src/store/ledger-due.ts';
import { testEnv } from '../helpers/context.ts';

/**
 * The ledger's due index split over K partitions by entry id, against a real Redis: what one layout wrote, the next
 * finds, and every member ends in the partition its id names, so the ledger's own calls (entryDone, postpone,
 * lockReconciled: by member or id alone) always find it.
 */
describe('ledger due index over partitions', () => {
  const env = testEnv();
  let redis: Redis;
  const key = (p: number, set: 'pending' | 'locks') => `${env.redisPrefix}:{ledger${p === 0 ? '' : `-p${p}`}}:${set}`;
  beforeAll(() => {
    redis = new Redis(env.vars.REDIS_URL!);
  });
  afterAll(async () => {
    const keys = await redis.keys(`${env.redisPrefix}:*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  const past = Date.now() - 60_000;
  const entryIds = Array.from({ length: 24 }, (_, i) => `ent_${i}`);

  it('keeps the keys of old with K=1, and writes each entry to its own partition with K=4', async () => {
    const one = new LedgerDueIndex(redis, env.redisPrefix);
    const member = await one.entryStarted('ent_solo', past);
    expect(await redis.zscore(key(0, 'pending'), member)).toBe(String(past));
    await one.entryDone(member);

    const four = new LedgerDueIndex(redis, env.redisPrefix, { partitions: 4, readPartitions: 4 });
    for (const id of entryIds) await four.lockApplied(id, new Date(past));
    for (const id of entryIds) expect(await redis.zscore(key(partitionOf(id, 4), 'locks'), id)).not.toBeNull();
    const used = new Set(entryIds.map((id) => partitionOf(id, 4)));
    expect(used.size).toBeGreaterThan(1);
    expect((await four.locksAppliedBefore(new Date(), 100)).sort()).toEqual([...entryIds].sort());
    for (const id of entryIds) await four.lockReconciled(id);
    expect(await four.locksAppliedBefore(new Date(), 100)).toEqual([]);
  });

  it('finds what K=1 started after a restart with K=4, moved where the ledger then removes it', async () => {
    const one = new LedgerDueIndex(redis, env.redisPrefix);
    const members = await Promise.all(entryIds.map((id, i) => one.entryStarted(id, past + i)));
    const four = new LedgerDueIndex(redis, env.redisPrefix, { partitions: 4, readPartitions: 4 });
    const started = await four.startedBefore(new Date(), 100);
    expect(started.map((s) => s.member)).toEqual(members); // oldest first, over every partition
    for (const s of started)
      expect(await redis.zscore(key(partitionOf(s.entryId, 4), 'pending'), s.member)).not.toBeNull();
    // The ledger's own calls act on the member's partition under K=4.
    await four.postpone(members[0]!, past + 10_000_000);
    for (const m of members.slice(1)) await four.entryDone(m);
    const left = await four.startedEntries(100);
    expect(left.map((s) => s.member)).toEqual([members[0]]);
    await four.entryDone(members[0]!);
    expect(await four.startedEntries(100)).toEqual([]);
  });

  it('empties the partitions above a lowered K, locks due next week included', async () => {
    const four = new LedgerDueIndex(redis, env.redisPrefix, { partitions: 4, readPartitions: 4 });
    const nextWeek = new Date(Date.now() + 7 * 86_400_000);
    for (const id of entryIds) await four.lockCheckAt(id, nextWeek);
    const high = (await redis.zcard(key(2, 'locks'))) + (await redis.zcard(key(3, 'locks')));
    expect(high).toBeGreaterThan(0);
    const draining = new LedgerDueIndex(redis, env.redisPrefix, { partitions: 2, readPartitions: 4 });
    expect(await draining.locksAppliedBefore(new Date(), 100)).toEqual([]); // none due yet…
    expect((await redis.zcard(key(2, 'locks'))) + (await redis.zcard(key(3, 'locks')))).toBe(0); // …all moved
    const two = new LedgerDueIndex(redis, env.redisPrefix, { partitions: 2, readPartitions: 2 });
    expect((await two.locksAppliedBefore(new Date(nextWeek.getTime() + 1), 100)).sort()).toEqual([...entryIds].sort());
  });

  it('restores what an audit found into each entry partition', async () => {
    const four = new LedgerDueIndex(redis, env.redisPrefix, { partitions: 4, readPartitions: 4 });
    await four.restore(
      entryIds.map((entryId) => ({ entryId, createdAt: new Date(past) })),
      [],
    );
    for (const id of entryIds)
      expect(await redis.zscore(key(partitionOf(id, 4), 'pending'), `${id}@${past}`)).toBe(String(past));
    expect((await four.startedBefore(new Date(), 100)).length).toBe(entryIds.length);
  });
});
