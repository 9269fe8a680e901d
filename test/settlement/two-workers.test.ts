import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobIdFor } from '../../src/queues/index.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, finalizedRun, parties, waitSettlement } from '../helpers/money.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));

describe('two worker processes racing on one settlement', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  const workers: ChildProcess[] = [];
  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize'] });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
  });
  afterAll(async () => {
    await Promise.all(
      workers.map(
        (w) =>
          new Promise((resolve) => {
            w.once('exit', resolve);
            w.kill('SIGTERM');
          }),
      ),
    );
    await t.close();
  });

  it('moves the money once, whichever process runs which copy of the work', async () => {
    const p = await parties(t, auth, 10_000);
    const runs = await Promise.all(
      [1, 2, 3].map(() =>
        finalizedRun(t, auth, p, { pass: true, amount: 1_000, holdbackBps: 2_000, disputeWindowSeconds: 1 }),
      ),
    );
    const failed = await finalizedRun(t, auth, p, { pass: false, amount: 500 });
    const tenantId = (await t.runtime.stores.runs.getAny(failed))!.tenantId;
    const settlementIds: string[] = [];
    for (const runId of [...runs, failed]) {
      const run = (await t.runtime.stores.runs.getAny(runId))!;
      const s = await t.runtime.stores.settlements.createOrGet({
        tenantId,
        runId,
        payerWalletId: p.payer.agentId,
        payeeWalletId: p.worker.agentId,
        amount: run.settlement!.amount,
        currency: 'USD',
        holdbackBps: run.settlement!.holdbackBps,
        disputeWindowSeconds: run.settlement!.disputeWindowSeconds,
      });
      settlementIds.push(s._id);
      // Several jobs for the same settlement, as the settle call, a retry and the sweeper may all produce.
      for (let copy = 0; copy < 6; copy++) {
        await t.runtime.producers.enqueue(
          'settle',
          { tenantId, runId, settlementId: s._id },
          jobIdFor('settle', s._id, `copy${copy}`),
        );
      }
    }
    for (let i = 0; i < 2; i++) {
      const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', 'worker', 'settle'], {
        cwd: root,
        env: { ...process.env, ...t.env.vars, WORKER_CONCURRENCY: '4', LOG_LEVEL: 'warn' },
        stdio: 'ignore',
      });
      workers.push(child);
    }
    // Two worker processes start (tsx compiles them) before any of this can happen: on a loaded machine that alone
    // has taken over 30 s, so the wait is for the outcome, with room for a slow minute.
    for (const runId of runs) await waitSettlement(t, auth, runId, (s) => s.holdbackState === 'released', 150_000);
    await waitSettlement(t, auth, failed, (s) => s.status === 'held', 60_000);

    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 3_000, escrow: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 6_500, escrow: 500 });
    const events = await t.runtime.stores.outbox.events
      .find({ type: { $in: ['settlement.completed', 'settlement.held'] } })
      .toArray();
    expect(events.map((e) => e.data.settlementId).sort()).toEqual([...settlementIds].sort());
  }, 300_000);
});
