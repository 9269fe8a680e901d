import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { accountOf } from '../../src/store/ledger.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';
import { expectLedgerBalances } from '../x402/helpers.ts';

/**
 * A run's escrow is locked by the API (at run creation) and released by the settle worker: two processes posting on
 * the payer's escrow chain. The settle job carries where the API left the payer's chains, so the worker's release
 * claims past the API's locks without reading them first (issue 40: one payer paying for many runs at once).
 */
describe("run settlement: the settle job carries the API's heads of the payer's chains", () => {
  let worker: TestApp;
  let api: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    worker = await startTestApp({ workers: ['finalize', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    api = await startTestApp({ env: worker.env, dropOnClose: false });
    ({ auth } = await worker.tenantWithKey(['agents:write', 'runs:write', 'wallets:write']));
  });
  afterAll(async () => {
    await api?.close();
    await worker?.close();
  });

  it("the worker's release reads no posting of the payer's chains, however many locks the API made", async () => {
    const p = await parties(api, auth, 100_000);
    const payerAccounts = (['escrow', 'available'] as const).map((bucket) => accountOf(p.payer.agentId, 'USD', bucket));
    const workerReads: string[] = [];
    let counting = false;
    worker.runtime.mongo.on('commandStarted', (e) => {
      const id = e.commandName === 'find' ? (e.command.filter as { _id?: unknown } | undefined)?._id : undefined;
      if (counting && e.command.find === 'ledger_postings' && typeof id === 'string') workerReads.push(id);
    });
    const settled = async (runIds: string[]) => {
      for (const runId of runIds) expect((await settle(api, auth, runId)).statusCode).toBe(202);
      for (const runId of runIds) await waitSettlement(api, auth, runId, (s) => s.status === 'completed');
    };
    const finalized = (n: number) =>
      Promise.all(Array.from({ length: n }, () => finalizedRun(api, auth, p, { pass: true, amount: 1_000 })));
    // The worker meets the payer's chains once (its first release reads where they end).
    await settled(await finalized(1));
    counting = true;
    // Several locks by the API between two releases, and runs settled one after another.
    await settled(await finalized(3));
    await settled(await finalized(1));
    await settled(await finalized(2));
    counting = false;
    expect(workerReads.filter((id) => payerAccounts.some((a) => id.startsWith(`${a}#`)))).toEqual([]);
    // Each release was posted: 7 runs of 1,000 paid, nothing left in escrow.
    expect(await balances(api, auth, p.payer.agentId)).toEqual({ available: 100_000 - 7_000, escrow: 0 });
    expect(await balances(api, auth, p.worker.agentId)).toEqual({ available: 7_000, escrow: 0 });
    await expectLedgerBalances(api);
  });
});
