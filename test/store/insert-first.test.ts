import { MongoClient, type Collection, type CommandStartedEvent } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertFirst } from '../../src/store/mongo.ts';
import { testEnv } from '../helpers/context.ts';

/**
 * insertFirst is every "first writer wins" claim in the service. Concurrent claims share commands (group commit);
 * each must still win or lose on its own, and a claim that fails for another reason must fail alone.
 */
describe('insertFirst', () => {
  let client: MongoClient;
  const inserts: CommandStartedEvent[] = [];
  const env = testEnv();
  beforeAll(async () => {
    client = new MongoClient(env.vars.MONGO_URL!, { monitorCommands: true, maxPoolSize: 50 });
    client.on('commandStarted', (e) => {
      if (e.commandName === 'insert') inserts.push(e);
    });
    await client.connect();
  });
  afterAll(async () => {
    await client
      .db()
      .dropDatabase()
      .catch(() => undefined);
    await client.close();
  });

  // One collection object, as each store holds its own: claims group per collection object.
  let collection: ReturnType<typeof collectionOf>;
  const collectionOf = (c: MongoClient) => c.db().collection<{ _id: string; by?: number }>('claims');
  const claims = () => (collection ??= collectionOf(client));
  const insertsSince = (from: number) => inserts.slice(from);

  it('gives a contested key to exactly one of 50 concurrent claimants, and stores only that one', async () => {
    const results = await Promise.all(
      Array.from({ length: 50 }, (_, by) => insertFirst(claims(), { _id: 'contested', by })),
    );
    expect(results.filter(Boolean)).toHaveLength(1);
    const winner = results.indexOf(true);
    expect(await claims().findOne({ _id: 'contested' })).toEqual({ _id: 'contested', by: winner });
  });

  it('sends 200 concurrent claims in far fewer commands, each claim settled by its own fate', async () => {
    await claims().insertOne({ _id: 'taken_7' });
    const from = inserts.length;
    const keys = Array.from({ length: 200 }, (_, i) => (i % 50 === 7 ? 'taken_7' : `free_${i}`));
    const results = await Promise.all(keys.map((_id) => insertFirst(claims(), { _id })));
    keys.forEach((key, i) => expect(results[i], key).toBe(key !== 'taken_7'));
    expect(insertsSince(from).length).toBeLessThanOrEqual(10);
    expect(await claims().findOne({ _id: 'free_199' })).toEqual({ _id: 'free_199' });
  });

  it('sends a lone claim at once, as its own single-document command', async () => {
    const from = inserts.length;
    expect(await insertFirst(claims(), { _id: 'lone' })).toBe(true);
    expect(await insertFirst(claims(), { _id: 'lone' })).toBe(false);
    expect(insertsSince(from).map((e) => (e.command.documents as unknown[]).length)).toEqual([1, 1]);
  });

  it('fails only the claim the server refuses for another reason; the rest of its command lands', async () => {
    const coll = claims() as unknown as Collection<{ _id: string | string[] }>;
    const outcomes = await Promise.allSettled([
      insertFirst(coll, { _id: 'beside_bad_1' }),
      insertFirst(coll, { _id: ['an', 'array'] }),
      insertFirst(coll, { _id: 'beside_bad_2' }),
    ]);
    expect(outcomes[0]).toEqual({ status: 'fulfilled', value: true });
    expect(outcomes[1]!.status).toBe('rejected');
    expect(outcomes[2]).toEqual({ status: 'fulfilled', value: true });
    expect(await coll.countDocuments({ _id: { $in: ['beside_bad_1', 'beside_bad_2'] } })).toBe(2);
  });
});
