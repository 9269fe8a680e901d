import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { JsonValue } from '../../src/domain/canonical-json.ts';
import { verifyArtifact } from '../../src/domain/artifact.ts';
import { pricedUsage, pricingSha256, type PriceSchedule } from '../../src/domain/pricing.ts';
import { verifyReceipt } from '../../src/domain/receipt.ts';
import { appendEvents, createRun, events, waitFinalized } from '../helpers/agents.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, parties, settle, waitSettlement, type Parties } from '../helpers/money.ts';

// A run priced by use settles what its signed events' usage costs under its schedule, capped by the escrow, and
// returns the rest to the payer in the same settlement; a payer can recompute every figure from the artifact alone.
describe('settlement priced by use', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize', 'settle'],
      overrides: { SWEEP_INTERVAL_MS: '500', SWEEP_STALE_AFTER_MS: '0' },
    });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
  });
  afterAll(() => t.close());

  const perToken: PriceSchedule = { prices: { tokens: { price: 3, per: 1000 } } };

  /** A finalized run under `pricing` with escrow `amount`, whose agent signed `payloads`. */
  async function pricedRun(
    p: Parties,
    pricing: PriceSchedule,
    amount: number,
    payloads: Array<{ type: string; payload: JsonValue }>,
    opts: { holdbackBps?: number; pass?: boolean } = {},
  ): Promise<string> {
    const runId = await createRun(t, auth, {
      agentId: p.worker.agentId,
      terms: { accuracy: { min: 0.9 } },
      pricing,
      settlement: {
        payerAgentId: p.payer.agentId,
        amount,
        currency: 'USD',
        holdbackBps: opts.holdbackBps ?? 0,
        disputeWindowSeconds: 3600,
      },
    });
    const accuracy = { type: 'metric', payload: { name: 'accuracy', value: opts.pass === false ? 0 : 1 } };
    const batch = events(runId, { seq: 0, chainHash: null }, p.worker, [...payloads, accuracy]);
    const appended = await appendEvents(t, auth, runId, batch);
    expect(appended.statusCode, appended.body).toBe(201);
    const fin = await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    expect(fin.statusCode).toBe(202);
    await waitFinalized(t, auth, runId);
    return runId;
  }

  async function artifactOf(runId: string) {
    const run = (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
    const res = await t.app.inject({ method: 'GET', url: `/v1/artifacts/${run.artifactId}`, headers: auth });
    expect(res.statusCode, res.body).toBe(200);
    return res.json();
  }

  async function jwks() {
    return (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
  }

  it('settles the recomputed amount of a run priced per token and refunds the rest in the same settlement', async () => {
    const p = await parties(t, auth, 10_000);
    const runId = await pricedRun(p, perToken, 2_500, [
      { type: 'sample', payload: { tokens: 7_000, correct: true } },
      { type: 'sample', payload: { tokens: 5_345, correct: true } },
    ]);
    const run = (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
    expect(run.pricing).toEqual(perToken);
    const artifact = await artifactOf(runId);
    // 12,345 tokens at 3 per 1,000: 37.035, rounded up once to 38.
    expect(artifact.pricing).toEqual({
      schedule: perToken,
      pricingSha256: pricingSha256(perToken),
      usage: { tokens: 12_345 },
      subtotal: 38,
      amount: 38,
    });
    // Offline: the artifact alone gives the amount again.
    const offline = verifyArtifact(artifact, await jwks());
    expect(offline.failures).toEqual([]);
    expect(offline.checks.pricing).toBe(true);
    expect(pricedUsage(artifact.events.items, perToken).amount).toBe(38);

    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'completed');
    expect(s).toMatchObject({ amount: 2_500, releasedAmount: 38, refundedAmount: 2_462, holdback: 0 });
    expect(s.receipt.body).toMatchObject({
      runId,
      artifactHash: artifact.artifactHash,
      pricingSha256: pricingSha256(perToken),
      usage: { tokens: 12_345 },
      pricedAmount: 38,
      captured: 38,
      releasedNow: 38,
      amount: 2_500,
    });
    expect(verifyReceipt(s.receipt, await jwks(), { artifact })).toMatchObject({ verified: true });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 9_962, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 38, escrow: 0 });

    // A receipt whose charge or usage differs from the artifact's does not verify against it.
    const lying = { ...s.receipt, body: { ...s.receipt.body, usage: { tokens: 20_000 } } };
    expect(verifyReceipt(lying, await jwks(), { artifact }).checks.artifact).toBe(false);
    const overpriced = { ...artifact, pricing: { ...artifact.pricing, amount: 40 } };
    expect(verifyReceipt(s.receipt, await jwks(), { artifact: overpriced }).checks.artifact).toBe(false);
    await expectCleanAudit(t);
  });

  it('raises a small usage to the minimum, lowers a large one to the cap, and keeps a holdback of the charge', async () => {
    const schedule: PriceSchedule = { prices: { rows: { price: 7, per: 1 } }, minimum: 50, cap: 300 };
    const p = await parties(t, auth, 10_000);
    const small = await pricedRun(p, schedule, 1_000, [{ type: 'metric', payload: { name: 'rows', value: 2 } }]);
    const large = await pricedRun(p, schedule, 1_000, [{ type: 'metric', payload: { name: 'rows', value: 90 } }], {
      holdbackBps: 1_000,
    });
    expect((await artifactOf(small)).pricing).toMatchObject({ usage: { rows: 2 }, subtotal: 14, amount: 50 });
    expect((await artifactOf(large)).pricing).toMatchObject({ usage: { rows: 90 }, subtotal: 630, amount: 300 });
    await settle(t, auth, small);
    await settle(t, auth, large);
    expect(await waitSettlement(t, auth, small, (x) => x.status === 'completed')).toMatchObject({
      releasedAmount: 50,
      refundedAmount: 950,
    });
    // 300 charged: 30 held back for the dispute window, 270 released now, 700 back to the payer at once.
    expect(await waitSettlement(t, auth, large, (x) => x.status === 'completed')).toMatchObject({
      releasedAmount: 270,
      holdback: 30,
      refundedAmount: 700,
    });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 8_000 + 950 + 700, escrow: 30 });
    await expectCleanAudit(t);
  });

  it('caps usage that costs more than the escrow at the escrow', async () => {
    const p = await parties(t, auth, 1_000);
    const runId = await pricedRun(p, perToken, 100, [
      { type: 'metric', payload: { name: 'tokens', value: 5_000_000 } },
    ]);
    expect((await artifactOf(runId)).pricing).toMatchObject({ amount: 15_000 });
    await settle(t, auth, runId);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'completed');
    expect(s).toMatchObject({ releasedAmount: 100, refundedAmount: 0 });
    expect(s.receipt.body).toMatchObject({ pricedAmount: 15_000, captured: 100 });
    expect(verifyReceipt(s.receipt, await jwks(), { artifact: await artifactOf(runId) }).verified).toBe(true);
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 100, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('pays nothing on a failed verdict: the escrow is held and the receipt charges 0', async () => {
    const p = await parties(t, auth, 1_000);
    const runId = await pricedRun(p, perToken, 500, [{ type: 'sample', payload: { tokens: 10_000 } }], {
      pass: false,
    });
    const artifact = await artifactOf(runId);
    expect(artifact.evaluation.verdict).toBe('fail');
    expect(artifact.pricing).toMatchObject({ amount: 30 });
    await settle(t, auth, runId);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'held');
    expect(s).toMatchObject({ releasedAmount: 0, refundedAmount: 0 });
    expect(s.receipt.body).toMatchObject({ verdict: 'fail', captured: 0, pricedAmount: 30, releasedNow: 0 });
    expect(verifyReceipt(s.receipt, await jwks(), { artifact }).verified).toBe(true);
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 0, escrow: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 500, escrow: 500 });
    await expectCleanAudit(t);
  });

  it('finalizes usage too large to price as a fail (ARTIFACT_BUILD_FAILED) and charges nothing', async () => {
    const p = await parties(t, auth, 1_000);
    const runId = await pricedRun(p, perToken, 500, [
      { type: 'sample', payload: { tokens: Number.MAX_SAFE_INTEGER } },
      { type: 'sample', payload: { tokens: 1 } },
    ]);
    const run = (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
    expect(run).toMatchObject({ verdict: 'fail', artifactId: null, finalizeError: { code: 'ARTIFACT_BUILD_FAILED' } });
    await settle(t, auth, runId);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'held');
    expect(s.receipt.body).toMatchObject({ captured: 0, pricingSha256: pricingSha256(perToken), releasedNow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 0, escrow: 0 });
    await expectCleanAudit(t);
  });

  it.each([
    ['a fractional price', { prices: { tokens: { price: 0.5, per: 1 } } }],
    ['a zero per', { prices: { tokens: { price: 1, per: 0 } } }],
    ['a cap below the minimum', { prices: { tokens: { price: 1, per: 1 } }, minimum: 10, cap: 5 }],
    ['a bad metric name', { prices: { 'bad name': { price: 1, per: 1 } } }],
    ['no prices', { prices: {} }],
    ['a price as a string', { prices: { tokens: { price: '1', per: 1 } } }],
    ['an unknown field', { prices: { tokens: { price: 1, per: 1 } }, rounding: 'floor' }],
  ])('refuses %s with VALIDATION_FAILED and creates nothing', async (_name, pricing) => {
    const p = await parties(t, auth, 1_000);
    const runsBefore = await t.runtime.db.collection('runs').countDocuments();
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: auth,
      payload: {
        agentId: p.worker.agentId,
        pricing,
        settlement: { payerAgentId: p.payer.agentId, amount: 100, currency: 'USD' },
      },
    });
    expect([400, 422]).toContain(res.statusCode);
    expect(res.json()).toMatchObject({ code: 'VALIDATION_FAILED', requestId: expect.any(String) });
    expect(await t.runtime.db.collection('runs').countDocuments()).toBe(runsBefore);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_000, escrow: 0 });
  });
});
