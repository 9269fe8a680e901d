import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import { createProcessors } from '../../src/workers/index.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, expectLedgerBalances, gateParties, get, post, quote, X402_SCOPES } from './helpers.ts';

// Escalations that do not wait forever: a deadline from the wallet's policy (default 15 minutes), denied by itself
// past it (reason deadline_passed, decided by `deadline`) with the gate's reserve returned and a webhook event;
// decisions with a reason and who decided; a stale decision refused with its own code; bulk decisions; and the
// deadline's denial crashed between its durable writes, then swept again, ending in one outcome.

const FUNDS = 1_000;
const AMOUNT = 500;

describe('x402 escalation deadlines and decisions', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let keyId: string;
  let processors: ProcessorMap;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle'],
      overrides: { RATE_LIMIT_MAX: '100000', SWEEP_STALE_AFTER_MS: '0', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth, keyId } = await t.tenantWithKey([...X402_SCOPES, 'x402:read', 'wallets:read']));
    processors = createProcessors(t.runtime);
  });
  afterAll(() => t.close());
  afterEach(() => disarmFailpoints());

  const authorize = (body: Record<string, unknown>) => post(t, auth, '/x402/gate/authorize-payment', body);
  const eventsOf = (type: string, escalationId: string) =>
    t.runtime.stores.outbox.events.find({ type: type as never, 'data.escalationId': escalationId } as never).toArray();

  /** A gate whose payer's policy caps calls at 100 (escalations waiting `timeout` seconds, or the default), escalated. */
  async function escalated(timeout?: number) {
    const { payer, payee } = await gateParties(t, auth, FUNDS);
    const policy = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: auth,
      payload: { currency: 'USD', perCallLimit: 100, ...(timeout ? { escalationTimeoutSeconds: timeout } : {}) },
    });
    expect(policy.statusCode, policy.body).toBe(200);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: AMOUNT });
    const q = await quote(t, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };
    const breach = await authorize(body);
    expect(breach.json()).toMatchObject({ code: 'X402_AUTHORIZATION_ESCALATION_REQUIRED' });
    const escalationId = breach.json().details.escalationId as string;
    const escalation = (await get(t, auth, `/x402/gate/escalations?gateId=${gate.gateId}`)).json().items[0];
    return {
      payer,
      payee,
      gateId: gate.gateId,
      body,
      escalationId,
      deadlineAt: new Date(escalation.deadlineAt),
      escalation,
    };
  }

  /** Waits until the clock is past `at` (a condition, not a fixed sleep). */
  async function until(at: Date) {
    while (Date.now() <= at.getTime())
      await new Promise((r) => setTimeout(r, Math.max(10, at.getTime() - Date.now() + 5)));
  }

  async function sweep() {
    return (await processors['x402-verify']!.sweep!()) as {
      escalations: { looked: number; denied: number; failed: number };
    };
  }

  const escalationView = async (gateId: string) =>
    (await get(t, auth, `/x402/gate/escalations?gateId=${gateId}`)).json().items[0];

  it('the deadline comes from the wallet policy (default 15 minutes), and the policy shows it', async () => {
    const standard = await escalated();
    expect(standard.deadlineAt.getTime() - new Date(standard.escalation.createdAt).getTime()).toBe(900_000);
    const policy = (await get(t, auth, `/x402/wallets/${encodeURIComponent(standard.payer)}/policy`)).json();
    expect(policy.escalationTimeoutSeconds).toBe(900);

    const short = await escalated(120);
    expect(short.deadlineAt.getTime() - new Date(short.escalation.createdAt).getTime()).toBe(120_000);
    // Before its deadline, a sweep leaves it waiting.
    await sweep();
    expect((await escalationView(short.gateId)).status).toBe('pending');
  });

  it('past its deadline: a stale approve is refused and changes nothing; the sweep denies it, returns the reserve and says so', async () => {
    const e = await escalated(1);
    expect(await balances(t, auth, e.payer)).toEqual({ available: FUNDS - AMOUNT, escrow: AMOUNT });
    await until(e.deadlineAt);

    const stale = await post(t, auth, `/x402/gate/escalations/${e.escalationId}/resolve`, {
      action: 'approve',
      reason: 'too late',
    });
    expect(stale.statusCode).toBe(409);
    expect(stale.json()).toMatchObject({
      code: 'X402_ESCALATION_DEADLINE_PASSED',
      details: { deadlineAt: e.deadlineAt.toISOString() },
    });
    expect(await escalationView(e.gateId)).toMatchObject({ status: 'pending', resolution: null });
    expect(await balances(t, auth, e.payer)).toEqual({ available: FUNDS - AMOUNT, escrow: AMOUNT });

    expect((await sweep()).escalations.denied).toBeGreaterThanOrEqual(1);
    expect(await escalationView(e.gateId)).toMatchObject({
      status: 'denied',
      resolution: { action: 'deny', reason: 'deadline_passed', by: 'deadline' },
    });
    expect(await balances(t, auth, e.payer)).toEqual({ available: FUNDS, escrow: 0 });
    expect((await get(t, auth, `/x402/gate/${e.gateId}`)).json().status).toBe('expired');
    const denied = await eventsOf('x402.escalation.denied', e.escalationId);
    expect(denied).toHaveLength(1);
    expect(denied[0]!.data).toMatchObject({
      escalationId: e.escalationId,
      reason: 'deadline_passed',
      decidedBy: 'deadline',
      deadlineAt: e.deadlineAt.toISOString(),
    });
    const expired = await t.runtime.stores.outbox.events
      .find({ type: 'x402.gate.expired' as never, 'data.gateId': e.gateId } as never)
      .toArray();
    expect(expired.map((x) => x.data.reason)).toEqual(['escalation_deadline']);

    // Decided now: a late decision is the "already decided" conflict, and the payment stays refused.
    const late = await post(t, auth, `/x402/gate/escalations/${e.escalationId}/resolve`, { action: 'approve' });
    expect(late.json()).toMatchObject({
      code: 'X402_ESCALATION_TERMINAL',
      details: { status: 'denied', reason: 'deadline_passed', decidedBy: 'deadline' },
    });
    await sweep();
    expect(await eventsOf('x402.escalation.denied', e.escalationId)).toHaveLength(1);
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  it('an approve before the deadline wins: the sweep past it changes nothing, and the override pays', async () => {
    const e = await escalated(1);
    const approved = await post(t, auth, `/x402/gate/escalations/${e.escalationId}/resolve`, {
      action: 'approve',
      reason: 'known payee',
    });
    expect(approved.statusCode, approved.body).toBe(200);
    expect(approved.json()).toMatchObject({
      status: 'approved',
      resolution: { action: 'approve', reason: 'known payee', by: keyId },
    });
    expect((await eventsOf('x402.escalation.approved', e.escalationId))[0]!.data).toMatchObject({
      reason: 'known payee',
      decidedBy: keyId,
    });
    await until(e.deadlineAt);
    await sweep();
    expect((await escalationView(e.gateId)).status).toBe('approved');
    expect(await balances(t, auth, e.payer)).toEqual({ available: FUNDS - AMOUNT, escrow: AMOUNT });
    const paid = await authorize({ ...e.body, escalationOverrideToken: approved.json().escalationOverrideToken });
    expect(paid.statusCode, paid.body).toBe(200);
  });

  it('deny takes a reason and records the key; the denial event carries both', async () => {
    const e = await escalated();
    const denied = await post(t, auth, `/x402/gate/escalations/${e.escalationId}/resolve`, {
      action: 'deny',
      reason: 'unknown payee',
    });
    expect(denied.json()).toMatchObject({ status: 'denied', resolution: { reason: 'unknown payee', by: keyId } });
    expect((await eventsOf('x402.escalation.denied', e.escalationId))[0]!.data).toMatchObject({
      reason: 'unknown payee',
      decidedBy: keyId,
    });
    const again = await post(t, auth, `/x402/gate/escalations/${e.escalationId}/resolve`, { action: 'approve' });
    expect(again.statusCode).toBe(409);
    expect(again.json()).toMatchObject({
      code: 'X402_ESCALATION_TERMINAL',
      details: { status: 'denied', decidedBy: keyId },
    });
  });

  it("bulk: a list of ids and a reason, answered per id; another tenant's ids are not found; the operator decides as admin", async () => {
    const pending = await escalated();
    const decided = await escalated();
    await post(t, auth, `/x402/gate/escalations/${decided.escalationId}/resolve`, { action: 'deny', reason: 'no' });
    const stale = await escalated(1);
    const other = await t.tenantWithKey([...X402_SCOPES], 'other');
    const { payer, payee } = await gateParties(t, other.auth, FUNDS);
    await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: other.auth,
      payload: { currency: 'USD', perCallLimit: 100 },
    });
    const foreignGate = await createGate(t, other.auth, { payerAgentId: payer, payeeAgentId: payee, amount: AMOUNT });
    const fq = await quote(t, other.auth, foreignGate.gateId);
    const foreign = (
      await post(t, other.auth, '/x402/gate/authorize-payment', {
        gateId: foreignGate.gateId,
        quoteId: fq.quoteId,
        requestSha256: fq.requestSha256,
      })
    ).json().details.escalationId as string;
    await until(stale.deadlineAt);

    const res = await post(t, auth, '/x402/gate/escalations/resolve', {
      action: 'approve',
      reason: 'quarter end',
      escalationIds: [pending.escalationId, decided.escalationId, stale.escalationId, foreign, 'esc_nope'],
    });
    expect(res.statusCode, res.body).toBe(200);
    const byId = Object.fromEntries(res.json().results.map((r: { escalationId: string }) => [r.escalationId, r]));
    expect(byId[pending.escalationId]).toMatchObject({
      outcome: 'approved',
      escalation: { status: 'approved', resolution: { reason: 'quarter end', by: keyId } },
      escalationOverrideToken: expect.any(String),
    });
    expect(byId[decided.escalationId]).toMatchObject({ outcome: 'already_decided' });
    expect(byId[stale.escalationId]).toMatchObject({ outcome: 'deadline_passed' });
    expect(byId[foreign]).toMatchObject({ outcome: 'not_found' });
    expect(byId.esc_nope).toMatchObject({ outcome: 'not_found' });
    expect(
      (
        await t.app.inject({
          method: 'GET',
          url: `/x402/gate/escalations?gateId=${foreignGate.gateId}`,
          headers: { ...other.auth },
        })
      ).json().items[0].status,
    ).toBe('pending');

    // Bad lists change nothing: empty, or more than 100.
    expect(
      (await post(t, auth, '/x402/gate/escalations/resolve', { action: 'deny', reason: 'x', escalationIds: [] }))
        .statusCode,
    ).toBe(400);
    const tooMany = Array.from({ length: 101 }, (_, i) => `esc_${i}`);
    expect(
      (await post(t, auth, '/x402/gate/escalations/resolve', { action: 'deny', reason: 'x', escalationIds: tooMany }))
        .statusCode,
    ).toBe(400);
    // A tenant key cannot use the operator's route; the admin key decides any tenant's, recorded as admin.
    expect(
      (await post(t, auth, '/ops/x402/escalations/resolve', { action: 'deny', reason: 'x', escalationIds: [foreign] }))
        .statusCode,
    ).toBe(403);
    const operator = await t.app.inject({
      method: 'POST',
      url: '/ops/x402/escalations/resolve',
      headers: t.admin,
      payload: { action: 'deny', reason: 'fraud check', escalationIds: [foreign] },
    });
    expect(operator.statusCode, operator.body).toBe(200);
    expect(operator.json().results[0]).toMatchObject({
      outcome: 'denied',
      escalation: { resolution: { by: 'admin', reason: 'fraud check' } },
    });
  });

  describe('crash points of the deadline denial', () => {
    for (const point of [
      'x402.escalation.deadline.denied',
      'x402.escalation.deadline.expired',
      'x402.escalation.deadline.returned',
    ]) {
      it(`crashed at ${point}, then swept again: denied once, the reserve returned once, one event, the audit clean`, async () => {
        const e = await escalated(1);
        await until(e.deadlineAt);
        armFailpoint(point, () => {
          throw new FailpointCrash(point);
        });
        const crashed = await sweep();
        expect(crashed.escalations.failed).toBeGreaterThanOrEqual(1);
        disarmFailpoints();
        // The crashed look backs off; the retry is made due now (as its backoff running out would).
        await t.runtime.stores.x402.escalationsDue.mark(
          e.escalationId,
          (await t.runtime.stores.x402.escalationOf(e.escalationId))!.tenantId,
          new Date(),
        );
        // A person deciding after the crash loses to the deadline's denial already recorded (or to the deadline).
        const late = await post(t, auth, `/x402/gate/escalations/${e.escalationId}/resolve`, { action: 'approve' });
        expect(late.statusCode).toBe(409);
        await sweep();
        await sweep();
        expect(await escalationView(e.gateId)).toMatchObject({
          status: 'denied',
          resolution: { reason: 'deadline_passed', by: 'deadline' },
        });
        expect(await balances(t, auth, e.payer)).toEqual({ available: FUNDS, escrow: 0 });
        expect(await eventsOf('x402.escalation.denied', e.escalationId)).toHaveLength(1);
        expect(await t.runtime.stores.x402.escalationsDue.records.findOne({ _id: e.escalationId })).toBeNull();
        await expectLedgerBalances(t);
        await expectCleanAudit(t);
      });
    }
  });
});
