import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, FailpointCrash } from '../../src/domain/failpoints.ts';
import { entryIds } from '../../src/domain/settlement.ts';
import { processMetrics } from '../../src/metrics.ts';
import { escrowEntryIds } from '../../src/services/escrow.ts';
import { auditLedger, type LedgerAuditReport } from '../../src/services/ledger-audit.ts';
import { bucketMove } from '../../src/store/ledger.ts';
import { settlementIdFor } from '../../src/store/settlements.ts';
import { createRun } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, credit, finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';

async function audit(t: TestApp, query = ''): Promise<LedgerAuditReport> {
  const res = await t.app.inject({ method: 'GET', url: `/ops/ledger/audit${query}`, headers: t.admin });
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

const kinds = (r: LedgerAuditReport) => r.violations.map((v) => v.kind);

describe('GET /ops/ledger/audit on real flows', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize', 'settle'],
      overrides: { SWEEP_INTERVAL_MS: '500', SWEEP_STALE_AFTER_MS: '0' },
    });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
  });
  afterAll(() => t.close());

  it('is clean after runs settled with holdback, held then ruled, disputed, credits and an open reserve; incremental, and full agrees', async () => {
    const p = await parties(t, auth, 20_000);
    await credit(t, p.payer.agentId, 700, 'EUR');
    // Pass with a holdback released at the window's end.
    const passed = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 1_500,
      disputeWindowSeconds: 1,
    });
    await settle(t, auth, passed);
    // Fail, held, then ruled both ways.
    const [failA, failB] = [
      await finalizedRun(t, auth, p, { pass: false, amount: 700 }),
      await finalizedRun(t, auth, p, { pass: false, amount: 300, currency: 'EUR' }),
    ];
    await settle(t, auth, failA);
    await settle(t, auth, failB);
    // A dispute ruled as a split.
    const disputed = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 2_000,
      disputeWindowSeconds: 3_600,
    });
    await settle(t, auth, disputed);
    // A run still in progress keeps its reserve: open, and legitimately so.
    await createRun(t, auth, {
      agentId: p.worker.agentId,
      settlement: { payerAgentId: p.payer.agentId, amount: 400, currency: 'USD' },
    });

    await waitSettlement(t, auth, passed, (s) => s.holdbackState === 'released');
    const heldA = await waitSettlement(t, auth, failA, (s) => s.status === 'held');
    const heldB = await waitSettlement(t, auth, failB, (s) => s.status === 'held');
    expect(
      (
        await t.app.inject({
          method: 'POST',
          url: `/ops/settlements/${heldA.settlementId}/resolve`,
          headers: t.admin,
          payload: { outcome: 'release' },
        })
      ).statusCode,
    ).toBe(200);
    expect(
      (
        await t.app.inject({
          method: 'POST',
          url: `/ops/settlements/${heldB.settlementId}/resolve`,
          headers: t.admin,
          payload: { outcome: 'refund' },
        })
      ).statusCode,
    ).toBe(200);
    await waitSettlement(t, auth, disputed, (s) => s.status === 'completed');
    const opened = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${disputed}/disputes`,
      headers: auth,
      payload: { reason: 'wrong' },
    });
    expect(opened.statusCode).toBe(201);
    const ruled = await t.app.inject({
      method: 'POST',
      url: `/ops/disputes/${opened.json().disputeId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'split', payerShareBps: 2_500 },
    });
    expect(ruled.json()).toMatchObject({ status: 'partially_refunded' });

    // A pass that dies halfway (after some accounts' checkpoints) leaves the next pass right.
    const store = t.runtime.stores.ledgerAudit;
    const saveAccount = store.saveAccount.bind(store);
    let saved = 0;
    store.saveAccount = (doc) => (++saved === 3 ? Promise.reject(new Error('crash mid-audit')) : saveAccount(doc));
    await expect(auditLedger(t.runtime, { waitMs: 10_000 })).rejects.toThrow('crash mid-audit');
    store.saveAccount = saveAccount;

    const first = await audit(t);
    expect(first.violations).toEqual([]);
    expect(first).toMatchObject({ clean: true, complete: true, incremental: true });
    const payer = await balances(t, auth, p.payer.agentId);
    expect(payer.escrow).toBe(400);
    expect(first.currencies.USD).toMatchObject({ escrow: 400, openReserves: 400 });
    expect(first.currencies.USD!.credits).toBe(first.currencies.USD!.available + first.currencies.USD!.escrow);
    expect(first.currencies.EUR).toMatchObject({ credits: 700, available: 700, escrow: 0, openReserves: 0 });
    expect(first.checked.openReserves).toBe(1);

    const full = await audit(t, '?full=true');
    const again = await audit(t);
    expect(full).toMatchObject({ clean: true, incremental: false, currencies: first.currencies });
    expect(full.checked.openReserves).toBe(first.checked.openReserves);
    expect(again).toMatchObject({ clean: true, currencies: first.currencies });
    const postings = await t.runtime.stores.ledger.postings.countDocuments();
    expect(full.checked.postingsRead).toBe(postings);
    // Nothing was posted since: the incremental pass reads one missing position per account, no posting.
    expect(again.checked.postingsRead).toBe(0);
    expect(again.checked.postingsRead).toBeLessThan(full.checked.postingsRead / 10);

    // New activity is read and nothing else.
    await credit(t, p.payer.agentId, 5);
    const after = await audit(t);
    expect(after.checked.postingsRead).toBe(1);
    expect(after).toMatchObject({ clean: true });
    expect(after.currencies.USD!.credits).toBe(first.currencies.USD!.credits + 5);

    expect(await processMetrics.getSingleMetricAsString('ledger_audit_last_run_timestamp_seconds')).toMatch(
      /ledger_audit_last_run_timestamp_seconds \d/,
    );
  }, 60_000);

  it('is for the admin only', async () => {
    const tenant = await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write']);
    const res = await t.app.inject({ method: 'GET', url: '/ops/ledger/audit', headers: tenant.auth });
    expect([401, 403]).toContain(res.statusCode);
    expect((await t.app.inject({ method: 'GET', url: '/ops/ledger/audit' })).statusCode).toBe(401);
  });
});

describe('GET /ops/ledger/audit finds money moved wrongly', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  // No sweeper runs here, so nothing repairs what the tests break. A sweep is 2.1 s.
  const SWEEP_MS = 2_100;
  beforeAll(async () => {
    t = await startTestApp({ overrides: { SWEEP_INTERVAL_MS: '100', SWEEP_STALE_AFTER_MS: '2000' } });
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write']));
  });
  afterAll(() => t.close());

  it('counts an entry between its legs as in flight, then reports it overdue', async () => {
    const p = await parties(t, auth, 1_000);
    await t.runtime.stores.ledger.ensureWallet(p.worker.agentId, tenantId, 'agent');
    const { ledger } = t.runtime.stores;
    ledger.failAfterLeg = (entryId, leg) => {
      if (entryId === 'test:half-posted' && leg === 0) throw new Error('crash between legs');
    };
    try {
      await expect(
        ledger.apply({
          _id: 'test:half-posted',
          tenantId,
          kind: 'test_transfer',
          currency: 'USD',
          legs: [
            { walletId: p.payer.agentId, bucket: 'available', delta: -10 },
            { walletId: p.worker.agentId, bucket: 'available', delta: 10 },
          ],
          ref: {},
        }),
      ).rejects.toThrow('crash between legs');
    } finally {
      ledger.failAfterLeg = null;
    }
    const during = await audit(t);
    expect(during.violations).toEqual([]);
    expect(during.checked.inFlightEntries).toBe(1);
    expect(during.currencies.USD).toMatchObject({ credits: 1_000, available: 990 });

    await new Promise((r) => setTimeout(r, SWEEP_MS + 200));
    const late = await audit(t);
    expect(late.violations).toContainEqual(
      expect.objectContaining({ kind: 'entry_overdue', detail: expect.stringContaining('test:half-posted') }),
    );
    expect(kinds(late)).not.toContain('sum_mismatch');

    // Finished by the sweeper's first duty: nothing left.
    expect(await ledger.finishStalledEntries(new Date(), 100)).toMatchObject({ failed: 0 });
    expect(kinds(await audit(t))).toEqual([]);
  });

  it('does not call an entry overdue whose first apply died after its due marker and a retry applied it', async () => {
    // The money chaos run met this: an API killed between the marker and the entry's record; the sweeper looked
    // before the retry recorded the entry (so it leaves the marker for a minute), then the retry applied it.
    const p = await parties(t, auth, 1_000);
    await t.runtime.stores.ledger.ensureWallet(p.worker.agentId, tenantId, 'agent');
    const { ledger } = t.runtime.stores;
    const entry = {
      _id: 'test:died-after-marker',
      tenantId,
      kind: 'test_transfer',
      currency: 'USD',
      legs: [
        { walletId: p.payer.agentId, bucket: 'available' as const, delta: -10 },
        { walletId: p.worker.agentId, bucket: 'available' as const, delta: 10 },
      ],
      ref: {},
    };
    armFailpoint('ledger.entry-started');
    await expect(ledger.apply(entry)).rejects.toThrow(FailpointCrash);
    expect(await ledger.finishStalledEntries(new Date(), 100)).toMatchObject({ failed: 0 });
    await new Promise((r) => setTimeout(r, SWEEP_MS + 200));
    // Nothing was recorded, so nothing moved and nothing is overdue.
    const died = await audit(t);
    expect(died.violations).toEqual([]);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_000, escrow: 0 });

    await ledger.apply(entry);
    const applied = await audit(t);
    expect(applied.violations).toEqual([]);
    expect(applied.checked.inFlightEntries).toBe(0);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 990, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 10, escrow: 0 });
  });

  it('reports a reserve paid out after it was returned (money taken from another run), and agrees with a full pass', async () => {
    const p = await parties(t, auth, 1_000);
    await t.runtime.stores.ledger.ensureWallet(p.worker.agentId, tenantId, 'agent');
    const settlement = { payerAgentId: p.payer.agentId, currency: 'USD' };
    const returned = await createRun(t, auth, {
      agentId: p.worker.agentId,
      settlement: { ...settlement, amount: 200 },
    });
    await createRun(t, auth, { agentId: p.worker.agentId, settlement: { ...settlement, amount: 300 } });
    expect(kinds(await audit(t))).toEqual([]);

    // Issue 22's bug, written straight to the ledger: the reserve goes back, then its settlement pays from escrow.
    const { ledger } = t.runtime.stores;
    await ledger.apply({
      _id: escrowEntryIds.unlock(returned),
      tenantId,
      kind: 'escrow_unlock',
      currency: 'USD',
      legs: bucketMove(p.payer.agentId, 'escrow', 'available', 200),
      ref: { runId: returned, generation: '1' },
    });
    const settlementId = settlementIdFor(returned);
    await ledger.apply({
      _id: entryIds.release(settlementId),
      tenantId,
      kind: 'settlement_release',
      currency: 'USD',
      legs: [
        { walletId: p.payer.agentId, bucket: 'escrow', delta: -200 },
        { walletId: p.worker.agentId, bucket: 'available', delta: 200 },
      ],
      ref: { settlementId, runId: returned },
    });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 700, escrow: 100 });

    const found = await audit(t);
    expect(found.clean).toBe(false);
    expect(found.violations).toContainEqual(
      expect.objectContaining({
        kind: 'reserve_negative',
        owner: settlementId,
        walletId: p.payer.agentId,
        currency: 'USD',
        amount: -200,
      }),
    );
    expect(kinds(found)).not.toContain('escrow_mismatch'); // the escrow still equals its reserves' sum: 300 - 200
    const full = await audit(t, '?full=true');
    expect(full.violations).toContainEqual(expect.objectContaining({ kind: 'reserve_negative', owner: settlementId }));
    expect(kinds(full)).not.toContain('checkpoint_mismatch');
    // It stays reported: the reserve went negative, whatever comes after.
    expect(kinds(await audit(t))).toContain('reserve_negative');
  });

  it('reports a reserve whose run does not exist, once a sweep has passed', async () => {
    const p = await parties(t, auth, 500);
    const ghost = 'run_doesnotexist';
    await t.runtime.stores.ledger.apply({
      _id: escrowEntryIds.lock(ghost),
      tenantId,
      kind: 'escrow_lock',
      currency: 'USD',
      legs: bucketMove(p.payer.agentId, 'available', 'escrow', 50),
      ref: { runId: ghost, generation: '1' },
    });
    const early = await audit(t);
    expect(early.violations.filter((v) => v.owner === settlementIdFor(ghost))).toEqual([]);
    await new Promise((r) => setTimeout(r, SWEEP_MS + 200));
    const late = await audit(t);
    expect(late.violations).toContainEqual(
      expect.objectContaining({
        kind: 'reserve_owner_missing',
        owner: settlementIdFor(ghost),
        amount: 50,
        walletId: p.payer.agentId,
      }),
    );
  });

  it('reports a settlement due for over an hour, or parked by its sweeper while still due', async () => {
    const { settlements, sweepParked } = t.runtime.stores;
    await settlements.due.mark('stl_late', tenantId, new Date(Date.now() - 2 * 3_600_000));
    await settlements.due.mark('stl_parked', tenantId, new Date(Date.now() + 3_600_000));
    await sweepParked.park('settlements', 'stl_parked');
    await sweepParked.park('settlements', 'stl_finished'); // its worker died parked; no longer due
    const found = await audit(t);
    expect(found.violations).toContainEqual(expect.objectContaining({ kind: 'settlement_stuck', owner: 'stl_late' }));
    expect(found.violations).toContainEqual(expect.objectContaining({ kind: 'settlement_stuck', owner: 'stl_parked' }));
    expect(found.violations.filter((v) => v.owner === 'stl_finished')).toEqual([]);
    expect((await sweepParked.list('settlements', 10)).map((p) => p.id)).toEqual(['stl_parked']);
  });

  it('reports escrow that belongs to no reserve', async () => {
    const p = await parties(t, auth, 0);
    await t.runtime.stores.ledger.ensureWallet(p.payer.agentId, tenantId, 'agent');
    await t.runtime.stores.ledger.apply({
      _id: 'test:credit-into-escrow',
      tenantId,
      kind: 'credit',
      currency: 'USD',
      legs: [{ walletId: p.payer.agentId, bucket: 'escrow', delta: 5 }],
      ref: {},
    });
    const found = await audit(t);
    expect(found.violations).toContainEqual(
      expect.objectContaining({ kind: 'escrow_unattributed', walletId: p.payer.agentId, amount: 5 }),
    );
    expect(found.violations).toContainEqual(
      expect.objectContaining({ kind: 'escrow_mismatch', walletId: p.payer.agentId, amount: 5 }),
    );
    // The mismatch is a standing fact of the checkpoints, so every later pass says it again.
    expect(kinds(await audit(t))).toContain('escrow_mismatch');
  });
});
