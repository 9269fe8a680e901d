import { createRemoteJWKSet, jwtVerify } from 'jose';
import { BSON } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { sha256Hex } from '../../src/domain/crypto.ts';
import { X402_SCHEME } from '../../src/domain/x402.ts';
import { jobIdFor } from '../../src/queues/index.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { createRun } from '../helpers/agents.ts';
import { balances } from '../helpers/money.ts';
import {
  createGate,
  expectLedgerBalances,
  gateParties,
  get,
  post,
  quote,
  requestHash,
  sponsorWallet,
} from './helpers.ts';

describe('x402 gate: create -> quote -> wallet authorize -> authorize-payment -> verify', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  let base: string;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['x402-verify', 'settle', 'webhook-dispatch'],
      overrides: { RATE_LIMIT_MAX: '100000' },
    });
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
    await t.app.listen({ host: '127.0.0.1', port: 0 });
    base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
  });
  afterAll(() => t.close());

  // Long enough that a loaded machine cannot pass the window between the verify and the checks of the held holdback.
  const HOLDBACK_WINDOW_SECONDS = 4;

  it('pays the payee amount minus holdback from the sponsor, releases the holdback after the window, and balances', async () => {
    const { payer, payee } = await gateParties(t, auth, 0);
    const sponsor = await sponsorWallet(t, tenantId, 5_000);
    expect(
      (
        await t.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${sponsor}/policy`,
          headers: auth,
          payload: {
            currency: 'USD',
            perCallLimit: 2_000,
            dailyLimit: 10_000,
            allowedPayeeAgentIds: [payee],
            allowedToolIds: ['search'],
          },
        })
      ).statusCode,
    ).toBe(200);

    const gate = await createGate(t, auth, {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 1_000,
      holdbackBps: 1_000,
      disputeWindowSeconds: HOLDBACK_WINDOW_SECONDS,
      toolId: 'search',
      sponsorWalletId: sponsor,
    });
    expect(gate).toMatchObject({ status: 'held', escrowWalletId: sponsor });
    expect(await balances(t, auth, sponsor)).toEqual({ available: 4_000, escrow: 1_000 });

    const q = await quote(t, auth, gate.gateId, requestHash('flow'), 120);
    expect(q.paymentRequirements).toEqual({
      scheme: X402_SCHEME,
      network: t.config.x402.network,
      amount: '1000',
      asset: 'USD',
      payTo: payee,
      maxTimeoutSeconds: 120,
      extra: { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 },
    });
    const required = JSON.parse(Buffer.from(q.paymentRequired, 'base64').toString('utf8'));
    expect(required).toEqual({
      x402Version: 2,
      resource: { url: expect.stringContaining(`/x402/gate/${gate.gateId}`), description: 'tool search' },
      accepts: [q.paymentRequirements],
    });
    const again = await post(t, auth, '/x402/gate/quote', { gateId: gate.gateId, requestSha256: q.requestSha256 });
    expect(again.json().quoteId).toBe(q.quoteId);
    expect(again.json().expiresAt).toBe(q.expiresAt);

    const decision = await post(t, auth, `/x402/wallets/${sponsor}/authorize`, {
      gateId: gate.gateId,
      quoteId: q.quoteId,
      requestSha256: q.requestSha256,
    });
    expect(decision.statusCode, decision.body).toBe(200);
    const authorized = await post(t, auth, '/x402/gate/authorize-payment', {
      gateId: gate.gateId,
      quoteId: q.quoteId,
      requestSha256: q.requestSha256,
      walletDecisionToken: decision.json().walletDecisionToken,
    });
    expect(authorized.statusCode, authorized.body).toBe(200);
    const a = authorized.json();
    expect(a).toMatchObject({
      authorizationRef: expect.stringMatching(/^azn_/),
      tokenKid: t.runtime.keys.active.keyId,
      reserve: { amount: 1_000, currency: 'USD', status: 'reserved' },
    });

    // The token verifies with any JOSE library against the JWKS served over HTTP.
    const jwks = createRemoteJWKSet(new URL(`${base}/.well-known/jwks.json`));
    const { payload, protectedHeader } = await jwtVerify(a.token, jwks, {
      audience: payee,
      issuer: t.config.publicBaseUrl,
    });
    expect(protectedHeader).toMatchObject({ alg: 'EdDSA', kid: a.tokenKid });
    expect(payload).toMatchObject({
      gateId: gate.gateId,
      quoteId: q.quoteId,
      requestSha256: q.requestSha256,
      amount: 1_000,
      currency: 'USD',
      payee,
      payer,
      sub: payer,
      authorizationRef: a.authorizationRef,
      jti: expect.any(String),
    });
    expect(payload.exp).toBe(Math.floor(Date.parse(q.expiresAt) / 1000));

    const verified = await post(t, auth, '/x402/gate/verify', {
      gateId: gate.gateId,
      evidence: { responseSha256: requestHash('response') },
    });
    expect(verified.statusCode, verified.body).toBe(200);
    const v = verified.json();
    expect(v).toMatchObject({
      status: 'released',
      statusUrl: `/x402/gate/${gate.gateId}`,
      decision: { verdict: 'pass', reason: null },
      settlement: { releasedAmount: 900, holdback: 100, holdbackState: 'held' },
    });
    expect(v.receipt.body).toMatchObject({
      schema: 'SettlementReceipt.v1',
      gateId: gate.gateId,
      authorizationRef: a.authorizationRef,
      amount: 1_000,
      captured: 1_000,
      releasedNow: 900,
      holdback: 100,
      verdict: 'pass',
    });
    expect(v.receipt.receiptHash).toBe(sha256Hex(canonicalize(v.receipt.body)));
    // Clients verify receipts offline: the body's fields are a contract, exactly these.
    expect(Object.keys(v.receipt.body).sort()).toEqual([
      'amount',
      'authorizationRef',
      'captured',
      'currency',
      'decidedAt',
      'gateId',
      'holdback',
      'payeeWalletId',
      'payerWalletId',
      'quoteId',
      'releasedNow',
      'requestSha256',
      'responseSha256',
      'schema',
      'settlementId',
      'verdict',
      'verificationStatus',
    ]);
    expect(await balances(t, auth, payee)).toEqual({ available: 900, escrow: 0 });
    expect(await balances(t, auth, sponsor)).toEqual({ available: 4_000, escrow: 100 });
    // The holdback waits for the window's end: its timer job, and the sweeper's due record should the job be lost.
    expect(
      (await t.runtime.stores.settlements.due.records.findOne({ _id: v.settlement.settlementId }))?.dueAt.toISOString(),
    ).toBe(v.settlement.disputeWindowEndsAt);

    const deadline = Date.now() + 30_000;
    while ((await get(t, auth, `/x402/gate/${gate.gateId}`)).json().settlement.holdbackState !== 'released') {
      if (Date.now() > deadline) throw new Error('holdback not released');
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(await balances(t, auth, payee)).toEqual({ available: 1_000, escrow: 0 });
    expect(await balances(t, auth, sponsor)).toEqual({ available: 4_000, escrow: 0 });
    const completed = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.completed', 'data.gateId': gate.gateId })
      .toArray();
    // One shape with run settlements: the gate named, and the run and session keys present (no run pays this gate).
    expect(completed.map((e) => e.data)).toEqual([
      {
        runId: null,
        gateId: gate.gateId,
        sessionId: null,
        settlementId: v.settlement.settlementId,
        amount: 900,
        holdback: 100,
        currency: 'USD',
      },
    ]);
    const holdback = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.holdback_released', 'data.gateId': gate.gateId })
      .toArray();
    expect(holdback.map((e) => e.data)).toEqual([
      {
        runId: null,
        gateId: gate.gateId,
        sessionId: null,
        settlementId: v.settlement.settlementId,
        amount: 100,
        currency: 'USD',
      },
    ]);
    await expectLedgerBalances(t);
  });

  it('names the run a gate pays for, beside the gate, in its settlement events; refuses a run it cannot see', async () => {
    const own = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write', 'runs:write']);
    const { payer, payee } = await gateParties(t, own.auth, 1_000);
    const runId = await createRun(t, own.auth, { agentId: payee });
    const unknown = await post(t, own.auth, '/x402/gate/create', {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 300,
      currency: 'USD',
      runId: 'run_doesnotexist',
    });
    expect(unknown.statusCode, unknown.body).toBe(404);
    const otherTenants = await post(t, auth, '/x402/gate/create', {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 300,
      currency: 'USD',
      runId,
    });
    expect(otherTenants.statusCode, otherTenants.body).toBe(404);
    expect(await balances(t, own.auth, payer)).toEqual({ available: 1_000, escrow: 0 });

    const gate = await createGate(t, own.auth, { payerAgentId: payer, payeeAgentId: payee, amount: 300, runId });
    expect(gate).toMatchObject({ runId, test: false });
    const q = await quote(t, own.auth, gate.gateId);
    expect(
      (
        await post(t, own.auth, '/x402/gate/authorize-payment', {
          gateId: gate.gateId,
          quoteId: q.quoteId,
          requestSha256: q.requestSha256,
        })
      ).statusCode,
    ).toBe(200);
    const verified = await post(t, own.auth, '/x402/gate/verify', {
      gateId: gate.gateId,
      evidence: { responseSha256: requestHash('ok') },
    });
    expect(verified.statusCode, verified.body).toBe(200);
    const completed = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.completed', 'data.gateId': gate.gateId })
      .toArray();
    expect(completed.map((e) => e.data)).toEqual([
      {
        runId,
        gateId: gate.gateId,
        sessionId: null,
        settlementId: verified.json().settlement.settlementId,
        amount: 300,
        holdback: 0,
        currency: 'USD',
      },
    ]);
    // Nothing held: the window's end leaves the sweeper nothing to do, so the settlement is not due for it.
    expect(
      await t.runtime.stores.settlements.due.records.findOne({ _id: verified.json().settlement.settlementId }),
    ).toBeNull();
  });

  it('refunds the payer in full when the provider reports a failed call', async () => {
    const { payer, payee } = await gateParties(t, auth, 2_000);
    const gate = await createGate(t, auth, {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 700,
      holdbackBps: 5_000,
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 1_300, escrow: 700 });
    const q = await quote(t, auth, gate.gateId);
    expect(
      (
        await post(t, auth, '/x402/gate/authorize-payment', {
          gateId: gate.gateId,
          quoteId: q.quoteId,
          requestSha256: q.requestSha256,
        })
      ).statusCode,
    ).toBe(200);
    const verified = await post(t, auth, '/x402/gate/verify', {
      gateId: gate.gateId,
      evidence: { responseSha256: requestHash('bad') },
      verificationStatus: 'failed',
    });
    expect(verified.statusCode, verified.body).toBe(200);
    expect(verified.json()).toMatchObject({
      status: 'refunded',
      decision: { verdict: 'fail', reason: 'VERIFICATION_FAILED' },
      settlement: { refundedAmount: 700, releasedAmount: 0 },
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 2_000, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
    // A repeat answers the decision and moves nothing.
    const repeat = await post(t, auth, '/x402/gate/verify', {
      gateId: gate.gateId,
      evidence: { responseSha256: requestHash('bad') },
      verificationStatus: 'failed',
    });
    expect(repeat.json().decision).toEqual(verified.json().decision);
    expect(await balances(t, auth, payer)).toEqual({ available: 2_000, escrow: 0 });
    expect(await t.runtime.stores.outbox.events.countDocuments({ type: 'settlement.held' })).toBe(0);
    await expectLedgerBalances(t);
  });

  it('refunds a gate nobody authorized when its call is reported failed, and then refuses authorization', async () => {
    const { payer, payee } = await gateParties(t, auth, 500);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 500 });
    const q = await quote(t, auth, gate.gateId);
    const verified = await post(t, auth, '/x402/gate/verify', {
      gateId: gate.gateId,
      evidence: { responseSha256: requestHash() },
      verificationStatus: 'failed',
    });
    expect(verified.json()).toMatchObject({
      status: 'refunded',
      decision: { verdict: 'fail', reason: 'NOT_AUTHORIZED' },
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 500, escrow: 0 });
    const late = await post(t, auth, '/x402/gate/authorize-payment', {
      gateId: gate.gateId,
      quoteId: q.quoteId,
      requestSha256: q.requestSha256,
    });
    expect(late.statusCode).toBe(409);
    expect(late.json()).toMatchObject({ code: 'X402_GATE_TERMINAL', details: { status: 'refunded' } });
  });

  it('answers 202 with the status URL when no worker decides in time, and the decision follows', async () => {
    const { payer, payee } = await gateParties(t, auth, 300);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 300 });
    const q = await quote(t, auth, gate.gateId);
    await post(t, auth, '/x402/gate/authorize-payment', {
      gateId: gate.gateId,
      quoteId: q.quoteId,
      requestSha256: q.requestSha256,
    });
    const queue = t.runtime.producers.queues['x402-verify'];
    await queue.pause();
    try {
      const responseSha256 = requestHash();
      const res = await post(t, auth, '/x402/gate/verify', { gateId: gate.gateId, evidence: { responseSha256 } });
      expect(res.statusCode, res.body).toBe(202);
      expect(res.json()).toMatchObject({ status: 'settling', decision: null, statusUrl: `/x402/gate/${gate.gateId}` });
      // The job carries the report as its request recorded it (what Bull Board shows too), so it need not read it.
      const job = (await queue.getJob(jobIdFor('x402-verify', gate.gateId)))!;
      expect(BSON.EJSON.parse(job.data.report)).toMatchObject({
        _id: gate.gateId,
        tenantId,
        verificationStatus: 'verified',
        evidence: { responseSha256 },
        against: { gate: { _id: gate.gateId } },
      });
      // A copy that cannot be this gate's report is not trusted: the job reads the report itself.
      await job.updateData({ ...job.data, report: '{"_id": "gate_of_someone_else"' });
    } finally {
      await queue.resume();
    }
    const deadline = Date.now() + 10_000;
    while ((await get(t, auth, `/x402/gate/${gate.gateId}`)).json().status !== 'released') {
      if (Date.now() > deadline) throw new Error('not released');
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(await balances(t, auth, payee)).toEqual({ available: 300, escrow: 0 });
  });
});
