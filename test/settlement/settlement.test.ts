import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { sha256Hex, verifyHexDigest, jwkToRaw, publicKeyFromRaw } from '../../src/domain/crypto.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { createRun } from '../helpers/agents.ts';
import { balances, credit, finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';

describe('settlement: escrow, release, holdback, hold, disputes', () => {
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

  it('answers 402 INSUFFICIENT_FUNDS and creates neither run nor lock when the payer cannot cover the amount', async () => {
    const p = await parties(t, auth, 500);
    const runsBefore = await t.runtime.db.collection('runs').countDocuments();
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: auth,
      payload: {
        agentId: p.worker.agentId,
        settlement: { payerAgentId: p.payer.agentId, amount: 501, currency: 'USD' },
      },
    });
    expect(res.statusCode).toBe(402);
    expect(res.json()).toMatchObject({ code: 'INSUFFICIENT_FUNDS', details: { needed: 501, available: 500 } });
    expect(await t.runtime.db.collection('runs').countDocuments()).toBe(runsBefore);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 500, escrow: 0 });
    const other = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: auth,
      payload: {
        agentId: p.worker.agentId,
        settlement: { payerAgentId: p.payer.agentId, amount: 10, currency: 'EUR' },
      },
    });
    expect(other.statusCode).toBe(402);
  });

  it('refuses floats and strings for money with 400', async () => {
    const p = await parties(t, auth, 100);
    for (const amount of [10.5, '10', 0, -5, 2 ** 53]) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: { agentId: p.worker.agentId, settlement: { payerAgentId: p.payer.agentId, amount, currency: 'USD' } },
      });
      expect(res.statusCode, String(amount)).toBe(400);
    }
  });

  it('locks escrow at run creation, releases amount - holdback on pass, then the holdback after the window', async () => {
    const p = await parties(t, auth, 10_000);
    // A window long enough that a loaded machine cannot pass it between the settle and the checks of the held holdback.
    const runId = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 1_500,
      disputeWindowSeconds: 4,
    });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 9_000, escrow: 1_000 });
    const accepted = await settle(t, auth, runId);
    expect(accepted.statusCode).toBe(202);
    expect(accepted.json()).toMatchObject({ runId, settlementId: expect.stringMatching(/^stl_/), status: 'pending' });
    expect((await settle(t, auth, runId)).json().settlementId).toBe(accepted.json().settlementId);

    const completed = await waitSettlement(t, auth, runId, (s) => s.status === 'completed');
    expect(completed).toMatchObject({
      amount: 1_000,
      releasedAmount: 850,
      holdback: 150,
      holdbackState: 'held',
      currency: 'USD',
    });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 850, escrow: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 9_000, escrow: 150 });

    const released = await waitSettlement(t, auth, runId, (s) => s.holdbackState === 'released');
    expect(released).toMatchObject({ status: 'completed', releasedAmount: 1_000 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 1_000, escrow: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 9_000, escrow: 0 });

    const events = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.completed', 'data.runId': runId })
      .toArray();
    // One shape with gate settlements: the run named, the gate and session keys present and null.
    expect(events.map((e) => e.data)).toEqual([
      {
        runId,
        gateId: null,
        sessionId: null,
        settlementId: completed.settlementId,
        amount: 850,
        holdback: 150,
        currency: 'USD',
      },
    ]);
    // The holdback's release is a money movement of its own, announced once.
    const holdbackEvents = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.holdback_released', 'data.runId': runId })
      .toArray();
    expect(holdbackEvents.map((e) => e.data)).toEqual([
      { runId, gateId: null, sessionId: null, settlementId: completed.settlementId, amount: 150, currency: 'USD' },
    ]);
    const verify = (await t.app.inject({ method: 'GET', url: `/v1/verify/${runId}` })).json();
    expect(verify.settlement).toEqual({ status: 'completed', amount: 1_000, currency: 'USD' });
  });

  it('signs a receipt over the decision that verifies against the JWKS', async () => {
    const p = await parties(t, auth, 1_000);
    const runId = await finalizedRun(t, auth, p, { pass: true, amount: 300 });
    await settle(t, auth, runId);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'completed');
    expect(s.receipt.body).toMatchObject({
      schema: 'SettlementReceipt.v1',
      settlementId: s.settlementId,
      runId,
      amount: 300,
      verdict: 'pass',
      releasedNow: 300,
    });
    expect(s.receipt.receiptHash).toBe(sha256Hex(canonicalize(s.receipt.body)));
    const jwks = (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
    const jwk = jwks.keys.find((k: { kid: string }) => k.kid === s.receipt.signature.keyId);
    expect(verifyHexDigest(publicKeyFromRaw(jwkToRaw(jwk)), s.receipt.receiptHash, s.receipt.signature.value)).toBe(
      true,
    );
    const run = (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
    expect(s.receipt.body.artifactId).toBe(run.artifactId);
  });

  it('holds the escrow on a failed run; ops release or refund end it', async () => {
    const p = await parties(t, auth, 2_000);
    const a = await finalizedRun(t, auth, p, { pass: false, amount: 700 });
    const b = await finalizedRun(t, auth, p, { pass: false, amount: 500 });
    await settle(t, auth, a);
    await settle(t, auth, b);
    const heldA = await waitSettlement(t, auth, a, (s) => s.status === 'held');
    const heldB = await waitSettlement(t, auth, b, (s) => s.status === 'held');
    expect(heldA.decision).toMatchObject({ verdict: 'fail', reason: 'TERMS_NOT_MET' });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 800, escrow: 1_200 });
    const held = await t.runtime.stores.outbox.events.findOne({ type: 'settlement.held', 'data.runId': a });
    expect(held?.data).toEqual({
      runId: a,
      gateId: null,
      sessionId: null,
      settlementId: heldA.settlementId,
      amount: 700,
      currency: 'USD',
      reason: 'TERMS_NOT_MET',
    });

    const release = await t.app.inject({
      method: 'POST',
      url: `/ops/settlements/${heldA.settlementId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'release' },
    });
    expect(release.json()).toMatchObject({ status: 'completed', releasedAmount: 700 });
    const refund = await t.app.inject({
      method: 'POST',
      url: `/ops/settlements/${heldB.settlementId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'refund' },
    });
    expect(refund.json()).toMatchObject({ status: 'refunded', refundedAmount: 500 });
    const refunded = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.refunded', 'data.runId': b })
      .toArray();
    expect(refunded.map((e) => e.data)).toEqual([
      {
        runId: b,
        gateId: null,
        sessionId: null,
        settlementId: heldB.settlementId,
        amount: 500,
        currency: 'USD',
        reason: 'TERMS_NOT_MET',
      },
    ]);
    // The operator's release ruling is a money movement too: announced once, in the same shape.
    const releasedA = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.completed', 'data.runId': a })
      .toArray();
    expect(releasedA.map((e) => e.data)).toEqual([
      {
        runId: a,
        gateId: null,
        sessionId: null,
        settlementId: heldA.settlementId,
        amount: 700,
        holdback: 0,
        currency: 'USD',
      },
    ]);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_300, escrow: 0 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 700, escrow: 0 });
    const again = await t.app.inject({
      method: 'POST',
      url: `/ops/settlements/${heldA.settlementId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'refund' },
    });
    expect(again.statusCode).toBe(409);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_300, escrow: 0 });
  });

  it('freezes the holdback on a dispute inside the window and does not release it when the window ends', async () => {
    const p = await parties(t, auth, 5_000);
    const runId = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 2_000,
      disputeWindowSeconds: 5,
    });
    await settle(t, auth, runId);
    const s = await waitSettlement(t, auth, runId, (x) => x.status === 'completed');
    const opened = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${runId}/disputes`,
      headers: auth,
      payload: { reason: 'output was wrong', evidence: { ticket: 42 } },
    });
    expect(opened.statusCode).toBe(201);
    expect(opened.json()).toMatchObject({
      disputeId: expect.stringMatching(/^dsp_/),
      status: 'open',
      frozenAmount: 200,
    });
    const event = await t.runtime.stores.outbox.events.findOne({ type: 'dispute.opened', 'data.runId': runId });
    expect(event?.data).toEqual({
      disputeId: opened.json().disputeId,
      runId,
      gateId: null,
      sessionId: null,
      settlementId: s.settlementId,
    });
    const second = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${runId}/disputes`,
      headers: auth,
      payload: { reason: 'again' },
    });
    expect(second.statusCode).toBe(409);

    await new Promise((r) => setTimeout(r, 6_000)); // the window ends; sweeps run every 500 ms
    const frozen = (await t.app.inject({ method: 'GET', url: `/runs/${runId}/settlement`, headers: auth })).json();
    expect(frozen).toMatchObject({ status: 'disputed', holdbackState: 'frozen', releasedAmount: 800 });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 800, escrow: 0 });

    const ruled = await t.app.inject({
      method: 'POST',
      url: `/ops/disputes/${opened.json().disputeId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'split', payerShareBps: 2_500 },
    });
    expect(ruled.statusCode).toBe(200);
    expect(ruled.json()).toMatchObject({
      status: 'partially_refunded',
      releasedAmount: 950,
      refundedAmount: 50,
      dispute: { status: 'resolved', toPayer: 50, toPayee: 150 },
    });
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 950, escrow: 0 });
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 4_050, escrow: 0 });
    const resolvedEvent = await t.runtime.stores.outbox.events.findOne({
      type: 'dispute.resolved',
      'data.runId': runId,
    });
    expect(resolvedEvent?.data).toEqual({
      disputeId: opened.json().disputeId,
      runId,
      gateId: null,
      sessionId: null,
      settlementId: s.settlementId,
      outcome: 'split',
      toPayer: 50,
      toPayee: 150,
      currency: 'USD',
    });
  });

  it('answers 409 to every transition the contract forbids, and changes nothing', async () => {
    const p = await parties(t, auth, 5_000);
    const open = await createRun(t, auth, {
      agentId: p.worker.agentId,
      settlement: { payerAgentId: p.payer.agentId, amount: 100, currency: 'USD' },
    });
    const notFinal = await settle(t, auth, open);
    expect(notFinal.statusCode).toBe(409);
    expect(notFinal.json()).toMatchObject({ code: 'TRANSITION_ILLEGAL', details: { status: 'in_progress' } });
    expect(await t.runtime.db.collection('settlements').countDocuments({ runId: open })).toBe(0);

    const failed = await finalizedRun(t, auth, p, { pass: false, amount: 100 });
    await settle(t, auth, failed);
    const held = await waitSettlement(t, auth, failed, (s) => s.status === 'held');
    const disputeHeld = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${failed}/disputes`,
      headers: auth,
      payload: { reason: 'x' },
    });
    expect(disputeHeld.statusCode).toBe(409);

    const passed = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 100,
      holdbackBps: 1000,
      disputeWindowSeconds: 0,
    });
    await settle(t, auth, passed);
    const done = await waitSettlement(t, auth, passed, (s) => s.holdbackState === 'released');
    const late = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${passed}/disputes`,
      headers: auth,
      payload: { reason: 'too late' },
    });
    expect(late.statusCode).toBe(409);
    expect(late.json().details.status).toBe('completed');
    const resolveCompleted = await t.app.inject({
      method: 'POST',
      url: `/ops/settlements/${done.settlementId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'refund' },
    });
    expect(resolveCompleted.statusCode).toBe(409);
    const otherTerms = await settle(t, auth, passed, {
      settlement: { payerAgentId: p.payer.agentId, amount: 999, currency: 'USD' },
    });
    expect(otherTerms.statusCode).toBe(409);
    const unknownDispute = await t.app.inject({
      method: 'POST',
      url: '/ops/disputes/dsp_nope/resolve',
      headers: t.admin,
      payload: { outcome: 'payer' },
    });
    expect(unknownDispute.statusCode).toBe(404);
    const after = (await t.app.inject({ method: 'GET', url: `/runs/${passed}/settlement`, headers: auth })).json();
    expect(after).toMatchObject({ status: 'completed', releasedAmount: 100, refundedAmount: 0 });
    expect(
      (await t.app.inject({ method: 'GET', url: `/runs/${failed}/settlement`, headers: auth })).json().status,
    ).toBe(held.status);
  });

  it('takes settlement terms in the settle call for a run created without them (locked then, 402 if short)', async () => {
    const p = await parties(t, auth, 400);
    const runId = await createRun(t, auth, { agentId: p.worker.agentId, terms: { accuracy: { min: 0.9 } } });
    const { appendEvents, events, waitFinalized } = await import('../helpers/agents.ts');
    await appendEvents(
      t,
      auth,
      runId,
      events(runId, { seq: 0, chainHash: null }, p.worker, [
        { type: 'metric', payload: { name: 'accuracy', value: 0.95 } },
      ]),
    );
    await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    await waitFinalized(t, auth, runId);
    const withoutTerms = await settle(t, auth, runId);
    expect(withoutTerms.statusCode).toBe(409); // a well-formed request the run's state refuses
    expect(withoutTerms.json()).toMatchObject({
      code: 'TRANSITION_ILLEGAL',
      details: { status: 'finalized', settlement: null },
    });
    const short = await settle(t, auth, runId, {
      settlement: { payerAgentId: p.payer.agentId, amount: 401, currency: 'USD' },
    });
    expect(short.statusCode).toBe(402);
    const ok = await settle(t, auth, runId, {
      settlement: { payerAgentId: p.payer.agentId, amount: 400, currency: 'USD' },
    });
    expect(ok.statusCode).toBe(202);
    await waitSettlement(t, auth, runId, (s) => s.status === 'completed');
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 400, escrow: 0 });
  });

  it('keeps wallets, settlements and payers inside their tenant', async () => {
    const p = await parties(t, auth, 1_000);
    const other = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
    expect(
      (await t.app.inject({ method: 'GET', url: `/v1/wallets/${p.payer.agentId}`, headers: other })).statusCode,
    ).toBe(404);
    const theirWorker = (await import('../helpers/agents.ts')).registerAgent(t, other);
    const stealing = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: other,
      payload: {
        agentId: (await theirWorker).agentId,
        settlement: { payerAgentId: p.payer.agentId, amount: 10, currency: 'USD' },
      },
    });
    expect(stealing.statusCode).toBe(404);
    expect(await balances(t, auth, p.payer.agentId)).toEqual({ available: 1_000, escrow: 0 });
    const entries = await t.app.inject({
      method: 'GET',
      url: `/v1/wallets/${p.payer.agentId}/entries?limit=1`,
      headers: auth,
    });
    expect(entries.json().items).toHaveLength(1);
    await credit(t, p.payer.agentId, 5);
  });
});
