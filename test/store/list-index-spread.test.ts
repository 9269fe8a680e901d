import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ALL_SHARDS, ListIndex, memberOf, type ListEntry, type ListScope } from '../../src/store/list-index.ts';
import { testEnv } from '../helpers/context.ts';

/**
 * The list index spread over a cluster (a hash tag per set, the operator's `all` split over shards) must page exactly
 * like the one-slot index: same rows, same order, same cursors. Both are written here to one real Redis under two
 * prefixes and read side by side; key names show where each set lives.
 */
describe('list index spread over hash tags', () => {
  const env = testEnv();
  let redis: Redis;
  let plain: ListIndex;
  let spread: ListIndex;
  const entries: ListEntry[] = [];
  const base = Date.UTC(2026, 0, 1);

  beforeAll(async () => {
    redis = new Redis(env.vars.REDIS_URL!);
    plain = new ListIndex(redis, `${env.redisPrefix}a`);
    spread = new ListIndex(redis, `${env.redisPrefix}b`, 0, true);
    for (let i = 0; i < 90; i++) {
      entries.push({
        kind: 'runs',
        id: `run_${String(i).padStart(3, '0')}`,
        tenantId: `ten_${i % 7}`,
        // Some share a millisecond: the id orders them, in both layouts alike.
        at: new Date(base + Math.floor(i / 3) * 1_000),
        agentIds: [`agt_${i % 7}`, `agt_${(i + 1) % 5}`],
      });
    }
    for (const e of entries.slice(0, 60)) {
      await plain.add(e);
      await spread.add(e);
    }
    // The rebuild's path, in both.
    await plain.addMany(entries.slice(60));
    await spread.addMany(entries.slice(60));
  });
  afterAll(async () => {
    for (const prefix of [`${env.redisPrefix}a`, `${env.redisPrefix}b`, `{${env.redisPrefix}b`]) {
      const keys = await redis.keys(`${prefix}*`);
      if (keys.length > 0) await redis.del(...keys);
    }
    redis.disconnect();
  });

  /** Every row of a scope, read `size` at a time through cursors, as GET /v1/runs pages. */
  async function pageThrough(index: ListIndex, scope: ListScope, size: number): Promise<string[]> {
    const ids: string[] = [];
    let before: { at: Date; id: string } | undefined;
    for (;;) {
      const rows = await index.page('runs', scope, { before }, size);
      ids.push(...rows.map((r) => r.id));
      if (rows.length < size) return ids;
      before = { at: rows.at(-1)!.at, id: rows.at(-1)!.id };
    }
  }

  it('pages every scope the same as the one-slot index, newest first, at any page size', async () => {
    const newestFirst = [...entries].sort((a, b) => (memberOf(a) < memberOf(b) ? 1 : -1)).map((e) => e.id);
    for (const size of [1, 7, 25, 200]) {
      expect(await pageThrough(spread, 'all', size)).toEqual(newestFirst);
      expect(await pageThrough(plain, 'all', size)).toEqual(newestFirst);
    }
    for (const scope of [{ tenantId: 'ten_3' }, { agentId: 'agt_2' }]) {
      expect(await pageThrough(spread, scope, 4)).toEqual(await pageThrough(plain, scope, 4));
      expect((await pageThrough(spread, scope, 4)).length).toBeGreaterThan(0);
    }
    const window = { createdAfter: new Date(base + 5_000), createdBefore: new Date(base + 20_000) };
    expect((await spread.page('runs', 'all', window, 100)).map((r) => r.id)).toEqual(
      (await plain.page('runs', 'all', window, 100)).map((r) => r.id),
    );
  });

  it('keeps a tenant or an agent list in one key of its own tag, and spreads the operator list over shards', async () => {
    const prefix = `${env.redisPrefix}b`;
    expect(spread.key('runs', { tenantId: 'ten_3' })).toBe(`{${prefix}:lists:runs:t:ten_3}`);
    expect(spread.key('runs', { agentId: 'agt_2' })).toBe(`{${prefix}:lists:runs:a:agt_2}`);
    expect(plain.key('runs', { tenantId: 'ten_3' })).toBe(`${env.redisPrefix}a:{lists}:runs:t:ten_3`);
    const tenantRows = entries.filter((e) => e.tenantId === 'ten_3').length;
    expect(await redis.zcard(spread.key('runs', { tenantId: 'ten_3' }))).toBe(tenantRows);
    const shards = await Promise.all(
      Array.from({ length: ALL_SHARDS }, (_, s) => redis.zcard(spread.key('runs', 'all', s))),
    );
    // Seven tenants, each in one shard: several shards in use, and every row in exactly one.
    expect(shards.filter((n) => n > 0).length).toBeGreaterThan(1);
    expect(shards.reduce((a, b) => a + b, 0)).toBe(entries.length);
    expect(await spread.size('runs', 'all')).toBe(entries.length);
  });

  it('removes a dangling entry from the shard it lives in', async () => {
    const [row] = await spread.page('runs', 'all', {}, 1);
    await spread.removeFrom('runs', 'all', row!.member);
    expect(await spread.size('runs', 'all')).toBe(entries.length - 1);
    expect((await spread.page('runs', 'all', {}, 1))[0]!.id).not.toBe(row!.id);
  });
});
