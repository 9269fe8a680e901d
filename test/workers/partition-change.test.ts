import { afterAll, describe, expect, it } from 'vitest';
import { partitionOf } from '../../src/queues/index.ts';
import { settlementOwner } from '../../src/store/settlements.ts';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';
import { balances, finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';

/**
 * The whole service, real Redis and FerretDB: settlements whose holdback waits out its dispute window under K=1,
 * their timer jobs lost with the old queues, are released by the per-partition sweeps after a restart with K=4.
 * Their due records sit in partition 0's key (the key of old); the sweeps of K=4 find them there.
 */
describe('due settlements across a change of K', () => {
  const env = testEnv({ SWEEP_INTERVAL_MS: '3600000' });
  const apps: TestApp[] = [];
  afterAll(async () => {
    for (const app of apps.reverse()) await app.close();
  });

  it('releases every holdback recorded under K=1 after a restart with K=4, its timer job lost', async () => {
    const before = await startTestApp({ env, workers: ['finalize', 'settle'], dropOnClose: false });
    apps.push(before);
    const { auth } = await before.tenantWithKey(['agents:write', 'runs:write', 'wallets:write']);
    const p = await parties(before, auth, 10_000);
    const runIds: string[] = [];
    for (let i = 0; i < 4; i++) {
      const runId = await finalizedRun(before, auth, p, {
        pass: true,
        amount: 1_000,
        holdbackBps: 1_000,
        disputeWindowSeconds: 3,
      });
      expect((await settle(before, auth, runId)).statusCode).toBe(202);
      runIds.push(runId);
    }
    for (const runId of runIds)
      await waitSettlement(before, auth, runId, (s) => s.status === 'completed' && s.holdbackState === 'held');
    // Every settlement waits in partition 0's due key, the one K=1 writes.
    const dueIndex = before.runtime.stores.settlements.due;
    expect(await before.runtime.redis.zcard(dueIndex.dueKey(0))).toBe(runIds.length);
    // The restart: the old queues' waiting and delayed jobs (the holdback timers) are lost; the due records stay.
    await before.runtime.producers.queues.settle.drain(true);
    await before.runtime.producers.queues.finalize.drain(true);
    await before.close();
    apps.splice(apps.indexOf(before), 1);

    const after = await startTestApp({
      env: { ...env, vars: { ...env.vars, QUEUE_PARTITIONS: '4', SWEEP_INTERVAL_MS: '300' } },
      workers: ['finalize', 'settle'],
    });
    apps.push(after);
    for (const runId of runIds) await waitSettlement(after, auth, runId, (s) => s.holdbackState === 'released', 60_000);
    expect(await balances(after, auth, p.worker.agentId)).toEqual({ available: 4_000, escrow: 0 });
    expect(await balances(after, auth, p.payer.agentId)).toEqual({ available: 6_000, escrow: 0 });

    // A settlement made under K=4 waits in its own run's partition.
    const runId = await finalizedRun(after, auth, p, {
      pass: true,
      amount: 500,
      holdbackBps: 1_000,
      disputeWindowSeconds: 3_600,
    });
    expect((await settle(after, auth, runId)).statusCode).toBe(202);
    const held = await waitSettlement(after, auth, runId, (s) => s.holdbackState === 'held');
    const s = (await after.runtime.stores.settlements.get(held.settlementId as string))!;
    const home = partitionOf(settlementOwner(s), 4);
    expect(await after.runtime.redis.zscore(after.runtime.stores.settlements.due.dueKey(home), s._id)).not.toBeNull();
  });
});
