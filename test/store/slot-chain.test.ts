// A SlotChain with group commit (one sponsor wallet's daily spends, issue 40): the appends that queue on one key go
// out together as one ordered insert, and every money rule of a chain of unique inserts still holds: a running total
// never passes its limit, not by one unit, with two processes appending at once; one decision key is counted once;
// an append that fails fails alone.
import { randomBytes } from 'node:crypto';
import { MongoClient, type CommandStartedEvent } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { OtherKeyTaken, SlotChain, type SpendDoc } from '../../src/store/x402.ts';
import { testEnv } from '../helpers/context.ts';

describe('SlotChain group commit', () => {
  const env = testEnv();
  // Two clients stand for two processes: each has its own chain object (its own queue, head and record caches).
  let first: MongoClient;
  let second: MongoClient;
  const inserts: CommandStartedEvent[] = [];
  const name = `slot_chain_${randomBytes(4).toString('hex')}`;
  beforeAll(async () => {
    first = new MongoClient(env.vars.MONGO_URL!, { monitorCommands: true, maxPoolSize: 50 });
    first.on('commandStarted', (e) => {
      if (e.commandName === 'insert' && e.command.insert === name) inserts.push(e);
    });
    second = new MongoClient(env.vars.MONGO_URL!, { maxPoolSize: 50 });
    await Promise.all([first.connect(), second.connect()]);
    await first.db().collection(name).createIndex({ decisionKey: 1 }, { unique: true });
  });
  afterAll(async () => {
    await first
      .db()
      .collection(name)
      .drop()
      .catch(() => undefined);
    await Promise.all([first.close(), second.close()]);
  });

  const chainOf = (client: MongoClient) =>
    new SlotChain<SpendDoc>(client.db().collection<SpendDoc>(name), null, 'spends', { groupCommit: true });

  /** As spendDaily builds a spend: refused (null) when it would pass the limit. */
  const spend = (chain: SlotChain<SpendDoc>, key: string, decisionKey: string, amount: number, limit: number) =>
    chain.append(key, (_seq, previous) => {
      const spent = previous?.total ?? 0;
      return spent + amount > limit ? null : { ref: key, decisionKey, amount, total: spent + amount, at: new Date() };
    });

  const stored = async (key: string) =>
    (await first.db().collection<SpendDoc>(name).find({ ref: key }).toArray()).sort(
      (a, b) => Number(a._id.split('#').pop()) - Number(b._id.split('#').pop()),
    );

  it('200 parallel spends of 7 against a limit of 500 from two processes: 71 counted, the total never past the limit', async () => {
    const key = `wallet-a#${Date.now()}`;
    const [a, b] = [chainOf(first), chainOf(second)];
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) => spend(i % 2 === 0 ? a : b, key, `${key}#d${i}`, 7, 500)),
    );
    expect(results.filter(Boolean)).toHaveLength(71);
    const docs = await stored(key);
    expect(docs.map((d) => d.total)).toEqual(Array.from({ length: 71 }, (_, i) => 7 * (i + 1)));
    expect(docs.map((d) => d._id)).toEqual(docs.map((_, i) => `${key}#${i + 1}`)); // no gap, no position twice
    // Every counted spend answered its caller with the record stored at its position.
    for (const r of results.filter(Boolean)) expect(docs.find((d) => d._id === r!._id)).toEqual(r);
  });

  it('100 parallel spends in one process travel in far fewer insert commands than one each', async () => {
    const key = `wallet-f#${Date.now()}`;
    const chain = chainOf(first);
    const from = inserts.length;
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) => spend(chain, key, `${key}#d${i}`, 1, 1_000)),
    );
    expect(results.filter(Boolean)).toHaveLength(100);
    expect(inserts.length - from).toBeLessThanOrEqual(10);
    expect((await stored(key)).map((d) => d.total)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));
  });

  it('another process having taken many positions at once is read past in a few reads, not one insert each', async () => {
    const key = `wallet-g#${Date.now()}`;
    const [a, b] = [chainOf(first), chainOf(second)];
    expect(await spend(a, key, `${key}#d0`, 1, 1_000)).toMatchObject({ total: 1 });
    await Promise.all(Array.from({ length: 60 }, (_, i) => spend(b, key, `${key}#b${i}`, 1, 1_000)));
    const from = inserts.length;
    // The first process still remembers its head at position 1: its next insert loses, then it finds position 61.
    expect(await spend(a, key, `${key}#d1`, 1, 1_000)).toMatchObject({ _id: `${key}#62`, total: 62 });
    expect(inserts.length - from).toBe(2);
  });

  it('at the limit exactly: 30 parallel spends of 10 against 100 count 10, the rest are refused', async () => {
    const key = `wallet-b#${Date.now()}`;
    const [a, b] = [chainOf(first), chainOf(second)];
    const results = await Promise.all(
      Array.from({ length: 30 }, (_, i) => spend(i % 3 === 0 ? b : a, key, `${key}#d${i}`, 10, 100)),
    );
    expect(results.filter(Boolean)).toHaveLength(10);
    expect((await stored(key)).map((d) => d.total)).toEqual([10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
  });

  it('one decision key appended twice at once is counted once; the repeat fails alone with OtherKeyTaken', async () => {
    const key = `wallet-c#${Date.now()}`;
    const chain = chainOf(first);
    const results = await Promise.allSettled(
      Array.from({ length: 20 }, (_, i) => spend(chain, key, `${key}#d${i % 10}`, 5, 1_000)),
    );
    const counted = results.filter((r) => r.status === 'fulfilled' && r.value !== null);
    const repeats = results.filter((r) => r.status === 'rejected');
    expect(counted).toHaveLength(10);
    expect(repeats).toHaveLength(10);
    for (const r of repeats) expect((r as PromiseRejectedResult).reason).toBeInstanceOf(OtherKeyTaken);
    const docs = await stored(key);
    expect(new Set(docs.map((d) => d.decisionKey)).size).toBe(10);
    expect(docs.map((d) => d.total)).toEqual(Array.from({ length: 10 }, (_, i) => 5 * (i + 1)));
  });

  it('a build that throws fails its own append only; the others in its batch are counted', async () => {
    const key = `wallet-d#${Date.now()}`;
    const chain = chainOf(first);
    const results = await Promise.allSettled(
      Array.from({ length: 12 }, (_, i) =>
        i === 5
          ? chain.append(key, () => {
              throw new Error('build failed');
            })
          : spend(chain, key, `${key}#d${i}`, 1, 1_000),
      ),
    );
    expect(results[5]).toMatchObject({ status: 'rejected', reason: { message: 'build failed' } });
    expect(results.filter((r) => r.status === 'fulfilled' && r.value)).toHaveLength(11);
    expect((await stored(key)).map((d) => d.total)).toEqual(Array.from({ length: 11 }, (_, i) => i + 1));
  });

  it('a position another process took since this one last looked is read past, and its total built on', async () => {
    const key = `wallet-e#${Date.now()}`;
    const [a, b] = [chainOf(first), chainOf(second)];
    expect(await spend(a, key, `${key}#d0`, 10, 100)).toMatchObject({ total: 10 });
    // The second process appends twice; the first still remembers its own head at position 1.
    await spend(b, key, `${key}#d1`, 10, 100);
    await spend(b, key, `${key}#d2`, 10, 100);
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => spend(a, key, `${key}#d${i + 3}`, 10, 100)));
    expect(results.filter(Boolean)).toHaveLength(7);
    expect((await stored(key)).map((d) => d.total)).toEqual([10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
  });
});
