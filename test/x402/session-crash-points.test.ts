import { randomBytes } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import { createProcessors } from '../../src/workers/index.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, get, post, X402_SCOPES } from './helpers.ts';

// Every step between the first and the last durable write of a session's open, charge and close, crashed at: the
// request (or the sweep) dies there, the sweepers run, the client retries with the same key. The session then ends
// open with the right balance, or closed with the rest returned, and the money is whole and moved once.

const FUNDS = 1_000;
const BUDGET = 300;

describe('x402 session crash points', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let processors: ProcessorMap;
  let crashed = false;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle'],
      overrides: { RATE_LIMIT_MAX: '100000', SWEEP_STALE_AFTER_MS: '0', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth } = await t.tenantWithKey([...X402_SCOPES]));
    processors = createProcessors(t.runtime);
  });
  afterAll(() => t.close());
  afterEach(() => {
    disarmFailpoints();
    crashed = false;
  });

  const arm = (point: string) =>
    armFailpoint(point, () => {
      crashed = true;
      throw new FailpointCrash(point);
    });

  /** The sessions' sweep (on the x402-verify worker), after any backoff a crashed look left behind. */
  async function sweep(sessionId?: string) {
    if (sessionId)
      await t.runtime.stores.x402Sessions.due.mark(
        sessionId,
        (await t.runtime.stores.x402Sessions.get(sessionId))!.tenantId,
        new Date(),
      );
    await processors['x402-verify']!.sweep!();
    await processors.settle!.sweep!();
  }

  /** A request that may crash (500): the sweepers run, then it is retried as sent. */
  async function call(url: string, body: Record<string, unknown>, headers: Record<string, string> = {}) {
    const first = await post(t, auth, url, body, headers);
    if (first.statusCode !== 500) return first;
    expect(first.json()).toMatchObject({ code: 'INTERNAL' });
    expect(crashed).toBe(true);
    disarmFailpoints();
    await sweep();
    return post(t, auth, url, body, headers);
  }

  async function start() {
    const parties = await gateParties(t, auth, FUNDS);
    return parties;
  }

  async function open(parties: { payer: string; payee: string }) {
    const res = await call(
      '/x402/sessions',
      { payerAgentId: parties.payer, payeeAgentIds: [parties.payee], currency: 'USD', budget: BUDGET, maxPerCall: 100 },
      { 'idempotency-key': randomBytes(8).toString('hex') },
    );
    expect(res.statusCode, res.body).toBe(201);
    return res.json().sessionId as string;
  }

  /** The session ended closed with `charged` paid to the payee, the rest back, the money whole, the audit clean. */
  async function expectClosed(
    sessionId: string,
    parties: { payer: string; payee: string },
    charged: number,
    status = 'closed',
  ) {
    await sweep();
    expect((await get(t, auth, `/x402/sessions/${sessionId}`)).json()).toMatchObject({
      status,
      spent: charged,
      refunded: BUDGET - charged,
    });
    expect(await balances(t, auth, parties.payer)).toEqual({ available: FUNDS - charged, escrow: 0 });
    expect(await balances(t, auth, parties.payee)).toEqual({ available: charged, escrow: 0 });
    const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    expect(statement.body.totalCharged).toBe(charged);
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  }

  for (const point of ['x402.session.recorded', 'x402.session.locked']) {
    it(`open: crash at ${point}, then the retry with the same key opens the one session`, async () => {
      const parties = await start();
      arm(point);
      const sessionId = await open(parties);
      expect(crashed).toBe(true);
      expect(await balances(t, auth, parties.payer)).toEqual({ available: FUNDS - BUDGET, escrow: BUDGET });
      const res = await call(`/x402/sessions/${sessionId}/charges`, {
        paymentId: 'p1',
        payeeAgentId: parties.payee,
        amount: 30,
      });
      expect(res.statusCode, res.body).toBe(201);
      await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
      await expectClosed(sessionId, parties, 30);
    });
  }

  it('open: crash after the lock and never retried: the sweeper returns the budget at the expiry', async () => {
    const parties = await start();
    arm('x402.session.locked');
    const res = await post(t, auth, '/x402/sessions', {
      payerAgentId: parties.payer,
      payeeAgentIds: [parties.payee],
      currency: 'USD',
      budget: BUDGET,
      maxPerCall: 100,
      ttlSeconds: 1,
    });
    expect(res.statusCode).toBe(500);
    disarmFailpoints();
    const [session] = await t.runtime.stores.x402Sessions.sessions.find({ payerAgentId: parties.payer }).toArray();
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    await sweep(session!._id);
    await expectClosed(session!._id, parties, 0, 'expired');
  });

  for (const point of ['x402.session.debited', 'x402.session.charged']) {
    it(`charge: crash at ${point}, then the retry with the same payment id is charged once`, async () => {
      const parties = await start();
      const sessionId = await open(parties);
      await call(`/x402/sessions/${sessionId}/charges`, { paymentId: 'p0', payeeAgentId: parties.payee, amount: 10 });
      arm(point);
      const res = await call(`/x402/sessions/${sessionId}/charges`, {
        paymentId: 'p1',
        payeeAgentId: parties.payee,
        amount: 40,
      });
      expect(res.statusCode, res.body).toBe(201);
      // Recorded before the crash: the retry answers it (repeated); debited only: the retry records it.
      expect(res.json()).toMatchObject({ seq: 2, amount: 40, repeated: point === 'x402.session.charged' });
      expect(crashed).toBe(true);
      await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
      await expectClosed(sessionId, parties, 50);
    });
  }

  it('charge: crash between the debit and its record, never retried: the close voids it and the payer keeps the money', async () => {
    const parties = await start();
    const sessionId = await open(parties);
    arm('x402.session.debited');
    expect(
      (
        await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
          paymentId: 'lost',
          payeeAgentId: parties.payee,
          amount: 40,
        })
      ).statusCode,
    ).toBe(500);
    disarmFailpoints();
    await call(`/x402/sessions/${sessionId}/charges`, { paymentId: 'p2', payeeAgentId: parties.payee, amount: 25 });
    await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    await expectClosed(sessionId, parties, 25);
    expect((await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json().body).toMatchObject({
      voided: 1,
      chargeCount: 1,
    });
    // The lost call retried after the close: refused, nothing charged.
    expect(
      (
        await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
          paymentId: 'lost',
          payeeAgentId: parties.payee,
          amount: 40,
        })
      ).json(),
    ).toMatchObject({ code: 'X402_SESSION_CLOSED' });
    await expectClosed(sessionId, parties, 25);
  });

  for (const point of [
    'x402.session.stopped',
    'x402.session.voided',
    'x402.session.closed',
    'x402.session.refunded',
    'x402.session.payee-settled',
  ]) {
    it(`close: crash at ${point}, then the sweeper (or the retried close) finishes it once`, async () => {
      const parties = await start();
      const sessionId = await open(parties);
      await call(`/x402/sessions/${sessionId}/charges`, { paymentId: 'p1', payeeAgentId: parties.payee, amount: 60 });
      arm(point);
      const res = await call(`/x402/sessions/${sessionId}/close`, {});
      expect(res.statusCode, res.body).toBe(200);
      expect(crashed).toBe(true);
      await expectClosed(sessionId, parties, 60);
    });

    it(`expiry: the sweeper crashes at ${point}, backs off, and its next look finishes the close`, async () => {
      const parties = await start();
      const res = await post(t, auth, '/x402/sessions', {
        payerAgentId: parties.payer,
        payeeAgentIds: [parties.payee],
        currency: 'USD',
        budget: BUDGET,
        maxPerCall: 100,
        ttlSeconds: 3,
      });
      const { sessionId, expiresAt } = res.json();
      // The charge lands before the expiry (3 s leaves a loaded machine room), then the expiry is waited out.
      const charged = await call(`/x402/sessions/${sessionId}/charges`, {
        paymentId: 'p1',
        payeeAgentId: parties.payee,
        amount: 70,
      });
      expect(charged.statusCode, charged.body).toBe(201);
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, Date.parse(expiresAt) - Date.now()) + 100));
      arm(point);
      await processors['x402-verify']!.sweep!();
      expect(crashed).toBe(true);
      disarmFailpoints();
      await sweep(sessionId);
      await expectClosed(sessionId, parties, 70, 'expired');
    });
  }
});
