import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GateSweepSummary } from '../../src/services/x402/expiry.ts';
import { x402EntryIds } from '../../src/services/x402/service.ts';
import { createProcessors } from '../../src/workers/index.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, expectLedgerBalances, gateParties, get, post, quote, X402_SCOPES } from './helpers.ts';

// Issue 22's x402 reproductions: reserves that never came back (held and authorized gates never expired; a create
// that raced a wind-down and died after its lock), verify that paid the payee after the authorization's expiry or
// after a wind-down, and the facilitator's settle answering success for a refunded gate.
describe('x402 gate deadlines and the gate sweeper', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let sweep: () => Promise<GateSweepSummary>;
  beforeAll(async () => {
    // Gates nobody authorizes expire after 1 s; an authorization's report is due by its token's expiry (no grace).
    t = await startTestApp({
      workers: ['x402-verify', 'settle'],
      overrides: {
        RATE_LIMIT_MAX: '100000',
        X402_GATE_TTL_SECONDS: '1',
        X402_AUTHORIZATION_GRACE_SECONDS: '0',
        SWEEP_STALE_AFTER_MS: '0',
        SWEEP_INTERVAL_MS: '3600000',
      },
    });
    ({ auth } = await t.tenantWithKey([...X402_SCOPES]));
    const processor = createProcessors(t.runtime)['x402-verify']!;
    sweep = () => processor.sweep!() as Promise<GateSweepSummary>;
  });
  afterAll(() => t.close());

  const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  const authorize = (gateId: string, q: { quoteId: string; requestSha256: string }) =>
    post(t, auth, '/x402/gate/authorize-payment', { gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 });
  const verify = (gateId: string, verificationStatus: 'verified' | 'failed' = 'verified') =>
    post(t, auth, '/x402/gate/verify', { gateId, evidence: { responseSha256: 'a'.repeat(64) }, verificationStatus });
  const expiredEvents = async (gateId: string) =>
    (await t.runtime.stores.outbox.events.find({ type: 'x402.gate.expired' }).toArray()).filter(
      (e) => e.data.gateId === gateId,
    );
  /** The gate's settlement may still be moving when the worker answered 202: wait until it is final. */
  const waitStatus = async (gateId: string, status: string) => {
    for (let i = 0; i < 100; i++) {
      const gate = (await get(t, auth, `/x402/gate/${gateId}`)).json();
      if (gate.status === status) return gate;
      await pause(100);
    }
    throw new Error(`gate ${gateId} never became ${status}`);
  };

  it("returns a held gate's reserve once the gate TTL has passed, with an x402.gate.expired event; it can no longer be authorized", async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 400 });
    const q = await quote(t, auth, gate.gateId, undefined, 1);
    expect(await balances(t, auth, payer)).toEqual({ available: 600, escrow: 400 });
    await pause(1_100);

    expect((await sweep()).expired).toBeGreaterThanOrEqual(1);
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json()).toMatchObject({ status: 'expired' });
    expect(await expiredEvents(gate.gateId)).toMatchObject([
      { data: { gateId: gate.gateId, reason: 'gate_ttl', amount: 400, currency: 'USD' } },
    ]);
    const late = await authorize(gate.gateId, q);
    expect(late.json()).toMatchObject({ code: 'X402_GATE_TERMINAL', details: { status: 'expired' } });

    await sweep(); // a second sweep finds nothing left to do
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    expect(await expiredEvents(gate.gateId)).toHaveLength(1);
    await expectLedgerBalances(t);
  });

  it('keeps a held gate while its quote lives, even past the gate TTL', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    const q = await quote(t, auth, gate.gateId, undefined, 60);
    await pause(1_100);
    await sweep();
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json()).toMatchObject({ status: 'held' });
    expect((await authorize(gate.gateId, q)).statusCode).toBe(200);
    expect(await balances(t, auth, payer)).toEqual({ available: 900, escrow: 100 });
  });

  it('refuses verify(verified) after the authorization expired (409 X402_AUTHORIZATION_EXPIRED) and refunds the payer; the payee gets nothing', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 300 });
    const q = await quote(t, auth, gate.gateId, undefined, 1);
    expect((await authorize(gate.gateId, q)).statusCode).toBe(200);
    await pause(1_100);

    const late = await verify(gate.gateId);
    expect(late.statusCode, late.body).toBe(409);
    expect(late.json()).toMatchObject({
      code: 'X402_AUTHORIZATION_EXPIRED',
      details: { gateId: gate.gateId, status: 'expired' },
    });
    await waitStatus(gate.gateId, 'expired');
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    // Again: refused again, nothing moves.
    expect((await verify(gate.gateId)).json()).toMatchObject({ code: 'X402_AUTHORIZATION_EXPIRED' });
    expect(await expiredEvents(gate.gateId)).toMatchObject([
      { data: { reason: 'authorization_expired', amount: 300 } },
    ]);
    await expectLedgerBalances(t);
  });

  it('returns an authorized gate nobody reported by its deadline (sweeper); a later success report is refused', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 250 });
    const q = await quote(t, auth, gate.gateId, undefined, 1);
    expect((await authorize(gate.gateId, q)).statusCode).toBe(200);
    await pause(1_100);

    await sweep();
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    const state = (await get(t, auth, `/x402/gate/${gate.gateId}`)).json();
    expect(state).toMatchObject({
      status: 'expired',
      verification: { verificationStatus: 'expired', responseSha256: null },
      decision: { verdict: 'fail', reason: 'AUTHORIZATION_EXPIRED' },
    });
    expect((await verify(gate.gateId)).json()).toMatchObject({ code: 'X402_AUTHORIZATION_EXPIRED' });
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
    await expectLedgerBalances(t);
  });

  it('refuses verify(verified) once the payee is wound down (410 X402_AGENT_WOUND_DOWN) and refunds the payer', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 500 });
    const q = await quote(t, auth, gate.gateId, undefined, 300);
    expect((await authorize(gate.gateId, q)).statusCode).toBe(200);
    const windDown = await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payee)}/wind-down`, {});
    expect(windDown.json()).toMatchObject({ gatesLeftReserved: [gate.gateId] });

    const res = await verify(gate.gateId);
    expect(res.statusCode, res.body).toBe(410);
    expect(res.json()).toMatchObject({ code: 'X402_AGENT_WOUND_DOWN', details: { agentId: payee } });
    await waitStatus(gate.gateId, 'refunded');
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json()).toMatchObject({
      decision: { reason: 'AGENT_WOUND_DOWN' },
    });
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    await expectLedgerBalances(t);
  });

  it('returns an authorized gate of a wound-down payer at the next sweep, with nobody reporting', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 200 });
    const q = await quote(t, auth, gate.gateId, undefined, 300);
    expect((await authorize(gate.gateId, q)).statusCode).toBe(200);
    expect((await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payer)}/wind-down`, {})).statusCode).toBe(200);
    await sweep();
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json()).toMatchObject({
      status: 'refunded',
      decision: { reason: 'AGENT_WOUND_DOWN' },
    });
  });

  it('returns the lock of a gate whose create raced a wind-down and died after its lock', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const { ledger } = t.runtime.stores;
    const apply = ledger.apply.bind(ledger);
    // The wind-down walks the gate (indexed, not yet locked) and cancels it; then the create records its lock and
    // dies before it can see the wind-down.
    ledger.apply = async (entry, options) => {
      if (entry.kind !== 'x402_escrow_lock') return apply(entry, options);
      const windDown = await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payer)}/wind-down`, {});
      expect(windDown.json().gatesCancelled).toHaveLength(1);
      await apply(entry);
      throw new Error('process died after the lock');
    };
    let res;
    try {
      res = await post(t, auth, '/x402/gate/create', {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 700,
        currency: 'USD',
      });
    } finally {
      ledger.apply = apply;
    }
    expect(res.statusCode).toBe(500);
    expect(await balances(t, auth, payer)).toEqual({ available: 300, escrow: 700 });
    const gateId = (await t.runtime.stores.x402.agentGates.get(payer, 1))!.ref;
    expect((await get(t, auth, `/x402/gate/${gateId}`)).json()).toMatchObject({ status: 'cancelled' });

    await sweep();
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
    expect((await ledger.getEntry(x402EntryIds.unlock(gateId)))?.state).toBe('applied');
    await expectLedgerBalances(t);
  });

  it('goes on past a gate whose look fails, and counts it', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const broken = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    const fine = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    await pause(1_100);
    const { x402 } = t.runtime.stores;
    const currentQuote = x402.currentQuote.bind(x402);
    x402.currentQuote = async (gateId) => {
      if (gateId === broken.gateId) throw new Error('this gate cannot be read');
      return currentQuote(gateId);
    };
    let summary: GateSweepSummary;
    try {
      summary = await sweep();
    } finally {
      x402.currentQuote = currentQuote;
    }
    expect(summary.failed).toBe(1);
    expect((await get(t, auth, `/x402/gate/${fine.gateId}`)).json()).toMatchObject({ status: 'expired' });
    expect((await get(t, auth, `/x402/gate/${broken.gateId}`)).json()).toMatchObject({ status: 'held' });
    expect(await balances(t, auth, payer)).toEqual({ available: 900, escrow: 100 });
    // Its backoff over, the next sweep returns it too.
    await x402.due.mark(broken.gateId, (await x402.gateById(broken.gateId))!.tenantId, new Date());
    await sweep();
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
  });
});
