import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { main } from '../../src/cli/verify.ts';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { base64urlEncode, keyIdFor, rawPublicKey, sha256Hex, signHexDigest } from '../../src/domain/crypto.ts';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import { pricingSha256 } from '../../src/domain/pricing.ts';
import { signUsageRecord, type UsageRecord } from '../../src/domain/usage.ts';
import { verifyStatement } from '../../src/domain/x402-sessions.ts';
import { x402Service } from '../../src/services/x402/service.ts';
import { createProcessors } from '../../src/workers/index.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { registerAgent, type TestAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, credit } from '../helpers/money.ts';
import { expectLedgerBalances, get, post, requestHash, X402_SCOPES } from './helpers.ts';

// Sessions priced by use: a charge carries the payee's signed usage record instead of an amount, the session prices
// it, the payer acknowledges it after reading the response, and the statement lets anyone recompute every amount.

const PRICING = { prices: { tokens: { price: 3, per: 1_000 }, calls: { price: 1, per: 1 } }, minimum: 1, cap: 90 };

describe('x402 sessions priced by witnessed usage', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let processors: ProcessorMap;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle'],
      overrides: { RATE_LIMIT_MAX: '100000', SWEEP_STALE_AFTER_MS: '0', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth } = await t.tenantWithKey([...X402_SCOPES]));
    processors = createProcessors(t.runtime);
  });
  afterAll(() => t.close());

  async function openSession(terms: Record<string, unknown> = {}) {
    const payer = await registerAgent(t, auth);
    const payee = await registerAgent(t, auth);
    await credit(t, payer.agentId, 1_000);
    const res = await post(
      t,
      auth,
      '/x402/sessions',
      {
        currency: 'USD',
        payerAgentId: payer.agentId,
        payeeAgentIds: [payee.agentId],
        budget: 500,
        maxPerCall: 100,
        pricing: PRICING,
        holdbackBps: 5_000,
        disputeWindowSeconds: 3_600,
        ...terms,
      },
      { 'idempotency-key': randomBytes(8).toString('hex') },
    );
    expect(res.statusCode, res.body).toBe(201);
    return { payer, payee, sessionId: res.json().sessionId as string, session: res.json() };
  }

  function usageRecord(sessionId: string, payee: TestAgent, usage: Record<string, number>, paymentId?: string) {
    return {
      schema: 'UsageRecord.v1' as const,
      sessionId,
      paymentId: paymentId ?? `call-${randomBytes(6).toString('hex')}`,
      payeeAgentId: payee.agentId,
      usage,
      requestSha256: requestHash(),
      responseSha256: requestHash(),
    };
  }

  const sign = (record: UsageRecord, agent: TestAgent) => signUsageRecord(record, agent);

  function chargeUsage(sessionId: string, record: UsageRecord, payee: TestAgent, extra: Record<string, unknown> = {}) {
    return post(t, auth, `/x402/sessions/${sessionId}/charges`, {
      paymentId: record.paymentId,
      payeeAgentId: record.payeeAgentId,
      usage: { record, payeeSignature: sign(record, payee), ...extra },
    });
  }

  const acknowledge = (sessionId: string, acks: Array<{ paymentId: string; payerSignature: unknown }>) =>
    post(t, auth, `/x402/sessions/${sessionId}/acknowledgements`, { acknowledgements: acks });

  const jwks = async () => (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();

  it('records the schedule with the session and prices a charge from the payee-signed usage', async () => {
    const { payer, payee, sessionId, session } = await openSession();
    expect(session).toMatchObject({
      pricing: PRICING,
      pricingSha256: pricingSha256({
        prices: { calls: { price: 1, per: 1 }, tokens: { price: 3, per: 1_000 } },
        minimum: 1,
        cap: 90,
      }),
      requireAcknowledgedUsage: false,
    });
    expect((await get(t, auth, `/x402/sessions/${sessionId}`)).json()).toMatchObject({ pricing: PRICING });

    // 12 345 tokens at 3 per 1000: ceil(37.035) = 38, plus 2 calls at 1.
    const record = usageRecord(sessionId, payee, { tokens: 12_345, calls: 2 });
    const res = await chargeUsage(sessionId, record, payee);
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toMatchObject({ amount: 40, remaining: 460, usage: { record, payerSignature: null } });
    expect(res.json().receipt.body).toMatchObject({
      amount: 40,
      usageSha256: sha256Hex(canonicalize(record)),
      pricingSha256: session.pricingSha256,
      requestSha256: record.requestSha256,
    });
    // The same payment and record again: the first charge, nothing new.
    const again = await chargeUsage(sessionId, record, payee);
    expect(again.json()).toMatchObject({ repeated: true, amount: 40, seq: 1 });
    // The minimum: a call that used nothing pays 1.
    const idle = await chargeUsage(sessionId, usageRecord(sessionId, payee, { tokens: 0 }), payee);
    expect(idle.json()).toMatchObject({ amount: 1 });
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: 500, escrow: 500 });
  });

  it('refuses bad usage with its own code each, and nothing moves', async () => {
    const { payer, payee, sessionId } = await openSession();
    const stranger = await registerAgent(t, auth);
    const refusals: Array<[string, number, () => ReturnType<typeof post>]> = [];
    const refuse = (code: string, status: number, send: () => ReturnType<typeof post>) =>
      refusals.push([code, status, send]);
    const rec = (usage: Record<string, number>) => usageRecord(sessionId, payee, usage);

    refuse('X402_USAGE_METRIC_UNKNOWN', 422, () => chargeUsage(sessionId, rec({ rows: 3 }), payee));
    refuse('X402_USAGE_COUNT_INVALID', 422, () => chargeUsage(sessionId, rec({ tokens: -1 }), payee));
    refuse('X402_USAGE_COUNT_INVALID', 422, () => chargeUsage(sessionId, rec({ tokens: 1.5 }), payee));
    refuse('X402_USAGE_COUNT_INVALID', 422, () => chargeUsage(sessionId, rec({ tokens: 2 ** 53 }), payee));
    // Signed by another key than the payee's: the payer's own, and a stranger agent's.
    refuse('X402_USAGE_PAYEE_SIGNATURE_INVALID', 422, () => {
      const r = rec({ tokens: 10 });
      return post(t, auth, `/x402/sessions/${sessionId}/charges`, {
        paymentId: r.paymentId,
        payeeAgentId: payee.agentId,
        usage: { record: r, payeeSignature: sign(r, payer) },
      });
    });
    refuse('X402_USAGE_PAYER_SIGNATURE_INVALID', 422, () => {
      const r = rec({ tokens: 10 });
      return chargeUsage(sessionId, r, payee, { payerSignature: sign(r, stranger) });
    });
    // A valid payee signature over a record that names another session, payment, payee or request than the charge.
    for (const [field, value] of [
      ['sessionId', 'ses_other'],
      ['paymentId', 'another-payment'],
      ['payeeAgentId', stranger.agentId],
    ] as const) {
      refuse('X402_USAGE_RECORD_MISMATCH', 422, () => {
        const r = { ...rec({ tokens: 10 }), [field]: value };
        return post(t, auth, `/x402/sessions/${sessionId}/charges`, {
          paymentId: field === 'paymentId' ? 'the-charge' : r.paymentId,
          payeeAgentId: payee.agentId,
          usage: { record: r, payeeSignature: sign(r, payee) },
        });
      });
    }
    refuse('X402_USAGE_RECORD_MISMATCH', 422, () => {
      const r = rec({ tokens: 10 });
      return post(t, auth, `/x402/sessions/${sessionId}/charges`, {
        paymentId: r.paymentId,
        payeeAgentId: payee.agentId,
        requestSha256: requestHash(),
        usage: { record: r, payeeSignature: sign(r, payee) },
      });
    });
    // 30 000 tokens price at 90: at the cap, not above; 30 001 prices at 91, above it.
    refuse('X402_USAGE_ABOVE_CAP', 422, () => chargeUsage(sessionId, rec({ tokens: 30_001 }), payee));
    refuse('X402_USAGE_AND_AMOUNT', 422, () => {
      const r = rec({ tokens: 10 });
      return post(t, auth, `/x402/sessions/${sessionId}/charges`, {
        paymentId: r.paymentId,
        payeeAgentId: payee.agentId,
        amount: 1,
        usage: { record: r, payeeSignature: sign(r, payee) },
      });
    });
    refuse('VALIDATION_FAILED', 422, () =>
      post(t, auth, `/x402/sessions/${sessionId}/charges`, { paymentId: 'neither', payeeAgentId: payee.agentId }),
    );

    for (const [code, status, send] of refusals) {
      const res = await send();
      expect(res.statusCode, `${code}: ${res.body}`).toBe(status);
      expect(res.json()).toMatchObject({ code });
    }
    // Nothing was charged: the budget is whole, no seq was handed out.
    expect((await get(t, auth, `/x402/sessions/${sessionId}`)).json()).toMatchObject({ spent: 0, charges: 0 });
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: 500, escrow: 500 });

    // The per-call maximum (a schedule whose cap is above it), usage on an unpriced session, and a plain amount on a
    // session that pays acknowledged usage only.
    const loose = await openSession({ maxPerCall: 50, pricing: { prices: { tokens: { price: 1, per: 1 } } } });
    const above = await chargeUsage(
      loose.sessionId,
      usageRecord(loose.sessionId, loose.payee, { tokens: 51 }),
      loose.payee,
    );
    expect(above.json()).toMatchObject({ code: 'X402_USAGE_ABOVE_LIMIT' });
    expect(above.statusCode).toBe(409);
    const plain = await openSession({ pricing: undefined });
    const unpriced = await chargeUsage(
      plain.sessionId,
      usageRecord(plain.sessionId, plain.payee, { tokens: 1 }),
      plain.payee,
    );
    expect(unpriced.json()).toMatchObject({ code: 'X402_USAGE_NOT_PRICED' });
    const strict = await openSession({ requireAcknowledgedUsage: true });
    const amountOnly = await post(t, auth, `/x402/sessions/${strict.sessionId}/charges`, {
      paymentId: 'plain',
      payeeAgentId: strict.payee.agentId,
      amount: 5,
    });
    expect(amountOnly.json()).toMatchObject({ code: 'X402_USAGE_REQUIRED' });
    for (const s of [loose, plain, strict])
      expect((await get(t, auth, `/x402/sessions/${s.sessionId}`)).json()).toMatchObject({ spent: 0, charges: 0 });

    const badSchedule = await post(t, auth, '/x402/sessions', {
      currency: 'USD',
      payerAgentId: payer.agentId,
      payeeAgentIds: [payee.agentId],
      budget: 10,
      maxPerCall: 10,
      pricing: { prices: { tokens: { price: 1, per: 1 } }, minimum: 5, cap: 2 },
    });
    expect(badSchedule.statusCode).toBe(422);
    const ackWithoutPricing = await post(t, auth, '/x402/sessions', {
      currency: 'USD',
      payerAgentId: payer.agentId,
      payeeAgentIds: [payee.agentId],
      budget: 10,
      maxPerCall: 10,
      requireAcknowledgedUsage: true,
    });
    expect(ackWithoutPricing.statusCode).toBe(422);
  });

  it("a facilitator hold: usage above what was held, or for another request than the hold's, is refused", async () => {
    const { payee, sessionId } = await openSession();
    const tenantId = (await t.runtime.stores.x402Sessions.get(sessionId))!.tenantId;
    const sessions = x402Service(t.runtime).sessions;
    const record = usageRecord(sessionId, payee, { tokens: 10_000 }); // prices at 30
    await sessions.hold(tenantId, sessionId, {
      paymentId: record.paymentId,
      payeeAgentId: payee.agentId,
      maxAmount: 20,
      requestSha256: record.requestSha256,
    });
    await expect(
      sessions.capture(tenantId, sessionId, {
        paymentId: record.paymentId,
        payeeAgentId: payee.agentId,
        usage: { record, payeeSignature: sign(record, payee) },
      }),
    ).rejects.toMatchObject({ code: 'X402_USAGE_ABOVE_LIMIT', details: { held: 20, amount: 30 } });
    const other = { ...record, usage: { tokens: 1_000 }, requestSha256: requestHash() };
    await expect(
      sessions.capture(tenantId, sessionId, {
        paymentId: record.paymentId,
        payeeAgentId: payee.agentId,
        usage: { record: other, payeeSignature: sign(other, payee) },
      }),
    ).rejects.toMatchObject({ code: 'X402_USAGE_RECORD_MISMATCH', details: { field: 'requestSha256' } });
    const within = { ...record, usage: { tokens: 5_000 } }; // 15
    const captured = await sessions.capture(tenantId, sessionId, {
      paymentId: record.paymentId,
      payeeAgentId: payee.agentId,
      usage: { record: within, payeeSignature: sign(within, payee) },
    });
    expect(captured).toMatchObject({ charge: { amount: 15 }, remaining: 485 });
  });

  it('pays acknowledged usage only when the session requires it; the statement recomputes offline', async () => {
    const { payer, payee, sessionId } = await openSession({ requireAcknowledgedUsage: true });
    const acked = usageRecord(sessionId, payee, { tokens: 20_000 }); // 60
    const ackedAtCharge = usageRecord(sessionId, payee, { calls: 7 }); // 7
    const ignored = usageRecord(sessionId, payee, { tokens: 5_000 }); // 15
    for (const r of [acked, ignored]) expect((await chargeUsage(sessionId, r, payee)).statusCode).toBe(201);
    const withAck = await chargeUsage(sessionId, ackedAtCharge, payee, { payerSignature: sign(ackedAtCharge, payer) });
    expect(withAck.json()).toMatchObject({ amount: 7, usage: { payerSignature: { keyId: payer.keyId } } });

    // Each acknowledgement is checked before any is recorded: one bad signature records nothing.
    const bad = await acknowledge(sessionId, [
      { paymentId: acked.paymentId, payerSignature: sign(acked, payer) },
      { paymentId: ignored.paymentId, payerSignature: sign(ignored, payee) },
    ]);
    expect(bad.json()).toMatchObject({ code: 'X402_USAGE_PAYER_SIGNATURE_INVALID' });
    expect(await t.runtime.stores.x402Sessions.usageAcks.countDocuments({ sessionId })).toBe(0);
    const plainCharge = await acknowledge(sessionId, [
      { paymentId: 'never-charged', payerSignature: sign(acked, payer) },
    ]);
    expect(plainCharge.statusCode).toBe(404);

    const ok = await acknowledge(sessionId, [{ paymentId: acked.paymentId, payerSignature: sign(acked, payer) }]);
    expect(ok.statusCode, ok.body).toBe(200);
    expect(ok.json()).toEqual({ acknowledgements: [{ paymentId: acked.paymentId, seq: 1, acknowledged: true }] });
    // Idempotent: the same acknowledgement again, and one of a charge acknowledged when it was made.
    const again = await acknowledge(sessionId, [
      { paymentId: acked.paymentId, payerSignature: sign(acked, payer) },
      { paymentId: ackedAtCharge.paymentId, payerSignature: sign(ackedAtCharge, payer) },
    ]);
    expect(again.statusCode, again.body).toBe(200);

    const closed = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(closed.json()).toMatchObject({ status: 'closed', spent: 67, refunded: 433 });
    // The payee is paid for 60 + 7 (half held back for the dispute window); the unacknowledged 15 went back.
    expect(await balances(t, auth, payee.agentId)).toEqual({ available: 34, escrow: 0 });
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: 933, escrow: 33 });

    // Too late: the close decided it unacknowledged.
    const late = await acknowledge(sessionId, [
      { paymentId: ignored.paymentId, payerSignature: sign(ignored, payer) },
      { paymentId: acked.paymentId, payerSignature: sign(acked, payer) },
    ]);
    expect(late.statusCode).toBe(409);
    expect(late.json()).toMatchObject({
      code: 'X402_USAGE_ACK_AFTER_CLOSE',
      details: { paymentIds: [ignored.paymentId], acknowledged: [acked.paymentId] },
    });

    const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    expect(statement.body).toMatchObject({
      pricing: PRICING,
      requireAcknowledgedUsage: true,
      totalCharged: 67,
      unacknowledged: 15,
      refunded: 433,
      payees: [{ payeeAgentId: payee.agentId, charged: 67 }],
    });
    expect(statement.body.agentKeys).toEqual(
      [
        { agentId: payer.agentId, keyId: payer.keyId },
        { agentId: payee.agentId, keyId: payee.keyId },
      ]
        .sort((a, b) => (a.agentId < b.agentId ? -1 : 1))
        .map((k) => expect.objectContaining(k)),
    );
    expect(statement.charges.map((c: { amount: number }) => c.amount)).toEqual([60, 15, 7]);
    expect(statement.charges[1].usage).toMatchObject({ record: ignored, payerSignature: null });
    expect(statement.charges[0].usage.payerSignature).toMatchObject({ keyId: payer.keyId });
    expect(verifyStatement(statement, await jwks())).toMatchObject({ verified: true });
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  it('an unacknowledged line is disputable, citing it; an acknowledged one is refused', async () => {
    const { payer, payee, sessionId } = await openSession();
    const acked = usageRecord(sessionId, payee, { tokens: 10_000 }); // 30
    const doubted = usageRecord(sessionId, payee, { tokens: 20_000 }); // 60
    await chargeUsage(sessionId, acked, payee, { payerSignature: sign(acked, payer) });
    await chargeUsage(sessionId, doubted, payee);
    await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    // Without the requirement the payee is paid for both (half held back).
    expect(await balances(t, auth, payee.agentId)).toEqual({ available: 45, escrow: 0 });

    const citeAcked = await post(t, auth, `/x402/sessions/${sessionId}/disputes`, {
      payeeAgentId: payee.agentId,
      reason: 'wrong',
      lines: [1],
    });
    expect(citeAcked.statusCode).toBe(409);
    expect(citeAcked.json()).toMatchObject({ code: 'X402_USAGE_ACKNOWLEDGED', details: { seq: 1 } });
    const unknownLine = await post(t, auth, `/x402/sessions/${sessionId}/disputes`, {
      payeeAgentId: payee.agentId,
      reason: 'wrong',
      lines: [9],
    });
    expect(unknownLine.statusCode).toBe(422);
    const opened = await post(t, auth, `/x402/sessions/${sessionId}/disputes`, {
      payeeAgentId: payee.agentId,
      reason: 'the second answer was empty',
      lines: [2],
    });
    expect(opened.statusCode, opened.body).toBe(201);
    expect(opened.json()).toMatchObject({ status: 'open', lines: [2], frozenAmount: 45 });
  });

  it('an acknowledgement racing a close that crashed after deciding it: refused, and the finished close agrees', async () => {
    const { payer, payee, sessionId } = await openSession({ requireAcknowledgedUsage: true });
    const r = usageRecord(sessionId, payee, { tokens: 10_000 }); // 30
    await chargeUsage(sessionId, r, payee);
    armFailpoint('x402.session.acks-decided', () => {
      throw new FailpointCrash('x402.session.acks-decided');
    });
    const crashed = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(crashed.statusCode).toBe(500);
    disarmFailpoints();
    // The close died after deciding the line unacknowledged and before recording itself: the acknowledgement that
    // comes now is refused, whoever finishes the close.
    const late = await acknowledge(sessionId, [{ paymentId: r.paymentId, payerSignature: sign(r, payer) }]);
    expect(late.json()).toMatchObject({ code: 'X402_USAGE_ACK_AFTER_CLOSE', details: { paymentIds: [r.paymentId] } });
    await t.runtime.stores.x402Sessions.due.mark(
      sessionId,
      (await t.runtime.stores.x402Sessions.get(sessionId))!.tenantId,
      new Date(),
    );
    await processors['x402-verify']!.sweep!();
    const state = (await get(t, auth, `/x402/sessions/${sessionId}`)).json();
    expect(state).toMatchObject({ status: 'closed', spent: 0, refunded: 500 });
    const statement = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    expect(statement.body).toMatchObject({ unacknowledged: 30, totalCharged: 0 });
    expect(verifyStatement(statement, await jwks())).toMatchObject({ verified: true });
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: 1_000, escrow: 0 });

    // An acknowledgement that dies after its record and before its answer: sent again, it answers the same.
    const third = await openSession();
    const r3 = usageRecord(third.sessionId, third.payee, { tokens: 1_000 });
    await chargeUsage(third.sessionId, r3, third.payee);
    armFailpoint('x402.session.acknowledged', () => {
      throw new FailpointCrash('x402.session.acknowledged');
    });
    const ack3 = [{ paymentId: r3.paymentId, payerSignature: sign(r3, third.payer) }];
    expect((await acknowledge(third.sessionId, ack3)).statusCode).toBe(500);
    disarmFailpoints();
    expect((await acknowledge(third.sessionId, ack3)).json()).toEqual({
      acknowledgements: [{ paymentId: r3.paymentId, seq: 1, acknowledged: true }],
    });
    await post(t, auth, `/x402/sessions/${third.sessionId}/close`, {});
    const acked = (await get(t, auth, `/x402/sessions/${third.sessionId}/statement`)).json();
    expect(acked.charges[0].usage.payerSignature).toEqual(ack3[0]!.payerSignature);

    // The other order: an acknowledgement before the close's decision counts.
    const second = await openSession({ requireAcknowledgedUsage: true });
    const r2 = usageRecord(second.sessionId, second.payee, { tokens: 10_000 });
    await chargeUsage(second.sessionId, r2, second.payee);
    armFailpoint('x402.session.stopped', () => {
      throw new FailpointCrash('x402.session.stopped');
    });
    expect((await post(t, auth, `/x402/sessions/${second.sessionId}/close`, {})).statusCode).toBe(500);
    disarmFailpoints();
    const inTime = await acknowledge(second.sessionId, [
      { paymentId: r2.paymentId, payerSignature: sign(r2, second.payer) },
    ]);
    expect(inTime.statusCode, inTime.body).toBe(200);
    expect((await post(t, auth, `/x402/sessions/${second.sessionId}/close`, {})).json()).toMatchObject({
      status: 'closed',
      spent: 30,
    });
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  describe('offline verification fails on any tampering', () => {
    // A statement signed by a key of the test's own (its JWKS beside it), so a tampered copy can be re-hashed and
    // re-signed: only the usage checks can then find what was changed.
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const raw = rawPublicKey(publicKey);
    const kid = keyIdFor(raw);
    const testJwks = { keys: [{ kty: 'OKP', crv: 'Ed25519', x: base64urlEncode(raw), kid, alg: 'EdDSA', use: 'sig' }] };

    function resign(doc: { body: Record<string, unknown>; charges: unknown[] }) {
      const body = { ...doc.body, chargesSha256: sha256Hex(canonicalize(doc.charges as never)) };
      const statementHash = sha256Hex(canonicalize(body as never));
      return {
        body,
        charges: doc.charges,
        statementHash,
        signature: { alg: 'Ed25519', keyId: kid, value: signHexDigest(privateKey, statementHash) },
      };
    }

    type Doc = { body: Record<string, unknown>; charges: Array<Record<string, any>> };
    let original: Doc;
    beforeAll(async () => {
      const { payer, payee, sessionId } = await openSession({ requireAcknowledgedUsage: true });
      const a = usageRecord(sessionId, payee, { tokens: 12_345 }); // 38
      const b = usageRecord(sessionId, payee, { calls: 4 }); // 4
      await chargeUsage(sessionId, a, payee, { payerSignature: sign(a, payer) });
      await chargeUsage(sessionId, b, payee);
      await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
      original = (await get(t, auth, `/x402/sessions/${sessionId}/statement`)).json();
    });

    const tampered = (change: (doc: Doc) => void) => {
      const copy = structuredClone(original);
      change(copy);
      return resign(copy);
    };

    it('the untouched statement verifies, as the service signed it and re-signed', async () => {
      expect(verifyStatement(original, await jwks()).verified).toBe(true);
      expect(verifyStatement(resign(original), testJwks)).toMatchObject({ verified: true });
    });

    it.each([
      ['a usage count', (d: Doc): void => void (d.charges[0]!.usage.record.usage.tokens = 12_346), 'usage'],
      ['a line amount', (d: Doc): void => void (d.charges[0]!.amount = 39), 'usage'],
      ['a usage line removed', (d: Doc): void => void delete d.charges[0]!.usage, 'usage'],
      ['the price', (d: Doc): void => void ((d.body.pricing as any).prices.tokens.price = 4), 'usage'],
      [
        'the payee signature',
        (d: Doc): void => void (d.charges[1]!.usage.payeeSignature.value = d.charges[0]!.usage.payeeSignature.value),
        'usage',
      ],
      [
        'the payer signature',
        (d: Doc): void => void (d.charges[0]!.usage.payerSignature.value = d.charges[0]!.usage.payeeSignature.value),
        'usage',
      ],
      [
        'an acknowledgement added',
        (d: Doc): void => void (d.charges[1]!.usage.payerSignature = d.charges[0]!.usage.payerSignature),
        'usage',
      ],
      ['an agent key', (d: Doc): void => void ((d.body.agentKeys as any)[0].publicKey = base64urlEncode(raw)), 'usage'],
      ['the unacknowledged total', (d: Doc): void => void (d.body.unacknowledged = 0), 'totals'],
      ["the payee's share", (d: Doc): void => void ((d.body.payees as any)[0].charged = 42), 'totals'],
    ] as const)('%s', (_name, change, check) => {
      const result = verifyStatement(tampered(change), testJwks);
      expect(result.verified).toBe(false);
      expect(result.checks[check]).toBe(false);
    });

    it('`agent-settlement verify` checks the usage of a saved statement, and names the line that does not price', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'priced-statement-'));
      const verify = async (doc: unknown, keys: unknown) => {
        const file = join(dir, `s${randomBytes(4).toString('hex')}.json`);
        const jwksFile = join(dir, `j${randomBytes(4).toString('hex')}.json`);
        writeFileSync(file, JSON.stringify(doc));
        writeFileSync(jwksFile, JSON.stringify(keys));
        const out: string[] = [];
        const code = await main(['verify', file, '--jwks', jwksFile], {
          stdout: (l) => out.push(l),
          stderr: (l) => out.push(l),
        });
        return { code, out: out.join('\n') };
      };
      try {
        expect(await verify(original, await jwks())).toMatchObject({
          code: 0,
          out: expect.stringMatching(/✓ usage .*\n[\s\S]*VERIFIED: all checks hold/),
        });
        const overpriced = tampered((d) => void (d.charges[0]!.amount = 39));
        expect(await verify(overpriced, testJwks)).toMatchObject({
          code: 1,
          out: expect.stringMatching(/✗ usage\s+line 1: amount 39 is not the usage's price 38/),
        });
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    it('a tampered copy under the service signature fails too', async () => {
      const copy = structuredClone(original);
      copy.charges[0]!.usage.record.usage.tokens = 1;
      expect(verifyStatement(copy, await jwks())).toMatchObject({ verified: false, checks: { charges: false } });
    });
  });
});
