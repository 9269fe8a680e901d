// A close that costs the other sessions nothing (issue 40, item 6): an open session's charges are summed up 256 seqs
// at a time in the background (statement chunks), the close reads the chunks instead of every charge, and a closed
// session's payments move from Redis to a payment index in MongoDB. Whatever was summed up or not, and wherever a
// process dies on the way, the statement pays every receipted charge once and says what reading every charge says.
import { randomBytes } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import {
  chargesSha256,
  STATEMENT_CHUNK_SEQS,
  statementTotals,
  verifyStatement,
  type StatementCharge,
} from '../../src/domain/x402-sessions.ts';
import { X402Service } from '../../src/services/x402/service.ts';
import type { ChargeDoc } from '../../src/store/x402-sessions.ts';
import { createProcessors } from '../../src/workers/index.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { gateParties, get, post, X402_SCOPES } from './helpers.ts';

const CALLS_AT_ONCE = 16;

describe('x402 session statements summed up as charges arrive', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  let processors: ProcessorMap;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle'],
      overrides: { RATE_LIMIT_MAX: '1000000', SWEEP_STALE_AFTER_MS: '0', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth, tenantId } = await t.tenantWithKey([...X402_SCOPES, 'x402:read']));
    processors = createProcessors(t.runtime);
  });
  afterAll(() => t.close());
  afterEach(() => disarmFailpoints());

  const store = () => t.runtime.stores.x402Sessions;
  const redisKeys = (sessionId: string) =>
    ['budget', 'payments'].map((k) => `${t.runtime.config.redisPrefix}:{ses:${sessionId}}:${k}`);

  async function openSession(charges: number) {
    const { payer, payee } = await gateParties(t, auth, charges * 10);
    const res = await post(
      t,
      auth,
      '/x402/sessions',
      { currency: 'USD', payerAgentId: payer, payeeAgentIds: [payee], budget: charges * 10, maxPerCall: 10 },
      { 'idempotency-key': randomBytes(8).toString('hex') },
    );
    expect(res.statusCode, res.body).toBe(201);
    return { payer, payee, sessionId: res.json().sessionId as string };
  }

  /** `count` calls, CALLS_AT_ONCE at a time, amounts 1..10; answers the payment ids charged (201), in no order. */
  async function chargeMany(sessionId: string, payee: string, count: number): Promise<Map<string, number>> {
    const charged = new Map<string, number>();
    let next = 0;
    await Promise.all(
      Array.from({ length: CALLS_AT_ONCE }, async () => {
        while (next < count) {
          const i = next++;
          const paymentId = `p${i}-${randomBytes(4).toString('hex')}`;
          const res = await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
            paymentId,
            payeeAgentId: payee,
            amount: (i % 10) + 1,
          });
          expect(res.statusCode, res.body).toBe(201);
          charged.set(paymentId, res.json().seq as number);
        }
      }),
    );
    return charged;
  }

  async function waitFor<T>(what: string, probe: () => Promise<T | null | false>, timeoutMs = 60_000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const value = await probe();
      if (value) return value;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** What the statement must say, from every charge read one by one (the close before chunks did exactly this). */
  async function expectedStatement(sessionId: string, lastSeq: number) {
    const session = (await store().get(sessionId))!;
    const docs = (await store().chargesThrough(sessionId, lastSeq)).filter(
      (c): c is ChargeDoc => c?.state === 'charged',
    );
    const lines: StatementCharge[] = docs.map((c) => ({
      seq: c.seq,
      payeeAgentId: c.payeeAgentId!,
      amount: c.amount,
      paymentId: c.paymentId!,
      requestSha256: c.requestSha256,
      chargedAt: c.at.toISOString(),
      receiptHash: c.receipt!.receiptHash,
    }));
    const totals = statementTotals(session, lines);
    return { chargesSha256: chargesSha256(lines), chargeCount: lines.length, totalCharged: totals.totalCharged };
  }

  async function statementChecks(sessionId: string) {
    const statement = await get(t, auth, `/x402/sessions/${sessionId}/statement`);
    expect(statement.statusCode, statement.body).toBe(200);
    const jwks = (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
    expect(verifyStatement(statement.json(), jwks)).toMatchObject({ verified: true });
    return statement.json() as { body: Record<string, number | string>; charges: StatementCharge[] };
  }

  it('sums up full chunks while the session is open; the close reads them and its statement is what every charge says', async () => {
    const count = 3 * STATEMENT_CHUNK_SEQS + 40;
    const { payer, payee, sessionId } = await openSession(count + 1);
    // One call dies between its debit and its charge (seq 1, a hole in chunk 0): that chunk is never summed up while
    // the session is open.
    armFailpoint('x402.session.debited', () => {
      throw new FailpointCrash('x402.session.debited');
    });
    const dead = await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
      paymentId: 'dies-after-its-debit',
      payeeAgentId: payee,
      amount: 5,
    });
    expect(dead.statusCode).toBe(500);
    disarmFailpoints();
    const charged = await chargeMany(sessionId, payee, count);
    // Seq 512 started chunk 0's summing-up (which met the hole and gave up), seq 768 chunk 1's.
    await waitFor('chunk 1', () => store().getChunk(sessionId, 1));
    expect(await new X402Service(t.runtime).sessions.sumUpChunk((await store().get(sessionId))!, 0)).toBe(false);
    expect(await store().getChunk(sessionId, 0)).toBeNull();
    const chunk1 = (await store().getChunk(sessionId, 1))!;
    expect(chunk1).toMatchObject({ charged: STATEMENT_CHUNK_SEQS, voided: 0 });

    const closed = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(closed.statusCode, closed.body).toBe(200);
    const lastSeq = count + 1;
    const want = await expectedStatement(sessionId, lastSeq);
    const statement = await statementChecks(sessionId);
    expect(statement.body).toMatchObject({ ...want, voided: 1, refunded: (count + 1) * 10 - want.totalCharged });
    expect(want.chargeCount).toBe(count);
    expect(statement.charges.map((c) => c.paymentId).sort()).toEqual([...charged.keys()].sort());
    // The chunks the close read one by one are summed up now, for the statement's later readers.
    for (let c = 0; c < Math.floor(lastSeq / STATEMENT_CHUNK_SEQS); c++)
      expect(await store().getChunk(sessionId, c), `chunk ${c}`).not.toBeNull();

    // Redis keeps nothing per charge of a closed session: its payments went to the payment index in MongoDB.
    const [budgetKey, paymentsKey] = redisKeys(sessionId);
    expect(await t.runtime.redis.exists(paymentsKey!)).toBe(0);
    expect(await t.runtime.redis.ttl(budgetKey!)).toBeGreaterThan(0);
    // A retried call answers its receipt from the index; the call that died was voided, and its retry is refused.
    const [paymentId, seq] = [...charged.entries()][100]!;
    const retried = await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
      paymentId,
      payeeAgentId: payee,
      amount: (Number(/^p(\d+)-/.exec(paymentId)![1]) % 10) + 1,
    });
    expect(retried.statusCode, retried.body).toBe(201);
    expect(retried.json()).toMatchObject({ seq, repeated: true });
    const retriedDead = await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
      paymentId: 'dies-after-its-debit',
      payeeAgentId: payee,
      amount: 5,
    });
    expect(retriedDead.json()).toMatchObject({ code: 'X402_SESSION_CLOSED' });
    const lookup = async (id: string) =>
      (
        await t.app.inject({
          method: 'GET',
          url: `/x402/facilitator/payments/${encodeURIComponent(`${sessionId}:${id}`)}`,
          headers: auth,
        })
      ).json();
    expect(await lookup(paymentId)).toMatchObject({ status: 'settled' });
    expect(await lookup('dies-after-its-debit')).toMatchObject({ status: 'refused' });
    expect(await lookup('never-seen')).toMatchObject({ status: 'unknown' });
    // Without its index (a close that died before writing it), the statement's charges still answer the retry.
    await store().paymentIndex.deleteMany({ sessionId });
    expect(await lookup(paymentId)).toMatchObject({ status: 'settled' });
    expect(payer).toBeTruthy();
    await processors.settle!.sweep!();
    await expectCleanAudit(t);
  }, 180_000);

  it('a chunk summed up wrongly is never used: its sums are checked, and a crash while summing up leaves the close whole', async () => {
    const count = 2 * STATEMENT_CHUNK_SEQS + 10;
    const { payee, sessionId } = await openSession(count);
    const sessions = new X402Service(t.runtime).sessions;
    // The background summing-up of chunk 0 (started at seq 512) dies between its reads and its record.
    let crashed = false;
    armFailpoint('x402.session.chunk-read', () => {
      crashed = true;
      throw new FailpointCrash('x402.session.chunk-read');
    });
    const charged = await chargeMany(sessionId, payee, count);
    await waitFor('the summing-up of chunk 0 to reach its crash point', () => Promise.resolve(crashed));
    expect(await store().getChunk(sessionId, 0)).toBeNull();
    // Chunk 1 summed up by hand, and then made to lie: a chunk whose sums do not add up stops the close.
    expect(await sessions.sumUpChunk((await store().get(sessionId))!, 1)).toBe(true);
    const honest = (await store().getChunk(sessionId, 1))!;
    await store().chunks.deleteOne({ _id: honest._id });
    await store().chunks.insertOne({ ...honest, total: honest.total + 1 });
    const refused = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(refused.statusCode).toBe(500);
    expect(await store().closeOf(sessionId)).toBeNull();
    await store().chunks.deleteOne({ _id: honest._id });
    await store().chunks.insertOne(honest);
    const closed = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
    expect(closed.statusCode, closed.body).toBe(200);
    const want = await expectedStatement(sessionId, count);
    const statement = await statementChecks(sessionId);
    expect(statement.body).toMatchObject({ ...want, voided: 0, chargeCount: charged.size });
    await processors.settle!.sweep!();
    await expectCleanAudit(t);
  }, 180_000);

  it.each([
    ['x402.session.closed', 'after its record, before its payment index'],
    ['x402.session.indexed', 'after its payment index, before Redis forgets the payments'],
  ])(
    'a close that dies at %s (%s) is finished by the sweep',
    async (point) => {
      const count = STATEMENT_CHUNK_SEQS + 30;
      const { payee, sessionId } = await openSession(count);
      const charged = await chargeMany(sessionId, payee, count);
      armFailpoint(point, () => {
        throw new FailpointCrash(point);
      });
      const crashed = await post(t, auth, `/x402/sessions/${sessionId}/close`, {});
      expect(crashed.statusCode).toBe(500);
      disarmFailpoints();
      const [, paymentsKey] = redisKeys(sessionId);
      expect(await t.runtime.redis.exists(paymentsKey!)).toBe(1);
      await store().due.mark(sessionId, tenantId, new Date());
      await processors['x402-verify']!.sweep!();
      expect(await t.runtime.redis.exists(paymentsKey!)).toBe(0);
      expect(await store().paymentIndex.countDocuments({ sessionId })).toBe(Math.ceil(count / 256));
      const [paymentId, seq] = [...charged.entries()][0]!;
      const retried = await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
        paymentId,
        payeeAgentId: payee,
        amount: (Number(/^p(\d+)-/.exec(paymentId)![1]) % 10) + 1,
      });
      expect(retried.json()).toMatchObject({ seq, repeated: true });
      const want = await expectedStatement(sessionId, count);
      expect((await statementChecks(sessionId)).body).toMatchObject(want);
      await processors.settle!.sweep!();
      await expectCleanAudit(t);
    },
    180_000,
  );
});
