import { Redis } from 'ioredis';
import { MongoClient } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { partitionOf } from '../../src/queues/index.ts';
import { bucketOf, WebhookDueIndex, type DueWork } from '../../src/store/webhook-due.ts';
import { testEnv } from '../helpers/context.ts';

/**
 * The webhook due index split like the webhook-dispatch queue, against real FerretDB and Redis: each entry in the
 * partition of its job's owner, each partition with its own buckets and cursor; K=1 keeps the names of old, so what
 * K=1 wrote is partition 0's under any K.
 */
describe('webhook due index over partitions', () => {
  const env = testEnv();
  let mongo: MongoClient;
  let redis: Redis;
  beforeAll(async () => {
    mongo = new MongoClient(env.vars.MONGO_URL!);
    await mongo.connect();
    redis = new Redis(env.vars.REDIS_URL!);
  });
  afterAll(async () => {
    await mongo
      .db()
      .dropDatabase()
      .catch(() => undefined);
    await mongo.close();
    const keys = await redis.keys(`${env.redisPrefix}:*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  const now = new Date();
  const bucket = bucketOf(now);
  const fanOut = (eventId: string): DueWork => ({ kind: 'fan-out', tenantId: 'ten_a', eventId, dueAt: now });
  const deliver = (deliveryId: string): DueWork => ({ kind: 'deliver', tenantId: 'ten_a', deliveryId, dueAt: now });
  const idOf = (e: DueWork) => (e.kind === 'deliver' ? e.deliveryId : e.eventId);

  it('keeps the names of old with K=1: the bucket alone, the one cursor', async () => {
    const one = new WebhookDueIndex(mongo.db(), redis, env.redisPrefix);
    await one.add(fanOut('evt_old'));
    expect(await one.cursor()).toBe(bucket - 1);
    expect(
      await mongo
        .db()
        .collection('webhook_due_cursor')
        .findOne({ _id: 'sweeper' as never }),
    ).not.toBeNull();
    expect((await one.read(bucket)).map(idOf)).toEqual(['evt_old']);
  });

  it('puts each entry in its job partition, read and walked per partition, what K=1 wrote in partition 0', async () => {
    const four = new WebhookDueIndex(mongo.db(), redis, env.redisPrefix, { partitions: 4, readPartitions: 4 });
    const work = [
      ...Array.from({ length: 12 }, (_, i) => fanOut(`evt_${i}`)),
      ...Array.from({ length: 12 }, (_, i) => deliver(`dlv_${i}`)),
    ];
    for (const w of work) await four.add(w);
    const seen: string[] = [];
    for (const p of four.readPartitionList()) {
      const entries = await four.read(bucket, p);
      // Exactly the work whose job routes to p (webhook-dispatch: the delivery, else the event).
      for (const e of entries)
        if (e.kind === 'deliver' || e.eventId !== 'evt_old') expect(partitionOf(idOf(e), 4)).toBe(p);
      seen.push(...entries.map(idOf));
      if (entries.length > 0) expect(await four.cursor(p)).toBe(bucket - 1);
    }
    expect(seen.sort()).toEqual(['evt_old', ...work.map(idOf)].sort());
    // The entry K=1 wrote is read by partition 0's sweep.
    expect((await four.read(bucket, 0)).map(idOf)).toContain('evt_old');
    expect(new Set(work.map((w) => four.partitionFor(w))).size).toBeGreaterThan(1);

    // A partition's clear and cursor are its own.
    const p = four.partitionFor(work[0]!);
    await four.clear(bucket, p);
    await four.moveCursor(bucket + 1, p);
    expect(await four.read(bucket, p)).toEqual([]);
    expect(await four.cursor(p)).toBe(bucket + 1);
    const other = [0, 1, 2, 3].find((q) => q !== p && work.some((w) => four.partitionFor(w) === q))!;
    expect((await four.read(bucket, other)).length).toBeGreaterThan(0);
  });
});
