// The first paid call: a real x402 payment through the service's own HTTP API, against the gate and its workers.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tenantNamespace } from '../../src/domain/agent-ids.ts';
import { paidCallAttemptId, runFirstPaidCall } from '../../src/services/first-paid-call.ts';
import type { TestApp } from '../helpers/context.ts';
import { expectLedgerBalances, sponsorWallet } from '../x402/helpers.ts';
import { onboardingTenant, startListeningApp } from './helpers.ts';

const STEPS = [
  'register-payer',
  'register-payee',
  'fund',
  'gate-create',
  'quote',
  'authorize-payment',
  'provider-serve',
  'verify',
  'settlement',
];

describe('first paid call', () => {
  let t: TestApp & { baseUrl: string };
  beforeAll(async () => {
    t = await startListeningApp({ workers: ['x402-verify', 'settle'] });
  });
  afterAll(() => t?.close());

  const firstPaidCall = (tenantId: string, headers: Record<string, string>, payload: Record<string, unknown> = {}) =>
    t.app.inject({ method: 'POST', url: `/v1/tenants/${tenantId}/onboarding/first-paid-call`, headers, payload });

  /** A key of the tenant that reads wallets, to check the money through the wallet API. */
  const walletReader = async (tenantId: string) => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId, scopes: ['wallets:write'] },
    });
    expect(res.statusCode, res.body).toBe(201);
    const auth = { authorization: `Bearer ${res.json().token}` };
    return async (walletId: string) => {
      const wallet = await t.app.inject({
        method: 'GET',
        url: `/v1/wallets/${encodeURIComponent(walletId)}`,
        headers: auth,
      });
      expect(wallet.statusCode, wallet.body).toBe(200);
      const entries = await t.app.inject({
        method: 'GET',
        url: `/v1/wallets/${encodeURIComponent(walletId)}/entries?limit=200`,
        headers: auth,
      });
      expect(entries.statusCode, entries.body).toBe(200);
      return {
        balances: wallet.json().balances as Record<string, { available: number; escrow: number }>,
        entries: entries.json().items as Array<{ entryId: string; kind: string; currency: string; delta: number }>,
      };
    };
  };

  /** Every currency of these wallets: total credited = available + escrow (+ paid out, which nothing here does). */
  const expectBalanced = async (read: Awaited<ReturnType<typeof walletReader>>, walletIds: string[]) => {
    const credited: Record<string, number> = {};
    const held: Record<string, number> = {};
    for (const walletId of walletIds) {
      const { balances, entries } = await read(walletId);
      for (const e of entries.filter((x) => x.kind === 'credit'))
        credited[e.currency] = (credited[e.currency] ?? 0) + e.delta;
      for (const [currency, b] of Object.entries(balances))
        held[currency] = (held[currency] ?? 0) + b.available + b.escrow;
    }
    expect(held).toEqual(credited);
  };

  it(
    'passes end to end: every id, every step timed, the payee paid once, the money balanced',
    { timeout: 60_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const res = await firstPaidCall(tenant.tenantId, tenant.headers);
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json();
      expect(body).toMatchObject({
        result: 'passed',
        checks: { paymentTokenVerified: true, settled: true, payeePaid: true },
      });
      expect(body.steps.map((s: { step: string }) => s.step)).toEqual(STEPS);
      for (const s of body.steps) expect(s).toEqual({ step: s.step, ok: true, ms: expect.any(Number) });
      const { ids } = body;
      expect(ids).toEqual({
        attemptId: body.attemptId,
        payerAgentId: `${tenantNamespace(tenant.tenantId)}:agent:${body.attemptId}-payer`,
        payeeAgentId: `${tenantNamespace(tenant.tenantId)}:agent:${body.attemptId}-payee`,
        sponsorWalletId: null,
        fundingEntryId: expect.stringMatching(/^credit:/),
        gateId: expect.stringMatching(/^gate_/),
        quoteId: expect.stringMatching(/^quo_/),
        authorizationRef: expect.stringMatching(/^azn_/),
        settlementId: expect.stringMatching(/^stl_/),
      });

      const read = await walletReader(tenant.tenantId);
      const payer = await read(ids.payerAgentId);
      expect(payer.balances).toEqual({ USD: { available: 0, escrow: 0 } });
      expect(payer.entries.filter((e) => e.kind === 'credit')).toEqual([
        expect.objectContaining({ entryId: ids.fundingEntryId, delta: 100 }),
      ]);
      expect((await read(ids.payeeAgentId)).balances).toEqual({ USD: { available: 100, escrow: 0 } });
      await expectBalanced(read, [ids.payerAgentId, ids.payeeAgentId]);
      await expectLedgerBalances(t);

      // The attempt's own credential is revoked once it is over.
      const keys = (
        await t.app.inject({ method: 'GET', url: `/ops/api-keys?tenantId=${tenant.tenantId}`, headers: t.admin })
      ).json().items;
      expect(
        keys.filter((k: { description: string }) => k.description === `first paid call ${body.attemptId}`),
      ).toEqual([expect.objectContaining({ status: 'revoked' })]);
    },
  );

  it(
    'crashed between every pair of steps and retried each time, the attempt moves the money once and passes',
    { timeout: 120_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const attemptId = paidCallAttemptId(tenant.tenantId, 'crashy-1');
      // Each run dies right after the next step it completes (the process killed between steps), as a worker would.
      for (const crashAfter of STEPS) {
        const run = runFirstPaidCall(t.runtime, tenant.tenantId, { attemptId }, (step) => {
          if (step === crashAfter) throw new Error(`killed after ${step}`);
        });
        await expect(run, crashAfter).rejects.toThrow(`killed after ${crashAfter}`);
      }
      // The caller's retry with the same Idempotency-Key resumes that attempt.
      const res = await firstPaidCall(tenant.tenantId, { ...tenant.headers, 'idempotency-key': 'crashy-1' });
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json();
      expect(body).toMatchObject({ attemptId, result: 'passed' });
      expect(body.steps.map((s: { step: string }) => s.step)).toEqual(STEPS);

      const read = await walletReader(tenant.tenantId);
      const payer = await read(body.ids.payerAgentId);
      const payee = await read(body.ids.payeeAgentId);
      expect(payer.entries.filter((e) => e.kind === 'credit').map((e) => e.delta)).toEqual([100]);
      expect(payer.balances).toEqual({ USD: { available: 0, escrow: 0 } });
      expect(payee.balances).toEqual({ USD: { available: 100, escrow: 0 } });
      // One gate locked escrow once (two legs) and its settlement released it once.
      const { fundingEntryId, gateId, settlementId } = body.ids;
      expect(payer.entries.map((e) => e.entryId).sort()).toEqual(
        [fundingEntryId, `settle:${settlementId}:release`, `x402:${gateId}:lock`, `x402:${gateId}:lock`].sort(),
      );
      expect(payee.entries.map((e) => e.entryId)).toEqual([`settle:${settlementId}:release`]);
      await expectBalanced(read, [body.ids.payerAgentId, body.ids.payeeAgentId]);
      await expectLedgerBalances(t);

      const history = (
        await t.app.inject({
          method: 'GET',
          url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history`,
          headers: tenant.headers,
        })
      ).json();
      expect(history.items).toEqual([
        expect.objectContaining({ attemptId, status: 'passed', result: expect.objectContaining({ ids: body.ids }) }),
      ]);
    },
  );

  it(
    'pays from a sponsor wallet through its policy decision (wallet-authorize), not a funded payer',
    { timeout: 60_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const sponsor = await sponsorWallet(t, tenant.tenantId, 500);
      const policyKey = await t.app.inject({
        method: 'POST',
        url: '/ops/api-keys',
        headers: t.admin,
        payload: { tenantId: tenant.tenantId, scopes: ['wallets:write'] },
      });
      const policy = await t.app.inject({
        method: 'PUT',
        url: `/x402/wallets/${sponsor}/policy`,
        headers: { authorization: `Bearer ${policyKey.json().token}` },
        payload: {
          currency: 'USD',
          perCallLimit: 100,
          dailyLimit: 1_000,
          allowedToolIds: ['onboarding.first-paid-call'],
        },
      });
      expect(policy.statusCode, policy.body).toBe(200);

      const res = await firstPaidCall(tenant.tenantId, tenant.headers, { sponsorWalletId: sponsor });
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json();
      expect(body).toMatchObject({ result: 'passed', ids: { sponsorWalletId: sponsor, fundingEntryId: null } });
      expect(body.steps.map((s: { step: string }) => s.step)).toEqual(
        STEPS.filter((s) => s !== 'fund').flatMap((s) => (s === 'authorize-payment' ? ['wallet-authorize', s] : [s])),
      );

      const read = await walletReader(tenant.tenantId);
      expect((await read(sponsor)).balances).toEqual({ USD: { available: 400, escrow: 0 } });
      expect((await read(body.ids.payeeAgentId)).balances).toEqual({ USD: { available: 100, escrow: 0 } });
      await expectBalanced(read, [sponsor, body.ids.payeeAgentId]);
    },
  );

  it(
    'a step refused for a real cause is 502 SETTLD_API_CALL_FAILED naming it, moves nothing, and is in the history',
    { timeout: 60_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const sponsor = await sponsorWallet(t, tenant.tenantId, 40); // cannot cover the 100 the call costs
      const res = await firstPaidCall(
        tenant.tenantId,
        { ...tenant.headers, 'idempotency-key': 'poor-sponsor' },
        { sponsorWalletId: sponsor },
      );
      expect(res.statusCode, res.body).toBe(502);
      const { code, details } = res.json();
      expect(code).toBe('SETTLD_API_CALL_FAILED');
      expect(details).toMatchObject({
        step: 'gate-create',
        status: 402,
        code: 'INSUFFICIENT_FUNDS',
        attemptId: expect.stringMatching(/^fpc_/),
      });
      expect(details.steps.map((s: { step: string; ok: boolean }) => `${s.step}:${s.ok}`)).toEqual([
        'register-payer:true',
        'register-payee:true',
        'gate-create:false',
      ]);
      expect(res.body).not.toContain(t.env.adminKey);

      const read = await walletReader(tenant.tenantId);
      expect((await read(sponsor)).balances).toEqual({ USD: { available: 40, escrow: 0 } });
      await expectBalanced(read, [sponsor]);

      const history = (
        await t.app.inject({
          method: 'GET',
          url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history`,
          headers: tenant.headers,
        })
      ).json();
      expect(history.items).toEqual([
        expect.objectContaining({
          attemptId: details.attemptId,
          status: 'failed',
          sponsorWalletId: sponsor,
          result: null,
          lastFailure: expect.objectContaining({ step: 'gate-create', status: 402, code: 'INSUFFICIENT_FUNDS' }),
        }),
      ]);
    },
  );

  it(
    'a step told to wait (the admin budget spent) is 429 RATE_LIMITED with Retry-After naming the step; the retry with the same key resumes and passes',
    { timeout: 60_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      // The fund step credits with the admin key: spend the admin's rate-limit budget (rate-limiter-flexible's key).
      const adminBudget = `${t.env.redisPrefix}:rl:${t.config.rateLimit.limit}:${t.config.rateLimit.windowSeconds}:admin`;
      await t.runtime.redis.set(adminBudget, String(10 * t.config.rateLimit.limit), 'PX', 60_000);
      const headers = { ...tenant.headers, 'idempotency-key': 'busy-admin' };
      const waited = await firstPaidCall(tenant.tenantId, headers);
      expect(waited.statusCode, waited.body).toBe(429);
      expect(Number(waited.headers['retry-after'])).toBeGreaterThan(0);
      const { code, details } = waited.json();
      expect(code).toBe('RATE_LIMITED');
      expect(details).toMatchObject({
        step: 'fund',
        attemptId: expect.stringMatching(/^fpc_/),
        retryAfterSeconds: Number(waited.headers['retry-after']),
      });

      await t.runtime.redis.del(adminBudget); // the window has passed
      const resumed = await firstPaidCall(tenant.tenantId, headers);
      expect(resumed.statusCode, resumed.body).toBe(200);
      expect(resumed.json()).toMatchObject({ attemptId: details.attemptId, result: 'passed' });
    },
  );

  it('pages the history newest first; another tenant sees none of it', { timeout: 60_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const other = await onboardingTenant(t);
    const attempts: string[] = [];
    // A wallet id that is not the tenant's is refused before any step (nothing for the history).
    const unknown = await firstPaidCall(tenant.tenantId, tenant.headers, { sponsorWalletId: 'no-such-wallet' });
    expect(unknown.statusCode, unknown.body).toBe(404);
    const poor = await sponsorWallet(t, tenant.tenantId, 40);
    for (let i = 0; i < 3; i++) {
      // Cheap attempts: they stop at gate-create (the sponsor cannot cover the call).
      const res = await firstPaidCall(tenant.tenantId, tenant.headers, { sponsorWalletId: poor });
      expect(res.json().details).toMatchObject({ step: 'gate-create', status: 402 });
      attempts.push(res.json().details.attemptId);
    }
    const page = (query: string) =>
      t.app.inject({
        method: 'GET',
        url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history${query}`,
        headers: tenant.headers,
      });
    const one = (await page('?limit=2')).json();
    expect(one.items.map((i: { attemptId: string }) => i.attemptId)).toEqual([attempts[2], attempts[1]]);
    const two = (await page(`?limit=2&cursor=${one.nextCursor}`)).json();
    expect(two).toEqual({ items: [expect.objectContaining({ attemptId: attempts[0] })], nextCursor: null });
    expect((await page('?cursor=bm9wZQ')).statusCode).toBe(422); // base64url, but not a cursor this API issued

    const foreign = await t.app.inject({
      method: 'GET',
      url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history`,
      headers: other.headers,
    });
    expect(foreign.statusCode).toBe(404);
    const own = await t.app.inject({
      method: 'GET',
      url: `/v1/tenants/${other.tenantId}/onboarding/first-paid-call/history`,
      headers: other.headers,
    });
    expect(own.json()).toEqual({ items: [], nextCursor: null });
  });
});
