import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import { advanceSettlement } from '../../src/services/settlement.ts';
import { RUN_GRACE_MS } from '../../src/store/ledger.ts';
import { settlementIdFor } from '../../src/store/settlements.ts';
import { createSettleProcessor } from '../../src/workers/settle.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { appendEvents, events, waitFinalized } from '../helpers/agents.ts';
import { balances, parties, settle, type Parties } from '../helpers/money.ts';

// Crash points of the run money flows (issue 22, item 6): for every step between a flow's first and last durable
// write, the request (or the worker's pass) stops right there, the sweepers run, the client retries with the same
// Idempotency-Key, and the money must end exactly where one uninterrupted flow leaves it. No settle worker runs:
// the sweeps and the retried passes below are the only things that move money.

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const FUNDS = 1_000;

/** Every crash point between the first and the last durable write of a run's escrow lock and its terms. */
const LOCK_POINTS = ['ledger.position-claimed', 'ledger.leg-posted', 'run.escrow.locked', 'run.escrow.attached'];

describe('crash points of the run money flows', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let sweep: () => Promise<unknown>;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize'],
      overrides: { SWEEP_INTERVAL_MS: '3600000', SWEEP_STALE_AFTER_MS: '0' },
    });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
    sweep = createSettleProcessor(t.runtime).sweep!;
  });
  afterEach(() => disarmFailpoints());
  afterAll(() => t.close());

  /** What a crash leaves is finished by the sweepers (locks are looked at once their grace has passed). */
  async function sweepAfterCrash() {
    await sleep(RUN_GRACE_MS + 100);
    await sweep();
  }

  async function finalize(p: Parties, runId: string, value = 1) {
    const batch = events(runId, { seq: 0, chainHash: null }, p.worker, [
      { type: 'metric', payload: { name: 'accuracy', value } },
    ]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    expect((await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth })).statusCode).toBe(
      202,
    );
    await waitFinalized(t, auth, runId);
  }

  /** Payer and payee hold exactly what one uninterrupted flow leaves: `paid` moved once, nothing stuck in escrow. */
  async function expectSettledOnce(p: Parties, paid: number) {
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: FUNDS - paid, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: paid, escrow: 0 });
    await expectCleanAudit(t);
  }

  for (const point of LOCK_POINTS) {
    it(`run create with escrow, crashed at ${point}, then swept and retried: one run, paid once`, async () => {
      const p = await parties(t, auth, FUNDS);
      const body = {
        agentId: p.worker.agentId,
        terms: { accuracy: { min: 0.9 } },
        settlement: { payerAgentId: p.payer.agentId, amount: 300, currency: 'USD' },
      };
      const keyed = { ...auth, 'idempotency-key': `create-${point}-${p.worker.agentId}` };
      armFailpoint(point);
      expect((await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed, payload: body })).statusCode).toBe(
        500,
      );
      await sweepAfterCrash();
      const retry = await t.app.inject({ method: 'POST', url: '/v1/runs', headers: keyed, payload: body });
      expect(retry.statusCode, retry.body).toBe(201);
      expect(await t.runtime.db.collection('runs').countDocuments({ agentId: p.worker.agentId })).toBe(1);
      const runId = retry.json().runId as string;
      expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 700, escrow: 300 });

      await finalize(p, runId);
      expect((await settle(t, auth, runId)).statusCode).toBe(202);
      await sweep();
      await expectSettledOnce(p, 300);
    });

    it(`settle with terms, crashed at ${point}, then swept and retried: paid once from the run's own reserve`, async () => {
      const p = await parties(t, auth, FUNDS);
      const created = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: { agentId: p.worker.agentId, terms: { accuracy: { min: 0.9 } } },
      });
      const runId = created.json().runId as string;
      await finalize(p, runId);
      const terms = { settlement: { payerAgentId: p.payer.agentId, amount: 400, currency: 'USD' } };
      const keyed = { ...auth, 'idempotency-key': `settle-${point}-${runId}` };
      armFailpoint(point);
      expect((await settle(t, keyed, runId, terms)).statusCode).toBe(500);
      await sweepAfterCrash();
      const retry = await settle(t, keyed, runId, terms);
      expect(retry.statusCode, retry.body).toBe(202);
      await sweep();
      await expectSettledOnce(p, 400);
    });
  }

  for (const point of ['run.reserve.return-claimed', 'run.reserve.returned']) {
    it(`the sweeper returning an orphaned reserve, crashed at ${point}: returned once, and the client's retry pays once`, async () => {
      const p = await parties(t, auth, FUNDS);
      const created = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: { agentId: p.worker.agentId, terms: { accuracy: { min: 0.9 } } },
      });
      const runId = created.json().runId as string;
      await finalize(p, runId);
      const terms = { settlement: { payerAgentId: p.payer.agentId, amount: 350, currency: 'USD' } };
      const keyed = { ...auth, 'idempotency-key': `orphan-${point}-${runId}` };
      armFailpoint('run.escrow.locked');
      expect((await settle(t, keyed, runId, terms)).statusCode).toBe(500); // an orphaned reserve of 350
      armFailpoint(point);
      await sleep(RUN_GRACE_MS + 100);
      expect(await sweep()).toMatchObject({ reservesFailed: 1 }); // the sweeper's look crashed there
      await sleep(5_100); // that reserve's own backoff
      expect(await sweep()).toMatchObject({ reservesFailed: 0 });
      expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: FUNDS, escrow: 0 });
      expect(
        await t.runtime.stores.outbox.events.countDocuments({ type: 'escrow.returned', 'data.runId': runId }),
      ).toBe(1);
      expect((await settle(t, keyed, runId, terms)).statusCode).toBe(202);
      await sweep();
      await expectSettledOnce(p, 350);
    });
  }

  const SETTLE_POINTS = [
    'settlement.reserve-captured',
    'ledger.position-claimed',
    'ledger.leg-posted',
    'settlement.released',
    'settlement.decided',
  ];
  for (const point of SETTLE_POINTS) {
    it(`the worker's settlement with holdback, crashed at ${point}, then run again: release and holdback once each`, async () => {
      const p = await parties(t, auth, FUNDS);
      const created = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: {
          agentId: p.worker.agentId,
          terms: { accuracy: { min: 0.9 } },
          settlement: {
            payerAgentId: p.payer.agentId,
            amount: 500,
            currency: 'USD',
            holdbackBps: 2_000,
            disputeWindowSeconds: 1,
          },
        },
      });
      const runId = created.json().runId as string;
      await finalize(p, runId);
      armFailpoint(point);
      // The settle request only enqueues the job (no worker runs here); the job's pass is what crashes.
      expect((await settle(t, auth, runId)).statusCode).toBe(202);
      await expect(advanceSettlement(t.runtime, settlementIdFor(runId))).rejects.toBeInstanceOf(FailpointCrash);
      await advanceSettlement(t.runtime, settlementIdFor(runId)); // the job's retry
      expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 400, escrow: 0 });
      await sleep(1_100); // the dispute window ends: the holdback is released by the next pass
      armFailpoint('settlement.holdback-released');
      await expect(advanceSettlement(t.runtime, settlementIdFor(runId))).rejects.toBeInstanceOf(FailpointCrash);
      await advanceSettlement(t.runtime, settlementIdFor(runId));
      await expectSettledOnce(p, 500);
    });
  }

  const RULING_POINTS = [
    'dispute.ruled',
    'settlement.dispute-payer-paid',
    'ledger.leg-posted',
    'settlement.dispute-payee-paid',
  ];
  for (const point of RULING_POINTS) {
    it(`a dispute ruling, crashed at ${point}, then retried with the same key: the holdback split once`, async () => {
      const p = await parties(t, auth, FUNDS);
      const created = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: {
          agentId: p.worker.agentId,
          terms: { accuracy: { min: 0.9 } },
          settlement: {
            payerAgentId: p.payer.agentId,
            amount: 600,
            currency: 'USD',
            holdbackBps: 5_000,
            disputeWindowSeconds: 3_600,
          },
        },
      });
      const runId = created.json().runId as string;
      await finalize(p, runId);
      expect((await settle(t, auth, runId)).statusCode).toBe(202);
      await advanceSettlement(t.runtime, settlementIdFor(runId));
      const opened = await t.app.inject({
        method: 'POST',
        url: `/v1/runs/${runId}/disputes`,
        headers: auth,
        payload: { reason: 'wrong answers' },
      });
      expect(opened.statusCode, opened.body).toBe(201);
      const url = `/ops/disputes/${opened.json().disputeId}/resolve`;
      const keyed = { ...t.admin, 'idempotency-key': `rule-${point}-${runId}` };
      armFailpoint(point);
      expect(
        (
          await t.app.inject({
            method: 'POST',
            url,
            headers: keyed,
            payload: { outcome: 'split', payerShareBps: 5_000 },
          })
        ).statusCode,
      ).toBe(500);
      const retry = await t.app.inject({
        method: 'POST',
        url,
        headers: keyed,
        payload: { outcome: 'split', payerShareBps: 5_000 },
      });
      expect(retry.statusCode, retry.body).toBe(200);
      expect(retry.json()).toMatchObject({ status: 'partially_refunded', releasedAmount: 450, refundedAmount: 150 });
      expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: FUNDS - 600 + 150, escrow: 0 });
      expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 450, escrow: 0 });
      await expectCleanAudit(t);
    });
  }

  it('a settlement with nothing held leaves the sweeper nothing; its dispute, crashed before the announcement, is announced by a sweep', async () => {
    const p = await parties(t, auth, FUNDS);
    const created = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: auth,
      payload: {
        agentId: p.worker.agentId,
        terms: { accuracy: { min: 0.9 } },
        settlement: { payerAgentId: p.payer.agentId, amount: 300, currency: 'USD', disputeWindowSeconds: 3_600 },
      },
    });
    const runId = created.json().runId as string;
    await finalize(p, runId);
    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    const settled = await advanceSettlement(t.runtime, settlementIdFor(runId));
    expect(settled?.view).toMatchObject({ status: 'completed', holdbackState: 'none', final: false });
    // Completed with nothing held: the window's end changes nothing the sweeper would do, so it has no record.
    expect(await t.runtime.stores.settlements.due.records.findOne({ _id: settlementIdFor(runId) })).toBeNull();
    armFailpoint('dispute.opened');
    const opened = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${runId}/disputes`,
      headers: auth,
      payload: { reason: 'wrong answers' },
    });
    expect(opened.statusCode).toBe(500);
    const announced = () =>
      t.runtime.stores.outbox.events.find({ type: 'dispute.opened', 'data.runId': runId }).toArray();
    expect(await announced()).toEqual([]);
    // The client's retry is refused (the dispute exists); the sweep announces it, once, and keeps it due for its ruling.
    expect(
      (
        await t.app.inject({
          method: 'POST',
          url: `/v1/runs/${runId}/disputes`,
          headers: auth,
          payload: { reason: 'wrong answers' },
        })
      ).statusCode,
    ).toBe(409);
    await sweep();
    await sweep();
    const events = await announced();
    expect(events).toHaveLength(1);
    expect(events[0]!.data).toMatchObject({
      runId,
      settlementId: settlementIdFor(runId),
      disputeId: expect.stringMatching(/^dsp_/),
    });
    expect(
      (await t.runtime.stores.settlements.due.records.findOne({ _id: settlementIdFor(runId) }))?.dueAt.getTime(),
    ).toBeGreaterThan(Date.now() + 30 * 60_000);
    await expectSettledOnce(p, 300);
  });

  for (const point of ['ledger.position-claimed', 'ledger.leg-posted']) {
    it(`a credit, crashed at ${point}, then retried with the same key: credited once`, async () => {
      const p = await parties(t, auth, 0);
      const url = `/ops/wallets/${encodeURIComponent(p.payer.agentId)}/credit`;
      const keyed = { ...t.admin, 'idempotency-key': `credit-${point}-${p.payer.agentId}` };
      armFailpoint(point);
      expect(
        (
          await t.app.inject({
            method: 'POST',
            url,
            headers: keyed,
            payload: { amount: 250, currency: 'USD', reference: 'wire-1' },
          })
        ).statusCode,
      ).toBe(500);
      const retry = await t.app.inject({
        method: 'POST',
        url,
        headers: keyed,
        payload: { amount: 250, currency: 'USD', reference: 'wire-1' },
      });
      expect(retry.statusCode, retry.body).toBe(201);
      await sweep();
      expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 250, escrow: 0 });
      await expectCleanAudit(t);
    });
  }
});
