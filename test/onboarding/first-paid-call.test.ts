// The first paid call through the service's own HTTP API. Until the x402 gate is part of this build, the flow stops
// at gate-create: that failure must be a 502 naming the step, recorded in the history, and a retried attempt must
// not fund its payer twice.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestApp } from '../helpers/context.ts';
import { onboardingTenant, startListeningApp } from './helpers.ts';

describe('first paid call without the x402 gate in this build', () => {
  let t: TestApp & { baseUrl: string };
  beforeAll(async () => {
    t = await startListeningApp();
  });
  afterAll(() => t?.close());

  it('answers 502 SETTLD_API_CALL_FAILED at gate-create; the retried attempt funds once; history lists it once', { timeout: 60_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const call = () => t.app.inject({ method: 'POST', url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call`, headers: { ...tenant.headers, 'idempotency-key': 'first-call-1' } });
    const first = await call();
    expect(first.statusCode, first.body).toBe(502);
    const { details } = first.json();
    expect(details).toMatchObject({ step: 'gate-create', status: 404, attemptId: expect.stringMatching(/^fpc_/) });
    expect(details.steps.map((s: { step: string; ok: boolean }) => `${s.step}:${s.ok}`)).toEqual(['register-payer:true', 'register-payee:true', 'fund:true', 'gate-create:false']);
    expect(first.body).not.toContain(t.env.adminKey);

    const again = await call(); // a 502 frees the idempotency key, so this resumes the same attempt
    expect(again.statusCode).toBe(502);
    expect(again.json().details.attemptId).toBe(details.attemptId);
    const payer = `onboarding:agent:${details.attemptId}-payer`;
    expect(await t.runtime.stores.ledger.balances(payer)).toEqual({ USD: { available: 100, escrow: 0 } });

    const history = await t.app.inject({ method: 'GET', url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history`, headers: tenant.headers });
    expect(history.statusCode, history.body).toBe(200);
    expect(history.json().items).toEqual([expect.objectContaining({ attemptId: details.attemptId, status: 'failed', result: null, lastFailure: expect.objectContaining({ step: 'gate-create', status: 404 }) })]);
  });

  it('pages the history newest first; another tenant sees none of it', { timeout: 60_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const other = await onboardingTenant(t);
    const attempts: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await t.app.inject({ method: 'POST', url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call`, headers: tenant.headers });
      attempts.push(res.json().details.attemptId);
    }
    const page = (query: string) => t.app.inject({ method: 'GET', url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history${query}`, headers: tenant.headers });
    const one = (await page('?limit=2')).json();
    expect(one.items.map((i: { attemptId: string }) => i.attemptId)).toEqual([attempts[2], attempts[1]]);
    const two = (await page(`?limit=2&cursor=${one.nextCursor}`)).json();
    expect(two).toEqual({ items: [expect.objectContaining({ attemptId: attempts[0] })], nextCursor: null });
    expect((await page('?cursor=bm9wZQ')).statusCode).toBe(400);

    const foreign = await t.app.inject({ method: 'GET', url: `/v1/tenants/${tenant.tenantId}/onboarding/first-paid-call/history`, headers: other.headers });
    expect(foreign.statusCode).toBe(404);
    const own = await t.app.inject({ method: 'GET', url: `/v1/tenants/${other.tenantId}/onboarding/first-paid-call/history`, headers: other.headers });
    expect(own.json()).toEqual({ items: [], nextCursor: null });
  });
});
