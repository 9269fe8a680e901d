import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints } from '../../src/domain/failpoints.ts';
import { processMetrics } from '../../src/metrics.ts';
import { settlementIdFor } from '../../src/store/settlements.ts';
import { RUN_GRACE_MS } from '../../src/store/ledger.ts';
import { createSettleProcessor } from '../../src/workers/settle.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { appendEvents, createRun, events, waitFinalized } from '../helpers/agents.ts';
import { balances, credit, finalizedRun, parties, settle, type Parties } from '../helpers/money.ts';

// Escrow reserves have one owner and one fate (docs/money.md, "Money guarantees"): these are the reproductions of issue
// 22's "money moved twice" and "locked for good" cases, with the request stopped at a crash point and the client
// retrying. No settle worker runs here: the sweeps below are the only thing that moves settlements and reserves, so
// each step is seen exactly.

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function failuresCounted(sweeper: string): Promise<number> {
  const metric = (await processMetrics.getMetricsAsJSON()).find((m) => m.name === 'sweep_item_failures_total');
  return (metric?.values ?? []).filter((v) => v.labels.sweeper === sweeper).reduce((sum, v) => sum + v.value, 0);
}

/** A run of the worker without settlement terms, finalized with a passing metric. */
async function finalizedRunWithoutTerms(t: TestApp, auth: Record<string, string>, p: Parties): Promise<string> {
  const runId = await createRun(t, auth, { agentId: p.worker.agentId, terms: { accuracy: { min: 0.9 } } });
  const batch = events(runId, { seq: 0, chainHash: null }, p.worker, [
    { type: 'metric', payload: { name: 'accuracy', value: 1 } },
  ]);
  expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
  expect((await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth })).statusCode).toBe(
    202,
  );
  await waitFinalized(t, auth, runId);
  return runId;
}

describe('escrow reserves: one owner, one fate', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let sweep: () => Promise<Record<string, number>>;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize'],
      overrides: { SWEEP_INTERVAL_MS: '3600000', SWEEP_STALE_AFTER_MS: '0' },
    });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
    const processor = createSettleProcessor(t.runtime);
    sweep = () => processor.sweep!() as Promise<Record<string, number>>;
  });
  afterEach(() => disarmFailpoints());
  afterAll(() => t.close());

  it('settle-with-terms killed after its lock, swept, then retried: the money moves once and no other run is robbed', async () => {
    const p = await parties(t, auth, 1_000);
    const other = await finalizedRun(t, auth, p, { pass: true, amount: 300 }); // owes 300 from the same escrow
    const runId = await finalizedRunWithoutTerms(t, auth, p);
    const terms = { settlement: { payerAgentId: p.payer.agentId, amount: 200, currency: 'USD' } };
    const keyed = { ...auth, 'idempotency-key': `settle-${runId}` };

    armFailpoint('run.escrow.locked');
    expect((await settle(t, keyed, runId, terms)).statusCode).toBe(500);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 500, escrow: 500 });
    // The sweeper finds a reserve whose run holds no terms: an orphan, returned (an entry and an event).
    await sleep(RUN_GRACE_MS + 100);
    expect(await sweep()).toMatchObject({ unlocked: 1, reservesFailed: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 700, escrow: 300 });
    expect(await t.runtime.stores.outbox.events.countDocuments({ type: 'escrow.returned', 'data.runId': runId })).toBe(
      1,
    );

    // The client's honest retry: a new reserve is locked for the run, and the settlement pays from it.
    const retry = await settle(t, keyed, runId, terms);
    expect(retry.statusCode, retry.body).toBe(202);
    await sweep();
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 500, escrow: 300 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 200, escrow: 0 });

    // The other run's reserve is intact and settles in full.
    expect((await settle(t, auth, other)).statusCode).toBe(202);
    await sweep();
    expect(
      (await t.app.inject({ method: 'GET', url: `/runs/${other}/settlement`, headers: auth })).json(),
    ).toMatchObject({ status: 'completed', releasedAmount: 300 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 500, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 500, escrow: 0 });
    // Nothing left for the reserve sweeper to return: both reserves were captured by their settlements.
    await sleep(RUN_GRACE_MS + 100);
    expect(await sweep()).toMatchObject({ unlocked: 0 });
  });

  it('a settlement racing the sweeper for a reserve: whoever claims first decides, the other follows', async () => {
    const p = await parties(t, auth, 1_000);
    const runId = await finalizedRun(t, auth, p, { pass: true, amount: 400 });
    // The sweeper got there first (say, the reserve's deadline passed): it is returned, not paid out.
    const lockId = `escrow:${runId}:lock`;
    expect(await t.runtime.stores.reserves.claim(lockId, 'returned', 'deadline')).toMatchObject({ fate: 'returned' });
    const lock = (await t.runtime.stores.ledger.getEntry(lockId))!;
    const { reconcileRunReserve } = await import('../../src/services/escrow.ts');
    expect(await reconcileRunReserve(t.runtime, lock)).toBe(true);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_000, escrow: 0 });
    // The settlement cannot take what was returned: it locks the run's amount anew from the payer, then pays.
    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    await sweep();
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 600, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 400, escrow: 0 });
    expect(await t.runtime.stores.reserves.fateOf(`escrow:${runId}:lock:2`)).toMatchObject({
      fate: 'captured',
      by: settlementIdFor(runId),
    });
    // The sweeper's second look at the returned reserve changes nothing.
    expect(await reconcileRunReserve(t.runtime, lock)).toBe(true);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 600, escrow: 0 });
  });

  it('a run create that failed after its lock is finished by the retry with the same key, never made twice', async () => {
    const p = await parties(t, auth, 1_000);
    const body = {
      agentId: p.worker.agentId,
      settlement: { payerAgentId: p.payer.agentId, amount: 250, currency: 'USD' },
    };
    const keyed = { ...auth, 'idempotency-key': `create-${p.worker.agentId}` };
    armFailpoint('run.escrow.locked');
    expect((await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed, payload: body })).statusCode).toBe(
      500,
    );
    const retry = await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed, payload: body });
    expect(retry.statusCode, retry.body).toBe(201);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 750, escrow: 250 });
    expect(await t.runtime.db.collection('runs').countDocuments({ agentId: p.worker.agentId })).toBe(1);
    // The reserve has its run: the sweeper leaves it alone.
    await sleep(RUN_GRACE_MS + 100);
    await sweep();
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 750, escrow: 250 });

    // The retry after the run was stored (its answer lost, say) answers the same run.
    armFailpoint('run.escrow.attached');
    const keyed2 = { ...auth, 'idempotency-key': `create2-${p.worker.agentId}` };
    expect((await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed2, payload: body })).statusCode).toBe(
      500,
    );
    const again = await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed2, payload: body });
    expect(again.statusCode, again.body).toBe(201);
    expect(await t.runtime.db.collection('runs').countDocuments({ agentId: p.worker.agentId })).toBe(2);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 500, escrow: 500 });

    // A key reused for another request, after the first failed, is refused and moves nothing.
    armFailpoint('run.escrow.attached');
    const keyed3 = { ...auth, 'idempotency-key': `create3-${p.worker.agentId}` };
    expect((await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed3, payload: body })).statusCode).toBe(
      500,
    );
    const reused = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: keyed3,
      payload: { ...body, terms: { accuracy: { min: 0.5 } } },
    });
    expect(reused.statusCode).toBe(422);
    expect(reused.json()).toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 250, escrow: 750 });
    // The key still belongs to the run its first request made: that request, sent again, resumes it.
    const resumed = await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed3, payload: body });
    expect(resumed.statusCode, resumed.body).toBe(201);
    expect(await t.runtime.db.collection('runs').countDocuments({ agentId: p.worker.agentId })).toBe(3);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 250, escrow: 750 });
  });

  it('one failing settlement backs off alone: the sweep settles every other one, and counts the failure', async () => {
    const p = await parties(t, auth, 1_000);
    // A settlement the worker cannot advance (its run was never finalized), due before the good one.
    const stuckRun = await createRun(t, auth, {
      agentId: p.worker.agentId,
      settlement: { payerAgentId: p.payer.agentId, amount: 100, currency: 'USD' },
    });
    const run = (await t.runtime.stores.runs.getAny(stuckRun))!;
    await t.runtime.stores.settlements.createOrGet({
      tenantId: run.tenantId,
      runId: stuckRun,
      payerWalletId: p.payer.agentId,
      payeeWalletId: p.worker.agentId,
      amount: 100,
      currency: 'USD',
      holdbackBps: 0,
      disputeWindowSeconds: 60,
    });
    const goodRun = await finalizedRun(t, auth, p, { pass: true, amount: 300 });
    expect((await settle(t, auth, goodRun)).statusCode).toBe(202);

    const counted = await failuresCounted('settlements');
    expect(await sweep()).toMatchObject({ settlementsFailed: 1 });
    expect(await failuresCounted('settlements')).toBe(counted + 1);
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 300, escrow: 0 });
    // It backs off: the next sweep does not look at it again at once.
    expect(await sweep()).toMatchObject({ settlementsFailed: 0 });
  });

  it('a credit that would pass the balance limit is refused before any leg posts; the money stays where it was', async () => {
    const p = await parties(t, auth, 100);
    await credit(t, p.worker.agentId, Number.MAX_SAFE_INTEGER - 50);
    const runId = await finalizedRun(t, auth, p, { pass: true, amount: 100 });
    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    expect(await sweep()).toMatchObject({ settlementsFailed: 1, entriesFailed: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 0, escrow: 100 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: Number.MAX_SAFE_INTEGER - 50, escrow: 0 });
    expect(await t.runtime.stores.ledger.getEntry(`settle:${settlementIdFor(runId)}:release`)).toBeNull();

    // A plain credit past the limit: 409, nothing recorded, nothing for the ledger sweeper to retry forever.
    const res = await t.app.inject({
      method: 'POST',
      url: `/ops/wallets/${p.worker.agentId}/credit`,
      headers: t.admin,
      payload: { amount: 100, currency: 'USD', reference: 'too-much' },
    });
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ code: 'BALANCE_LIMIT' });
    await sleep(10);
    expect(await sweep()).toMatchObject({ entries: 0, entriesFailed: 0 });
  });

  it('an entry id asked again for another movement (another wallet, amount or currency) is refused whole', async () => {
    const p = await parties(t, auth, 500);
    const { ledger } = t.runtime.stores;
    const entry = (walletId: string, amount: number) => ({
      _id: `test:${p.payer.agentId}:move`,
      tenantId: 'ten_x',
      kind: 'test_move',
      currency: 'USD',
      legs: [
        { walletId, bucket: 'available' as const, delta: -amount },
        { walletId, bucket: 'escrow' as const, delta: amount },
      ],
      ref: {},
    });
    await ledger.apply(entry(p.payer.agentId, 100));
    await ledger.ensureWallet(p.worker.agentId, 'ten_x', 'agent');
    await expect(ledger.apply(entry(p.worker.agentId, 100))).rejects.toMatchObject({
      status: 409,
      code: 'TRANSITION_ILLEGAL',
    });
    await expect(ledger.apply(entry(p.payer.agentId, 101))).rejects.toMatchObject({
      status: 409,
      code: 'TRANSITION_ILLEGAL',
    });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 400, escrow: 100 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 0, escrow: 0 });
  });

  it('settle with terms retried with other terms after its first reserve was returned: the new terms are locked and paid once', async () => {
    const p = await parties(t, auth, 1_000);
    const runId = await finalizedRunWithoutTerms(t, auth, p);
    armFailpoint('run.escrow.locked');
    expect(
      (await settle(t, auth, runId, { settlement: { payerAgentId: p.payer.agentId, amount: 300, currency: 'USD' } }))
        .statusCode,
    ).toBe(500);
    await sleep(RUN_GRACE_MS + 100);
    expect(await sweep()).toMatchObject({ unlocked: 1 });
    expect(
      (await settle(t, auth, runId, { settlement: { payerAgentId: p.payer.agentId, amount: 250, currency: 'USD' } }))
        .statusCode,
    ).toBe(202);
    await sweep();
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 750, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 250, escrow: 0 });
  });

  it('credit references cannot collide across wallet ids that contain ":"', async () => {
    const { tenantId } = await t.tenantWithKey(['wallets:write']);
    const a = await t.app.inject({
      method: 'POST',
      url: `/ops/wallets/${encodeURIComponent('acme:ops')}/credit`,
      headers: t.admin,
      payload: { tenantId, amount: 100, currency: 'USD', reference: 'x' },
    });
    const b = await t.app.inject({
      method: 'POST',
      url: `/ops/wallets/acme/credit`,
      headers: t.admin,
      payload: { tenantId, amount: 100, currency: 'USD', reference: 'ops:x' },
    });
    expect([a.statusCode, b.statusCode]).toEqual([201, 201]);
    expect(a.json().balances.USD).toEqual({ available: 100, escrow: 0 });
    expect(b.json().balances.USD).toEqual({ available: 100, escrow: 0 });
  });
});

/**
 * Long enough that a run is created and finalized well before it even on a loaded machine (3 s was not: a CI minute
 * with two busy cores took longer, and the "still in time" sweep returned the reserve).
 */
const DEADLINE_SECONDS = 15;

describe('escrow reserves: deadlines', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize'],
      overrides: {
        SWEEP_INTERVAL_MS: '3600000',
        SWEEP_STALE_AFTER_MS: '0',
        RUN_RESERVE_DEADLINE_SECONDS: String(DEADLINE_SECONDS),
      },
    });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
  });
  afterAll(() => t.close());

  it('a reserve its run never settled goes back to the payer at its deadline; settling later locks again and pays once', async () => {
    const sweep = createSettleProcessor(t.runtime).sweep!;
    const p = await parties(t, auth, 1_000);
    const lockedBy = Date.now() + DEADLINE_SECONDS * 1000; // the reserve is locked after this, so due no earlier
    const runId = await finalizedRun(t, auth, p, { pass: true, amount: 400 });
    await sleep(RUN_GRACE_MS + 100);
    expect(await sweep()).toMatchObject({ unlocked: 0 }); // owned and in time
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 600, escrow: 400 });
    await sleep(Math.max(0, lockedBy + 1_000 - Date.now()));
    expect(await sweep()).toMatchObject({ unlocked: 1 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_000, escrow: 0 });
    const returned = await t.runtime.stores.outbox.events.findOne({ type: 'escrow.returned', 'data.runId': runId });
    expect(returned?.data).toMatchObject({ runId, amount: 400, currency: 'USD', reason: 'deadline' });

    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    await sweep();
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 600, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 400, escrow: 0 });
  }, 90_000);
});
