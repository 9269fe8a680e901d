// Payment sessions when Redis loses its last writes (a replica promoted behind its primary, an append-only file cut
// short): the budget's two keys are put back as a snapshot taken earlier holds them, while MongoDB keeps every
// recorded charge. Every receipt must still be paid, calls must go on without a 500, and a retried call must get its
// first receipt. Also: a session hold is bound to what its verify held (payee, request, asset).
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { x402RequestSha256 } from '../../src/domain/x402.ts';
import { X402Service } from '../../src/services/x402/service.ts';
import { createProcessors } from '../../src/workers/index.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { registerAgent } from '../helpers/agents.ts';
import { balances } from '../helpers/money.ts';
import { gateParties, get, post, X402_SCOPES } from './helpers.ts';

describe('x402 payment sessions when Redis loses its last writes', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle', 'webhook-dispatch'],
      overrides: { RATE_LIMIT_MAX: '100000', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth, tenantId } = await t.tenantWithKey([...X402_SCOPES]));
  });
  afterAll(() => t.close());

  const charge = (sessionId: string, body: Record<string, unknown>) =>
    post(t, auth, `/x402/sessions/${sessionId}/charges`, { paymentId: randomBytes(8).toString('hex'), ...body });
  const budgetKeys = (sessionId: string) =>
    ['budget', 'payments'].map((k) => `${t.runtime.config.redisPrefix}:{ses:${sessionId}}:${k}`);

  /** What a lagging replica holds of a session's budget: the two keys as they were when the snapshot was taken. */
  async function snapshot(sessionId: string): Promise<() => Promise<void>> {
    const keys = budgetKeys(sessionId);
    const dumps = await Promise.all(keys.map((k) => t.runtime.redis.dumpBuffer(k)));
    return async () => {
      for (const [i, key] of keys.entries()) {
        const dump = dumps[i];
        if (dump) await t.runtime.redis.restore(key, 0, dump, 'REPLACE');
        else await t.runtime.redis.del(key); // it did not exist yet
      }
    };
  }

  async function openSession(funds: number, terms: Record<string, unknown>, payees = 1) {
    const { payer, payee } = await gateParties(t, auth, funds);
    const more = await Promise.all(Array.from({ length: payees - 1 }, () => registerAgent(t, auth)));
    const payeeAgentIds = [payee, ...more.map((a) => a.agentId)];
    const res = await post(
      t,
      auth,
      '/x402/sessions',
      { currency: 'USD', payerAgentId: payer, payeeAgentIds, ...terms },
      { 'idempotency-key': randomBytes(8).toString('hex') },
    );
    expect(res.statusCode, res.body).toBe(201);
    return { payer, payee, payeeAgentIds, sessionId: res.json().sessionId as string };
  }

  /**
   * A charge through this process's routes, or through another API process's service object (which has seen none of
   * the seqs this one handed out, so only the recorded charges can tell it that Redis lost writes).
   */
  async function chargeVia(
    via: 'this process' | 'another process',
    sessionId: string,
    body: { paymentId: string; payeeAgentId: string; amount: number },
  ) {
    if (via === 'another process') {
      const answer = await new X402Service(t.runtime).sessions.charge(tenantId, sessionId, body);
      return { repeated: answer.repeated, seq: answer.charge.seq, receiptHash: answer.receipt.receiptHash };
    }
    const res = await charge(sessionId, body);
    expect(res.statusCode, res.body).toBe(201);
    return {
      repeated: res.json().repeated as boolean,
      seq: res.json().seq as number,
      receiptHash: res.json().receipt.receiptHash as string,
    };
  }

  it('a close after Redis rolled back pays every receipt: the statement counts the charges recorded past the seq Redis holds', async () => {
    const { payer, payee, sessionId } = await openSession(100, { budget: 30, maxPerCall: 10 });
    const receipts: number[] = [];
    let rollBack: (() => Promise<void>) | null = null;
    for (let i = 0; i < 10; i++) {
      if (i === 5) rollBack = await snapshot(sessionId);
      const res = await charge(sessionId, { payeeAgentId: payee, amount: 2 });
      expect(res.statusCode, res.body).toBe(201);
      receipts.push(res.json().amount);
    }
    await rollBack!();
    expect((await get(t, auth, `/x402/sessions/${sessionId}`)).json()).toMatchObject({ spent: 10, charges: 5 }); // what Redis now says

    // The audit sees Redis' budget behind the recorded charges before anything repairs it.
    const audit = await t.app.inject({ method: 'GET', url: '/ops/ledger/audit', headers: t.admin });
    expect(audit.json().violations).toContainEqual(
      expect.objectContaining({ kind: 'session_budget_behind', owner: sessionId }),
    );

    const closed = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(closed.statusCode, closed.body).toBe(200);
    const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    expect(statement.body).toMatchObject({ totalCharged: 20, refunded: 10, chargeCount: 10, voided: 0 });
    expect(statement.charges.map((c: { seq: number }) => c.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    expect(await balances(t, auth, payer)).toEqual({ available: 80, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 20, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('calls go on after the rollback (no 500), and a retried call gets its first receipt, in this process and in another', async () => {
    for (const via of ['this process', 'another process'] as const) {
      const { payer, payee, sessionId } = await openSession(100, { budget: 30, maxPerCall: 10 });
      const first = new Map<string, { seq: number; receiptHash: string }>();
      let rollBack: (() => Promise<void>) | null = null;
      for (let i = 0; i < 10; i++) {
        if (i === 5) rollBack = await snapshot(sessionId);
        const paymentId = `call-${i}`;
        const res = await charge(sessionId, { paymentId, payeeAgentId: payee, amount: 2 });
        expect(res.statusCode, res.body).toBe(201);
        first.set(paymentId, { seq: res.json().seq, receiptHash: res.json().receipt.receiptHash });
      }
      await rollBack!();
      // New calls: each gets a seq no recorded charge holds.
      for (let i = 10; i < 15; i++) {
        const answer = await chargeVia(via, sessionId, { paymentId: `call-${i}`, payeeAgentId: payee, amount: 2 });
        expect(answer.repeated).toBe(false);
        expect(answer.seq, `${via}: call-${i}`).toBeGreaterThan(10);
        first.set(`call-${i}`, { seq: answer.seq, receiptHash: answer.receiptHash });
      }
      // Calls whose answers the client lost in the failover, retried in another order: their first receipts.
      for (const paymentId of ['call-8', 'call-6', 'call-9', 'call-2']) {
        const answer = await chargeVia(via, sessionId, { paymentId, payeeAgentId: payee, amount: 2 });
        expect({ via, paymentId, ...answer }).toEqual({ via, paymentId, repeated: true, ...first.get(paymentId) });
      }
      // The budget is 30 and 15 charges of 2 were receipted: it is spent.
      expect((await charge(sessionId, { payeeAgentId: payee, amount: 2 })).json()).toMatchObject({
        code: 'X402_SESSION_BUDGET_EXCEEDED',
        details: { remaining: 0 },
      });
      await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
      const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
      expect(statement.body, via).toMatchObject({ totalCharged: 30, refunded: 0, chargeCount: 15 });
      expect(new Set(statement.charges.map((c: { receiptHash: string }) => c.receiptHash))).toEqual(
        new Set([...first.values()].map((f) => f.receiptHash)),
      );
      expect(await balances(t, auth, payer)).toEqual({ available: 70, escrow: 0 });
      expect(await balances(t, auth, payee)).toEqual({ available: 30, escrow: 0 });
    }
    await expectCleanAudit(t);
  });

  it('a close that Redis lost: the session stays closed, no call is charged or verified past its statement', async () => {
    const { payer, payee, sessionId } = await openSession(100, { budget: 30, maxPerCall: 10 });
    for (let i = 0; i < 3; i++)
      expect((await charge(sessionId, { payeeAgentId: payee, amount: 2 })).statusCode).toBe(201);
    const rollBack = await snapshot(sessionId); // open, seq 3: the state just before the close stopped the debits
    expect((await post(t, auth, `/x402/sessions/${sessionId}/close`, {})).statusCode).toBe(200);
    await rollBack();
    expect(await t.runtime.stores.x402Sessions.budgetState(sessionId)).toMatchObject({ state: 'open', seq: 3 });

    // In another process too (it has seen no seq of this session): the seq past the statement is void.
    expect(
      await new X402Service(t.runtime).sessions
        .charge(tenantId, sessionId, { paymentId: 'after-close-1', payeeAgentId: payee, amount: 2 })
        .catch((e: { code: string }) => e.code),
    ).toBe('X402_SESSION_CLOSED');
    expect(await t.runtime.stores.x402Sessions.budgetState(sessionId)).toMatchObject({ state: 'closed' }); // stopped again
    expect((await charge(sessionId, { payeeAgentId: payee, amount: 2 })).json()).toMatchObject({
      code: 'X402_SESSION_CLOSED',
    });
    // A rolled-back Redis that also forgot the stop a second time: a verify must not promise a payment either.
    await rollBack();
    const held = await new X402Service(t.runtime).sessions
      .hold(tenantId, sessionId, { paymentId: 'after-close-2', payeeAgentId: payee, maxAmount: 2 })
      .catch((e: { code: string }) => e.code);
    expect(held).toBe('X402_SESSION_CLOSED');

    const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    expect(statement.body).toMatchObject({ totalCharged: 6, refunded: 24, chargeCount: 3, voided: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 94, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 6, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('a retry after the close answers the receipt the statement paid, even from a Redis that forgot the payment', async () => {
    const { payee, sessionId } = await openSession(100, { budget: 4, maxPerCall: 2 });
    const rollBack = await snapshot(sessionId); // before any charge: the payment id unknown, seq 0
    const first = await charge(sessionId, { paymentId: 'paid-then-closed', payeeAgentId: payee, amount: 1 });
    expect(first.statusCode, first.body).toBe(201);
    expect((await post(t, auth, `/x402/sessions/${sessionId}/close`, {})).statusCode).toBe(200);
    await rollBack();
    const again = await charge(sessionId, { paymentId: 'paid-then-closed', payeeAgentId: payee, amount: 1 });
    expect(again.statusCode, again.body).toBe(201);
    expect(again.json()).toMatchObject({
      seq: 1,
      repeated: true,
      receipt: { receiptHash: first.json().receipt.receiptHash },
    });
    // Another call under the paid id is a reuse; a new call is refused as closed.
    expect(
      (await charge(sessionId, { paymentId: 'paid-then-closed', payeeAgentId: payee, amount: 2 })).json(),
    ).toMatchObject({ code: 'X402_SESSION_PAYMENT_REUSED' });
    expect(
      (await charge(sessionId, { paymentId: 'new-after-close', payeeAgentId: payee, amount: 1 })).json(),
    ).toMatchObject({ code: 'X402_SESSION_CLOSED' });
    await expectCleanAudit(t);
  });

  it('a Redis that lost the budget entirely: rebuilt from the recorded charges, every receipt paid', async () => {
    const { payer, payee, sessionId } = await openSession(100, { budget: 30, maxPerCall: 10 });
    for (let i = 0; i < 4; i++)
      expect((await charge(sessionId, { paymentId: `lost-${i}`, payeeAgentId: payee, amount: 3 })).statusCode).toBe(
        201,
      );
    await t.runtime.redis.del(...budgetKeys(sessionId));
    expect(
      await chargeVia('another process', sessionId, { paymentId: 'lost-1', payeeAgentId: payee, amount: 3 }),
    ).toMatchObject({ repeated: true, seq: 2 });
    expect((await charge(sessionId, { payeeAgentId: payee, amount: 3 })).json()).toMatchObject({
      seq: 5,
      remaining: 15,
    });
    await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(await balances(t, auth, payer)).toEqual({ available: 85, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 15, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('a change of Redis masters is noticed at the next sweep: budgets behind their charges are put right, due indexes audited at once', async () => {
    const { payee, sessionId } = await openSession(100, { budget: 30, maxPerCall: 10 });
    let rollBack: (() => Promise<void>) | null = null;
    for (let i = 0; i < 6; i++) {
      if (i === 3) rollBack = await snapshot(sessionId);
      expect((await charge(sessionId, { payeeAgentId: payee, amount: 2 })).statusCode).toBe(201);
    }
    await rollBack!();
    // The sessions' due index lost this session, and its audit claim (taken just before) still stands for hours.
    const { due } = t.runtime.stores.x402Sessions;
    await due.audit();
    const dueKey = `${t.runtime.config.redisPrefix}:{due:x402_sessions}:at`;
    await t.runtime.redis.zrem(dueKey, sessionId);
    // As if this deployment had never seen these masters: what a restart or a failover looks like to the watch.
    await t.runtime.db.collection('redis_lineages').deleteMany({});

    const sweep = createProcessors(t.runtime)['x402-verify']!.sweep!;
    expect(await sweep()).toMatchObject({ redisReconciled: true });
    expect(await t.runtime.stores.x402Sessions.budgetState(sessionId)).toMatchObject({ seq: 6, spent: 12 });
    expect(await t.runtime.redis.zscore(dueKey, sessionId)).not.toBeNull(); // the sweep's audit, no longer held back, put it back
    expect(await sweep()).toMatchObject({ redisReconciled: false }); // once per change of masters
    await expectCleanAudit(t);
  });

  describe('a session hold is bound to what its verify held', () => {
    const resource = 'http://127.0.0.1:9/tool';
    const requestSha256 = x402RequestSha256({ method: 'GET', resource });
    const requirement = (payTo: string, overrides: Record<string, unknown> = {}) => ({
      scheme: 'escrow-session',
      network: t.runtime.config.x402.network,
      amount: '20',
      asset: 'USD',
      payTo,
      maxTimeoutSeconds: 60,
      extra: { method: 'GET', resource },
      ...overrides,
    });
    const facilitator = (
      step: 'verify' | 'settle',
      sessionId: string,
      paymentId: string,
      accepted: Record<string, unknown>,
      required = accepted,
    ) =>
      t.app.inject({
        method: 'POST',
        url: `/x402/facilitator/${step}`,
        headers: auth,
        payload: {
          x402Version: 2,
          paymentPayload: { x402Version: 2, accepted, payload: { sessionId, paymentId, requestSha256 } },
          paymentRequirements: required,
        },
      });

    it('an asset other than the session currency is refused at verify and at settle, and nothing is charged', async () => {
      const { payee, sessionId } = await openSession(200, { budget: 100, maxPerCall: 50 });
      const jpy = requirement(payee, { asset: 'JPY', amount: '40' });
      expect((await facilitator('verify', sessionId, 'jpy-1', jpy)).json()).toMatchObject({
        isValid: false,
        invalidReason: 'asset_mismatch',
      });
      expect((await facilitator('settle', sessionId, 'jpy-1', jpy)).json()).toMatchObject({
        success: false,
        errorReason: 'asset_mismatch',
      });
      expect((await get(t, auth, `/x402/sessions/${sessionId}`)).json()).toMatchObject({ spent: 0, charges: 0 });
      // A hold made in USD cannot be settled as JPY either.
      expect((await facilitator('verify', sessionId, 'usd-1', requirement(payee))).json()).toMatchObject({
        isValid: true,
      });
      expect(
        (await facilitator('settle', sessionId, 'usd-1', requirement(payee, { asset: 'JPY' }))).json(),
      ).toMatchObject({ success: false, errorReason: 'asset_mismatch' });
      expect((await facilitator('settle', sessionId, 'usd-1', requirement(payee))).json()).toMatchObject({
        success: true,
        amount: '20',
      });
    });

    it('a verified call that cost nothing settles for 0 even after Redis forgot its hold', async () => {
      const { payee, sessionId } = await openSession(200, { budget: 100, maxPerCall: 50 });
      const rollBack = await snapshot(sessionId);
      expect((await facilitator('verify', sessionId, 'free-1', requirement(payee))).json()).toMatchObject({
        isValid: true,
      });
      await rollBack();
      expect(
        (
          await facilitator('settle', sessionId, 'free-1', requirement(payee), requirement(payee, { amount: '0' }))
        ).json(),
      ).toMatchObject({ success: true, amount: '0' });
    });

    it('a hold verified for one payee is never settled or charged to another', async () => {
      const { payeeAgentIds, sessionId } = await openSession(200, { budget: 100, maxPerCall: 50 }, 2);
      const [p1, p2] = payeeAgentIds as [string, string];
      expect((await facilitator('verify', sessionId, 'bound-1', requirement(p1))).json()).toMatchObject({
        isValid: true,
      });
      expect((await facilitator('settle', sessionId, 'bound-1', requirement(p2))).json()).toMatchObject({
        success: false,
        errorReason: 'payee_mismatch',
      });
      const viaRest = await charge(sessionId, { paymentId: 'bound-1', payeeAgentId: p2, amount: 20, requestSha256 });
      expect(viaRest.json()).toMatchObject({ code: 'X402_PAYEE_MISMATCH', details: { heldFor: p1 } });
      // Another request under the same payment id is refused too; the payee it was verified for is paid.
      const otherRequest = await charge(sessionId, {
        paymentId: 'bound-1',
        payeeAgentId: p1,
        amount: 20,
        requestSha256: 'b'.repeat(64),
      });
      expect(otherRequest.json()).toMatchObject({ code: 'X402_REQUEST_BINDING_MISMATCH' });
      expect((await facilitator('settle', sessionId, 'bound-1', requirement(p1))).json()).toMatchObject({
        success: true,
        amount: '20',
      });
      await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
      expect(await balances(t, auth, p1)).toEqual({ available: 20, escrow: 0 });
      expect(await balances(t, auth, p2)).toEqual({ available: 0, escrow: 0 });
      await expectCleanAudit(t);
    });
  });
});
