import { Redis } from 'ioredis';
import { MongoClient, type CommandStartedEvent } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DueWorkStore } from '../../src/store/due-work.ts';
import { testEnv } from '../helpers/context.ts';

/**
 * A sweeper's cost must follow the work that is due, not the work waiting for later: settlements wait in their due
 * index for a whole dispute window, and a sweep used to read every one of them.
 */
describe('due-work index', () => {
  const env = testEnv();
  let client: MongoClient;
  let redis: Redis;
  let store: DueWorkStore;
  const reads: CommandStartedEvent[] = [];
  beforeAll(async () => {
    client = new MongoClient(env.vars.MONGO_URL!, { monitorCommands: true });
    client.on('commandStarted', (e) => {
      if (e.commandName === 'find') reads.push(e);
    });
    await client.connect();
    redis = new Redis(env.vars.REDIS_URL!);
    store = new DueWorkStore(client.db(), 'things', redis, env.redisPrefix);
  });
  afterAll(async () => {
    await client
      .db()
      .dropDatabase()
      .catch(() => undefined);
    await client.close();
    await redis.del(`${env.redisPrefix}:{due:things}:at`, `${env.redisPrefix}:{due:things}:audit`);
    redis.disconnect();
  });

  const now = Date.now();
  const minutes = (m: number) => new Date(now + m * 60_000);

  it('reads only the records that have fallen due, by _id, oldest first', async () => {
    // 300 settlements waiting out their dispute windows, three due now.
    await Promise.all(Array.from({ length: 300 }, (_, i) => store.mark(`later_${i}`, 'ten_a', minutes(60 + i))));
    await store.mark('due_b', 'ten_a', minutes(-2));
    await store.mark('due_a', 'ten_a', minutes(-5));
    await store.mark('due_c', 'ten_b', minutes(0));

    const from = reads.length;
    const due = await store.due(new Date(now), 200);
    expect(due.map((r) => r._id)).toEqual(['due_a', 'due_b', 'due_c']);
    expect(due[0]).toMatchObject({ tenantId: 'ten_a', dueAt: minutes(-5) });
    const filters = reads.slice(from).map((e) => e.command.filter);
    expect(filters).toHaveLength(3);
    expect(filters.every((f) => Object.keys(f).length === 1 && typeof f._id === 'string')).toBe(true);
  });

  it('moves a record when it is marked again, and forgets it once done', async () => {
    await store.mark('due_a', 'ten_a', minutes(30));
    await store.done('due_b');
    expect((await store.due(new Date(now), 200)).map((r) => r._id)).toEqual(['due_c']);
    expect((await store.due(minutes(31), 200)).map((r) => r._id)).toEqual(['due_c', 'due_a']);
    expect(await store.records.findOne({ _id: 'due_b' })).toBeNull();
  });

  it('puts back what Redis lost, from the records, once per audit period', async () => {
    await redis.del(`${env.redisPrefix}:{due:things}:at`);
    expect(await store.due(new Date(now), 200)).toEqual([]);

    const audit = await store.audit();
    expect(audit).toMatchObject({ read: 302, restored: 302 });
    expect((await store.due(new Date(now), 200)).map((r) => r._id)).toEqual(['due_c']);
    expect(await store.audit()).toBeNull(); // another process (or this one) audited just now
    // The audit is the one read of the whole collection, and says so.
    expect(reads.filter((e) => Object.keys(e.command.filter ?? {}).length === 0).map((e) => e.command.comment)).toEqual(
      ['due-index-reconciliation'],
    );
  });
});
