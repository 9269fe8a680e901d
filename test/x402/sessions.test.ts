import { createPublicKey, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { main } from '../../src/cli/verify.ts';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { sha256Hex, verifyHexDigest } from '../../src/domain/crypto.ts';
import { createProcessors } from '../../src/workers/index.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { registerAgent } from '../helpers/agents.ts';
import { balances, credit } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, get, post, X402_SCOPES } from './helpers.ts';

describe('x402 payment sessions', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  let processors: ProcessorMap;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle', 'webhook-dispatch'],
      overrides: { RATE_LIMIT_MAX: '100000', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth, tenantId } = await t.tenantWithKey([...X402_SCOPES]));
    processors = createProcessors(t.runtime);
  });
  afterAll(() => t.close());

  const open = (body: Record<string, unknown>, key = randomBytes(8).toString('hex')) =>
    post(t, auth, '/x402/sessions', { currency: 'USD', ...body }, { 'idempotency-key': key });
  const charge = (sessionId: string, body: Record<string, unknown>) =>
    post(t, auth, `/x402/sessions/${sessionId}/charges`, { paymentId: randomBytes(8).toString('hex'), ...body });
  const sweep = () => processors['x402-verify']!.sweep!();

  async function openSession(funds: number, terms: Record<string, unknown>) {
    const { payer, payee } = await gateParties(t, auth, funds);
    const res = await open({ payerAgentId: payer, payeeAgentIds: [payee], ...terms });
    expect(res.statusCode, res.body).toBe(201);
    return { payer, payee, session: res.json() as { sessionId: string; status: string; remaining: number } };
  }

  const publicKey = () => createPublicKey(t.runtime.keys.active.privateKey);

  it('reserves the budget in one move, charges a call in one request with a verifiable receipt, returns the rest at close', async () => {
    const { payer, payee, session } = await openSession(1_000, { budget: 300, maxPerCall: 50 });
    expect(session).toMatchObject({ status: 'open', remaining: 300 });
    expect(await balances(t, auth, payer)).toEqual({ available: 700, escrow: 300 });

    const res = await charge(session.sessionId, { payeeAgentId: payee, amount: 40, requestSha256: 'a'.repeat(64) });
    expect(res.statusCode, res.body).toBe(201);
    const answer = res.json();
    expect(answer).toMatchObject({ seq: 1, amount: 40, remaining: 260, repeated: false, payeeAgentId: payee });
    const { receipt } = answer;
    expect(receipt.body).toMatchObject({
      schema: 'SessionChargeReceipt.v1',
      sessionId: session.sessionId,
      amount: 40,
      payeeAgentId: payee,
      requestSha256: 'a'.repeat(64),
    });
    expect(receipt.receiptHash).toBe(sha256Hex(canonicalize(receipt.body)));
    expect(receipt.signature.keyId).toBe(t.runtime.keys.active.keyId);
    expect(verifyHexDigest(publicKey(), receipt.receiptHash, receipt.signature.value)).toBe(true);

    await charge(session.sessionId, { payeeAgentId: payee, amount: 15 });
    const closed = await post(t, auth, `/x402/sessions/${session.sessionId}/close`, {});
    expect(closed.statusCode, closed.body).toBe(200);
    expect(closed.json()).toMatchObject({
      status: 'closed',
      spent: 55,
      refunded: 245,
      charges: 2,
      statementUrl: `/x402/sessions/${session.sessionId}/statement`,
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 945, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 55, escrow: 0 });

    const statement = (await get(t, auth, `/x402/sessions/${session.sessionId}/statement`)).json();
    expect(statement.body).toMatchObject({
      schema: 'SessionStatement.v1',
      totalCharged: 55,
      refunded: 245,
      chargeCount: 2,
      voided: 0,
      reason: 'closed',
    });
    expect(statement.charges.map((c: { amount: number }) => c.amount)).toEqual([40, 15]);
    expect(statement.charges[0].receiptHash).toBe(receipt.receiptHash);
    expect(statement.body.chargesSha256).toBe(sha256Hex(canonicalize(statement.charges)));
    expect(statement.statementHash).toBe(sha256Hex(canonicalize(statement.body)));
    expect(verifyHexDigest(publicKey(), statement.statementHash, statement.signature.value)).toBe(true);
    // The offline verifier repeats every check of it from a saved copy and the JWKS; a changed charge fails it.
    const dir = mkdtempSync(join(tmpdir(), 'statement-'));
    const jwksFile = join(dir, 'jwks.json');
    writeFileSync(jwksFile, (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).body);
    const verify = async (doc: unknown) => {
      const file = join(dir, `s${randomBytes(4).toString('hex')}.json`);
      writeFileSync(file, JSON.stringify(doc));
      const out: string[] = [];
      const code = await main(['verify', file, '--jwks', jwksFile], {
        stdout: (l) => out.push(l),
        stderr: (l) => out.push(l),
      });
      return { code, out: out.join('\n') };
    };
    expect(await verify(statement)).toMatchObject({
      code: 0,
      out: expect.stringContaining('VERIFIED: all checks hold'),
    });
    const tampered = { ...statement, charges: [{ ...statement.charges[0], amount: 4 }, statement.charges[1]] };
    expect(await verify(tampered)).toMatchObject({ code: 1, out: expect.stringMatching(/✗ charges/) });
    rmSync(dir, { recursive: true, force: true });

    // Closed: no more charges; a second close answers the same.
    expect((await charge(session.sessionId, { payeeAgentId: payee, amount: 1 })).json()).toMatchObject({
      code: 'X402_SESSION_CLOSED',
    });
    expect((await post(t, auth, `/x402/sessions/${session.sessionId}/close`, {})).json()).toMatchObject({
      status: 'closed',
      refunded: 245,
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 945, escrow: 0 });
    const events = await t.runtime.stores.outbox.events.find({ 'data.sessionId': session.sessionId }).toArray();
    expect(events.map((e) => e.type).sort()).toEqual([
      'settlement.completed',
      'x402.session.closed',
      'x402.session.opened',
    ]);
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  it('50 concurrent calls against a budget for 37: exactly 37 charged, the rest refused with X402_SESSION_BUDGET_EXCEEDED', async () => {
    const { payer, payee, session } = await openSession(100, { budget: 37, maxPerCall: 1 });
    const answers = await Promise.all(
      Array.from({ length: 50 }, () => charge(session.sessionId, { payeeAgentId: payee, amount: 1 })),
    );
    const charged = answers.filter((r) => r.statusCode === 201);
    const refused = answers.filter((r) => r.statusCode !== 201);
    expect(charged).toHaveLength(37);
    expect(new Set(charged.map((r) => r.json().seq)).size).toBe(37);
    expect(refused).toHaveLength(13);
    for (const r of refused)
      expect(r.json()).toMatchObject({ code: 'X402_SESSION_BUDGET_EXCEEDED', details: { remaining: 0 } });
    await post(t, auth, `/x402/sessions/${session.sessionId}/close`, {});
    expect(await balances(t, auth, payer)).toEqual({ available: 63, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 37, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('a retried call (same payment id, or same Idempotency-Key) is charged once and answers the first receipt', async () => {
    const { payee, session } = await openSession(100, { budget: 50, maxPerCall: 10 });
    const first = await charge(session.sessionId, { paymentId: 'call-1', payeeAgentId: payee, amount: 7 });
    const again = await charge(session.sessionId, { paymentId: 'call-1', payeeAgentId: payee, amount: 7 });
    expect(again.statusCode).toBe(201);
    expect(again.json()).toMatchObject({ seq: 1, repeated: true, remaining: 43 });
    expect(again.json().receipt).toEqual(first.json().receipt);
    // The same payment id for another call is refused and charges nothing.
    expect(
      (await charge(session.sessionId, { paymentId: 'call-1', payeeAgentId: payee, amount: 8 })).json(),
    ).toMatchObject({ code: 'X402_SESSION_PAYMENT_REUSED' });
    expect(
      (
        await charge(session.sessionId, {
          paymentId: 'call-1',
          payeeAgentId: payee,
          amount: 7,
          requestSha256: 'b'.repeat(64),
        })
      ).json(),
    ).toMatchObject({ code: 'X402_SESSION_PAYMENT_REUSED' });

    const byKey = () =>
      post(
        t,
        auth,
        `/x402/sessions/${session.sessionId}/charges`,
        { payeeAgentId: payee, amount: 3 },
        { 'idempotency-key': 'call-2' },
      );
    const [a, b] = await Promise.all([byKey(), byKey()]);
    expect([a.json().seq, b.json().seq]).toEqual([2, 2]);
    expect((await get(t, auth, `/x402/sessions/${session.sessionId}`)).json()).toMatchObject({
      spent: 10,
      remaining: 40,
      charges: 2,
    });
    // Neither a payment id nor an Idempotency-Key: refused, nothing charged.
    const bare = await post(t, auth, `/x402/sessions/${session.sessionId}/charges`, { payeeAgentId: payee, amount: 3 });
    expect(bare.statusCode).toBe(422);
    expect((await get(t, auth, `/x402/sessions/${session.sessionId}`)).json()).toMatchObject({ spent: 10 });
  });

  it('refuses bad calls each with its own code and moves nothing', async () => {
    const { payer, payee, session } = await openSession(100, { budget: 20, maxPerCall: 5 });
    const stranger = await registerAgent(t, auth);
    expect((await charge(session.sessionId, { payeeAgentId: stranger.agentId, amount: 1 })).json()).toMatchObject({
      code: 'X402_SESSION_PAYEE_NOT_ALLOWED',
    });
    expect((await charge(session.sessionId, { payeeAgentId: payee, amount: 6 })).json()).toMatchObject({
      code: 'X402_SESSION_LIMIT_EXCEEDED',
      details: { maxPerCall: 5 },
    });
    const other = await t.tenantWithKey([...X402_SCOPES]);
    const foreign = await post(t, other.auth, `/x402/sessions/${session.sessionId}/charges`, {
      paymentId: 'x',
      payeeAgentId: payee,
      amount: 1,
    });
    expect(foreign.statusCode).toBe(404);
    expect((await get(t, other.auth, `/x402/sessions/${session.sessionId}`)).statusCode).toBe(404);
    expect((await get(t, auth, `/x402/sessions/${session.sessionId}`)).json()).toMatchObject({
      spent: 0,
      remaining: 20,
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 80, escrow: 20 });

    // Opening: a budget the wallet cannot cover is 402 and reserves nothing; bad terms are 422.
    const poor = await open({ payerAgentId: payer, payeeAgentIds: [payee], budget: 81, maxPerCall: 5 });
    expect(poor.statusCode).toBe(402);
    expect(await balances(t, auth, payer)).toEqual({ available: 80, escrow: 20 });
    expect((await open({ payerAgentId: payer, payeeAgentIds: [payee], budget: 5, maxPerCall: 6 })).statusCode).toBe(
      422,
    );
    expect((await open({ payerAgentId: payer, payeeAgentIds: [payer], budget: 5, maxPerCall: 5 })).statusCode).toBe(
      422,
    );
    // The same Idempotency-Key with other terms: 422, the first session stands.
    const key = randomBytes(6).toString('hex');
    const first = await open({ payerAgentId: payer, payeeAgentIds: [payee], budget: 10, maxPerCall: 5 }, key);
    const retried = await open({ payerAgentId: payer, payeeAgentIds: [payee], budget: 10, maxPerCall: 5 }, key);
    expect(retried.json().sessionId).toBe(first.json().sessionId);
    expect(await balances(t, auth, payer)).toEqual({ available: 70, escrow: 30 });
  });

  it('pays several payees from one budget, each through its own settlement with its holdback', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const second = (await registerAgent(t, auth)).agentId;
    const res = await open({
      payerAgentId: payer,
      payeeAgentIds: [payee, second],
      budget: 500,
      maxPerCall: 100,
      holdbackBps: 1_000,
    });
    const { sessionId } = res.json();
    await charge(sessionId, { payeeAgentId: payee, amount: 100 });
    await charge(sessionId, { payeeAgentId: second, amount: 50 });
    await charge(sessionId, { payeeAgentId: payee, amount: 20 });
    await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    // Released now: 90% of each payee's total; the holdback stays in escrow for the dispute window.
    expect(await balances(t, auth, payee)).toEqual({ available: 108, escrow: 0 });
    expect(await balances(t, auth, second)).toEqual({ available: 45, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 830, escrow: 17 });
    const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    expect(statement.body.payees).toMatchObject([
      { payeeAgentId: payee, charged: 120 },
      { payeeAgentId: second, charged: 50 },
    ]);
    await expectCleanAudit(t);
  });

  it('the payer disputes what a payee was paid: its holdback is frozen, and the ruling splits it', async () => {
    const { payer, payee, session } = await openSession(1_000, {
      budget: 400,
      maxPerCall: 200,
      holdbackBps: 2_500,
      disputeWindowSeconds: 3_600,
    });
    await charge(session.sessionId, { payeeAgentId: payee, amount: 200 });
    const early = await post(t, auth, `/x402/sessions/${session.sessionId}/disputes`, {
      payeeAgentId: payee,
      reason: 'too early',
    });
    expect(early.statusCode).toBe(409);
    await post(t, auth, `/x402/sessions/${session.sessionId}/close`, {});
    expect(await balances(t, auth, payee)).toEqual({ available: 150, escrow: 0 });
    const stranger = (await registerAgent(t, auth)).agentId;
    expect(
      (await post(t, auth, `/x402/sessions/${session.sessionId}/disputes`, { payeeAgentId: stranger, reason: 'who?' }))
        .statusCode,
    ).toBe(404);
    const opened = await post(t, auth, `/x402/sessions/${session.sessionId}/disputes`, {
      payeeAgentId: payee,
      reason: 'half the answers were empty',
    });
    expect(opened.statusCode, opened.body).toBe(201);
    expect(opened.json()).toMatchObject({
      status: 'open',
      sessionId: session.sessionId,
      payeeAgentId: payee,
      frozenAmount: 50,
    });
    const ruled = await t.app.inject({
      method: 'POST',
      url: `/ops/disputes/${opened.json().disputeId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'split', payerShareBps: 5_000 },
    });
    expect([200, 202], ruled.body).toContain(ruled.statusCode);
    await processors.settle!.sweep!();
    expect(await balances(t, auth, payee)).toEqual({ available: 175, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 825, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('a session past its expiry refuses calls and closes by itself, returning the rest', async () => {
    const { payer, payee, session } = await openSession(100, { budget: 40, maxPerCall: 10, ttlSeconds: 1 });
    await charge(session.sessionId, { payeeAgentId: payee, amount: 4 });
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    expect((await charge(session.sessionId, { payeeAgentId: payee, amount: 1 })).json()).toMatchObject({
      code: 'X402_SESSION_EXPIRED',
    });
    await sweep();
    expect((await get(t, auth, `/x402/sessions/${session.sessionId}`)).json()).toMatchObject({
      status: 'expired',
      spent: 4,
      refunded: 36,
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 96, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 4, escrow: 0 });
    expect((await charge(session.sessionId, { payeeAgentId: payee, amount: 1 })).json()).toMatchObject({
      code: 'X402_SESSION_EXPIRED',
    });
    const events = await t.runtime.stores.outbox.events
      .find({ 'data.sessionId': session.sessionId, type: 'x402.session.expired' })
      .toArray();
    expect(events).toHaveLength(1);
    expect(events[0]!.data).toMatchObject({ reason: 'expired', totalCharged: 4, refunded: 36 });
    await expectCleanAudit(t);
  });

  it("a wound-down agent's sessions close: charged calls are paid, the rest goes back", async () => {
    const { payer, payee, session } = await openSession(100, { budget: 60, maxPerCall: 10 });
    await charge(session.sessionId, { payeeAgentId: payee, amount: 9 });
    const res = await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payee)}/wind-down`, {});
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({
      sessionsClosed: [session.sessionId],
      escrowReturned: [{ walletId: payer, currency: 'USD', amount: 51 }],
    });
    expect((await get(t, auth, `/x402/sessions/${session.sessionId}`)).json()).toMatchObject({
      status: 'wound_down',
      refunded: 51,
    });
    expect((await charge(session.sessionId, { payeeAgentId: payee, amount: 1 })).statusCode).toBe(410);
    expect(await balances(t, auth, payer)).toEqual({ available: 91, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('a sponsor wallet opens a session only under its policy', async () => {
    const payer = (await registerAgent(t, auth)).agentId;
    const payee = (await registerAgent(t, auth)).agentId;
    const walletId = `sponsor-${randomBytes(6).toString('hex')}`;
    await t.app.inject({
      method: 'POST',
      url: `/ops/wallets/${walletId}/credit`,
      headers: t.admin,
      payload: { amount: 500, currency: 'USD', tenantId },
    });
    const body = {
      payerAgentId: payer,
      payeeAgentIds: [payee],
      budget: 100,
      maxPerCall: 10,
      sponsorWalletId: walletId,
    };
    expect((await open(body)).json()).toMatchObject({ code: 'X402_WALLET_POLICY_VIOLATION' });
    const policy = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${walletId}/policy`,
      headers: auth,
      payload: { currency: 'USD', perCallLimit: 5, dailyLimit: 1_000 },
    });
    expect(policy.statusCode, policy.body).toBe(200);
    expect((await open(body)).json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'perCallLimit' },
    });
    const ok = await open({ ...body, maxPerCall: 5 });
    expect(ok.statusCode, ok.body).toBe(201);
    expect(ok.json()).toMatchObject({ walletId, sponsorWalletId: walletId });
    const w = (await t.app.inject({ method: 'GET', url: `/v1/wallets/${walletId}`, headers: auth })).json();
    expect(w.balances.USD).toEqual({ available: 400, escrow: 100 });
    await credit(t, payer, 1); // the payer's own wallet is untouched by the sponsored session
    expect(await balances(t, auth, payer)).toEqual({ available: 1, escrow: 0 });
  });
});
