import type { LightMyRequestResponse } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { createProcessors } from '../../src/workers/index.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, get, post, requestHash, X402_SCOPES } from './helpers.ts';
import { expectCleanAudit } from '../helpers/audit.ts';

// Every step between the first and the last durable write of the gate's flows, crashed at: the request dies there
// (answers 500), the sweepers run, the client retries with the same Idempotency-Key, the flow goes on to its end.
// Then the money must be whole and moved once: the payer's available + escrow plus the payee's available is what was
// credited, nothing is left in escrow once the gate is final, and the payee was paid at most once.

const FUNDS = 1_000;
const AMOUNT = 400;

type Final = 'released' | 'refunded' | 'cancelled' | 'expired';

interface Harness {
  t: TestApp;
  auth: Record<string, string>;
  processors: ProcessorMap;
}

function harness(overrides: Record<string, string>): Harness {
  const h = {} as Harness;
  beforeAll(async () => {
    // The workers run the jobs; the test runs the sweepers itself (their schedule is too slow to matter here).
    h.t = await startTestApp({
      workers: ['x402-verify', 'settle'],
      overrides: {
        RATE_LIMIT_MAX: '100000',
        SWEEP_STALE_AFTER_MS: '0',
        SWEEP_INTERVAL_MS: '3600000',
        X402_AUTHORIZATION_GRACE_SECONDS: '0',
        ...overrides,
      },
    });
    ({ auth: h.auth } = await h.t.tenantWithKey([...X402_SCOPES]));
    h.processors = createProcessors(h.t.runtime);
  });
  afterAll(() => h.t.close());
  afterEach(() => disarmFailpoints());
  return h;
}

/** One client of one payer and payee, crashing at `point` and retrying as a careful client does. */
function client(h: Harness, point: string) {
  let parties: { payer: string; payee: string };
  let crashed = false;
  /** Arms the crash point: the next request, job or sweep that reaches it dies there. */
  const arm = (name: string) =>
    armFailpoint(name, () => {
      crashed = true;
      throw new FailpointCrash(name);
    });

  const sweepers = async () => {
    await h.processors['x402-verify']!.sweep!();
    await h.processors.settle!.sweep!();
  };

  /** A request with its Idempotency-Key; when it crashes (500), the sweepers run and it is retried with the same key. */
  const call = async (step: string, url: string, body: unknown): Promise<LightMyRequestResponse> => {
    const headers = { 'idempotency-key': `${point}:${step}` };
    const first = await post(h.t, h.auth, url, body, headers);
    if (first.statusCode !== 500) return first;
    expect(first.json()).toMatchObject({ code: 'INTERNAL' });
    expect(crashed).toBe(true);
    disarmFailpoints();
    await sweepers();
    return post(h.t, h.auth, url, body, headers);
  };

  /** A crash inside a sweep (or a job the sweep runs): counted, not thrown; the item backs off, then is looked at again. */
  const sweepThroughCrash = async (gateId: string) => {
    await h.processors['x402-verify']!.sweep!();
    disarmFailpoints();
    await h.t.runtime.stores.x402.due.mark(
      gateId,
      (await h.t.runtime.stores.x402.gateById(gateId))!.tenantId,
      new Date(),
    ); // its backoff is over
    await sweepers();
  };

  return {
    arm,
    sweepers,
    sweepThroughCrash,
    get crashed() {
      return crashed;
    },
    async start() {
      parties = await gateParties(h.t, h.auth, FUNDS);
      return parties;
    },
    async create(): Promise<string> {
      const res = await call('create', '/x402/gate/create', {
        payerAgentId: parties.payer,
        payeeAgentId: parties.payee,
        amount: AMOUNT,
        currency: 'USD',
      });
      expect(res.statusCode, res.body).toBe(201);
      return res.json().gateId;
    },
    async quote(gateId: string, ttlSeconds = 300) {
      const res = await call('quote', '/x402/gate/quote', { gateId, requestSha256: requestHash(point), ttlSeconds });
      expect(res.statusCode, res.body).toBe(200);
      return res.json() as { quoteId: string; requestSha256: string };
    },
    async authorize(gateId: string, q: { quoteId: string; requestSha256: string }) {
      const res = await call('authorize', '/x402/gate/authorize-payment', {
        gateId,
        quoteId: q.quoteId,
        requestSha256: q.requestSha256,
      });
      expect(res.statusCode, res.body).toBe(200);
      return res.json();
    },
    /** `amount`: a metered capture (what the call cost). */
    verify(gateId: string, verificationStatus: 'verified' | 'failed', amount?: number) {
      return call('verify', '/x402/gate/verify', {
        gateId,
        evidence: { responseSha256: 'c'.repeat(64) },
        verificationStatus,
        ...(amount === undefined ? {} : { amount }),
      });
    },
    async windDown() {
      const res = await call('wind-down', `/x402/gate/agents/${encodeURIComponent(parties.payer)}/wind-down`, {});
      expect(res.statusCode, res.body).toBe(200);
      return res.json();
    },
    /** The gate ended as `final`, and the money is whole and moved once (`paid` to the payee when released). */
    async expectFinal(gateId: string, final: Final, paid = AMOUNT) {
      await sweepers();
      expect((await get(h.t, h.auth, `/x402/gate/${gateId}`)).json()).toMatchObject({ status: final });
      const payer = await balances(h.t, h.auth, parties.payer);
      const payee = await balances(h.t, h.auth, parties.payee);
      expect(payer.available + payer.escrow + payee.available).toBe(FUNDS);
      expect(payer.escrow).toBe(0);
      expect(payee.escrow).toBe(0);
      expect(payee.available).toBe(final === 'released' ? paid : 0);
      await expectLedgerBalances(h.t);
      await expectCleanAudit(h.t);
    },
  };
}

describe('x402 crash points: request flows', () => {
  const h = harness({});

  for (const point of [
    'x402.create.recorded',
    'x402.create.lock-recorded',
    'x402.create.locked',
    'x402.authorize.checked',
    'x402.authorize.committed',
    'x402.verify.settlement-stored',
    'x402.verify.reported',
  ]) {
    it(`create, authorize, verify(verified): crash at ${point}`, async () => {
      const c = client(h, point);
      await c.start();
      if (point.startsWith('x402.create.')) c.arm(point);
      const gateId = await c.create();
      const q = await c.quote(gateId);
      if (point.startsWith('x402.authorize.')) c.arm(point);
      const authorization = await c.authorize(gateId, q);
      expect(authorization).toMatchObject({ reserve: { amount: AMOUNT, status: 'reserved' } });
      if (point.startsWith('x402.verify.')) c.arm(point);
      const verified = await c.verify(gateId, 'verified');
      expect([200, 202], verified.body).toContain(verified.statusCode);
      expect(c.crashed).toBe(true);
      await c.expectFinal(gateId, 'released');
    });
  }

  it('verify(verified): crash in the verify job after its decision (x402.verify-job.decided)', async () => {
    const c = client(h, 'x402.verify-job.decided');
    await c.start();
    const gateId = await c.create();
    await c.authorize(gateId, await c.quote(gateId));
    c.arm('x402.verify-job.decided');
    const first = await c.verify(gateId, 'verified'); // the job dies after its decision: the request answers 202
    expect(c.crashed).toBe(true);
    await c.sweepThroughCrash(gateId);
    const again = await c.verify(gateId, 'verified');
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.statusCode).toBe(first.statusCode);
    await c.expectFinal(gateId, 'released');
  });

  // A metered capture: one release entry pays the payee and returns the uncaptured rest to the payer (a zero capture
  // only returns); at `ledger.position-claimed` the job dies with that entry's legs half posted. The facilitator's
  // lookup then answers what its settle would.
  const metered: Array<[string, number]> = [
    ['x402.verify.reported', 150],
    ['x402.verify-job.decided', 150],
    ['ledger.position-claimed', 150],
    ['settlement.released', 150],
    ['settlement.released', 0],
  ];
  for (const [point, captured] of metered) {
    it(`metered verify capturing ${captured} of ${AMOUNT}: crash at ${point}`, async () => {
      const c = client(h, `${point}.metered-${captured}`);
      await c.start();
      const gateId = await c.create();
      await c.authorize(gateId, await c.quote(gateId));
      c.arm(point);
      const first = await c.verify(gateId, 'verified', captured); // a crash of the request itself is retried inside
      expect([200, 202], first.body).toContain(first.statusCode);
      expect(c.crashed).toBe(true);
      if (point !== 'x402.verify.reported') await c.sweepThroughCrash(gateId);
      const again = await c.verify(gateId, 'verified', captured);
      expect(again.headers['idempotent-replayed']).toBe('true');
      await c.expectFinal(gateId, captured === 0 ? 'refunded' : 'released', captured);
      const payment = (await get(h.t, h.auth, `/x402/facilitator/payments/${gateId}`)).json();
      expect(payment).toMatchObject({ status: 'settled', settlement: { success: true, amount: String(captured) } });
    });
  }

  it('verify(failed) of an authorized gate: crash at x402.verify.reported', async () => {
    const c = client(h, 'x402.verify.reported.failed');
    await c.start();
    const gateId = await c.create();
    await c.authorize(gateId, await c.quote(gateId));
    c.arm('x402.verify.reported');
    const res = await c.verify(gateId, 'failed');
    expect(res.statusCode, res.body).toBe(200);
    expect(c.crashed).toBe(true);
    await c.expectFinal(gateId, 'refunded');
  });

  it('verify(failed) of a gate nobody authorized: crash at x402.verify.voided (between voiding and the report)', async () => {
    const c = client(h, 'x402.verify.voided');
    await c.start();
    const gateId = await c.create();
    c.arm('x402.verify.voided');
    const res = await c.verify(gateId, 'failed');
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ status: 'refunded' });
    expect(c.crashed).toBe(true);
    await c.expectFinal(gateId, 'refunded');
  });

  for (const point of ['x402.wind-down.recorded', 'x402.cancel.committed']) {
    it(`wind-down of the payer of a held gate: crash at ${point}`, async () => {
      const c = client(h, point);
      await c.start();
      const gateId = await c.create();
      c.arm(point);
      const summary = await c.windDown();
      expect(c.crashed).toBe(true);
      expect(summary).toMatchObject({ gatesCancelled: [gateId] });
      await c.expectFinal(gateId, 'cancelled');
    });
  }

  it('a create retried after a 5xx with other terms under the same key is 422 IDEMPOTENCY_KEY_REUSED and locks nothing more', async () => {
    const c = client(h, 'reuse');
    const { payer, payee } = await c.start();
    const headers = { 'idempotency-key': 'reuse:create' };
    c.arm('x402.create.locked');
    expect(
      (
        await post(
          h.t,
          h.auth,
          '/x402/gate/create',
          { payerAgentId: payer, payeeAgentId: payee, amount: AMOUNT, currency: 'USD' },
          headers,
        )
      ).statusCode,
    ).toBe(500);
    const other = await post(
      h.t,
      h.auth,
      '/x402/gate/create',
      { payerAgentId: payer, payeeAgentId: payee, amount: AMOUNT + 1, currency: 'USD' },
      headers,
    );
    expect(other.statusCode, other.body).toBe(422);
    expect(other.json()).toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
    expect(await balances(h.t, h.auth, payer)).toEqual({ available: FUNDS - AMOUNT, escrow: AMOUNT });
    await expectLedgerBalances(h.t);
  });
});

describe('x402 crash points: expiry', () => {
  // Gates nobody authorizes expire after 1 s, authorizations at their token's expiry.
  const h = harness({ X402_GATE_TTL_SECONDS: '1' });
  const pastDeadline = () => new Promise((resolve) => setTimeout(resolve, 1_100));

  it('a held gate expiring: crash at x402.expire.committed (between the expiry and the return)', async () => {
    const c = client(h, 'x402.expire.committed');
    await c.start();
    const gateId = await c.create();
    await pastDeadline();
    c.arm('x402.expire.committed');
    await c.sweepThroughCrash(gateId);
    expect(c.crashed).toBe(true);
    await c.expectFinal(gateId, 'expired');
  });

  it('an authorized gate expiring: crash at x402.expire.returned (between its return and the refund)', async () => {
    const c = client(h, 'x402.expire.returned');
    await c.start();
    const gateId = await c.create();
    await c.authorize(gateId, await c.quote(gateId, 1));
    await pastDeadline();
    c.arm('x402.expire.returned');
    await c.sweepThroughCrash(gateId);
    expect(c.crashed).toBe(true);
    expect((await c.verify(gateId, 'verified')).json()).toMatchObject({ code: 'X402_AUTHORIZATION_EXPIRED' });
    await c.expectFinal(gateId, 'expired');
  });

  it('verify(verified) after the deadline: crash at x402.verify.returned; the retry is refused too', async () => {
    const c = client(h, 'x402.verify.returned');
    await c.start();
    const gateId = await c.create();
    await c.authorize(gateId, await c.quote(gateId, 1));
    await pastDeadline();
    c.arm('x402.verify.returned');
    const res = await c.verify(gateId, 'verified');
    expect(c.crashed).toBe(true);
    expect(res.statusCode, res.body).toBe(409);
    expect(res.json()).toMatchObject({ code: 'X402_AUTHORIZATION_EXPIRED' });
    await c.expectFinal(gateId, 'expired');
  });
});
