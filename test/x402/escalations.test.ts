import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, gateParties, get, post, quote, requestHash, sponsorWallet } from './helpers.ts';

describe('x402 escalations, wind-down, tenants and scopes', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  beforeAll(async () => {
    t = await startTestApp({
      workers: ['x402-verify', 'settle', 'webhook-dispatch'],
      overrides: { RATE_LIMIT_MAX: '100000' },
    });
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
  });
  afterAll(() => t.close());

  const authorize = (body: Record<string, unknown>) => post(t, auth, '/x402/gate/authorize-payment', body);
  const events = (type: string) => t.runtime.stores.outbox.events.find({ type: type as never }).toArray();

  /** A gate whose payer's own policy caps calls at 100, so a 500 call breaches it. */
  async function breachingGate(funds = 1_000, amount = 500) {
    const { payer, payee } = await gateParties(t, auth, funds);
    await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: auth,
      payload: { currency: 'USD', perCallLimit: 100 },
    });
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount });
    const q = await quote(t, auth, gate.gateId);
    return { payer, payee, gate, q, body: { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 } };
  }

  it('a policy breach escalates (409 with escalationId); approve gives a single-use override; a replay is refused', async () => {
    const { payer, gate, body } = await breachingGate();
    const breach = await authorize(body);
    expect(breach.statusCode).toBe(409);
    expect(breach.json()).toMatchObject({
      code: 'X402_AUTHORIZATION_ESCALATION_REQUIRED',
      details: { escalationId: expect.stringMatching(/^esc_/), rule: 'perCallLimit', status: 'pending' },
    });
    const escalationId = breach.json().details.escalationId;
    expect((await authorize(body)).json().details.escalationId).toBe(escalationId); // the same escalation, not a second
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json().authorization).toBeNull();

    const listed = (await get(t, auth, `/x402/gate/escalations?status=pending&gateId=${gate.gateId}`)).json();
    expect(listed.items).toHaveLength(1);
    expect(listed.items[0]).toMatchObject({
      escalationId,
      status: 'pending',
      rule: 'perCallLimit',
      payerAgentId: payer,
      amount: 500,
    });

    const forged = await authorize({ ...body, escalationOverrideToken: 'eyJhbGciOiJFZERTQSJ9.e30.AAAA' });
    expect(forged.json()).toMatchObject({ code: 'X402_OVERRIDE_INVALID' });

    const approved = await post(t, auth, `/x402/gate/escalations/${escalationId}/resolve`, {
      action: 'approve',
      reason: 'known tool',
    });
    expect(approved.statusCode, approved.body).toBe(200);
    expect(approved.json()).toMatchObject({ status: 'approved', escalationOverrideToken: expect.any(String) });
    const again = await post(t, auth, `/x402/gate/escalations/${escalationId}/resolve`, { action: 'deny' });
    expect(again.json()).toMatchObject({ code: 'X402_ESCALATION_TERMINAL', details: { status: 'approved' } });

    const token = approved.json().escalationOverrideToken;
    const paid = await authorize({ ...body, escalationOverrideToken: token });
    expect(paid.statusCode, paid.body).toBe(200);
    const replay = await authorize({ ...body, escalationOverrideToken: token });
    expect(replay.json()).toMatchObject({ code: 'X402_OVERRIDE_REPLAYED' });
    expect((await authorize(body)).json().token).toBe(paid.json().token); // without it, the repeat gets the same token
    expect((await events('x402.escalation.created')).map((e) => e.data.escalationId)).toContain(escalationId);
    expect((await events('x402.escalation.approved')).map((e) => e.data.escalationId)).toEqual([escalationId]);

    // The override of one gate is invalid on another.
    const other = await breachingGate();
    const elsewhere = await authorize({ ...other.body, escalationOverrideToken: token });
    expect(elsewhere.json()).toMatchObject({ code: 'X402_OVERRIDE_INVALID' });
    expect((await get(t, auth, `/x402/gate/${other.gate.gateId}`)).json().authorization).toBeNull();
  });

  it('deny ends an escalation; its override cannot be had; the list pages newest first', async () => {
    const created: string[] = [];
    for (let i = 0; i < 3; i++) {
      const { body } = await breachingGate();
      created.push((await authorize(body)).json().details.escalationId);
    }
    const denied = await post(t, auth, `/x402/gate/escalations/${created[0]}/resolve`, {
      action: 'deny',
      reason: 'no',
    });
    expect(denied.json()).toMatchObject({ status: 'denied', escalationOverrideToken: null });
    expect((await events('x402.escalation.denied')).map((e) => e.data.escalationId)).toContain(created[0]);

    const page1 = (await get(t, auth, '/x402/gate/escalations?limit=2')).json();
    expect(page1.items).toHaveLength(2);
    expect(page1.items.map((e: { escalationId: string }) => e.escalationId)).toEqual([created[2], created[1]]);
    const page2 = (await get(t, auth, `/x402/gate/escalations?limit=2&cursor=${page1.nextCursor}`)).json();
    expect(page2.items[0].escalationId).toBe(created[0]);
    const deniedOnly = (await get(t, auth, '/x402/gate/escalations?status=denied')).json();
    expect(deniedOnly.items.map((e: { escalationId: string }) => e.escalationId)).toEqual([created[0]]);
  });

  it('wind-down cancels unauthorized gates, returns their escrow, denies escalations; a repeat answers the same', async () => {
    const { payer, payee, gate: escalated, body } = await breachingGate(5_000, 500);
    const escalationId = (await authorize(body)).json().details.escalationId;
    const open = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 300 });
    const liveQuote = await quote(t, auth, open.gateId);
    await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: auth,
      payload: { currency: 'USD' },
    });
    const reserved = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 200 });
    const rq = await quote(t, auth, reserved.gateId);
    expect(
      (await authorize({ gateId: reserved.gateId, quoteId: rq.quoteId, requestSha256: rq.requestSha256 })).statusCode,
    ).toBe(200);
    expect(await balances(t, auth, payer)).toEqual({ available: 4_000, escrow: 1_000 });

    const res = await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payer)}/wind-down`, {
      reasonCode: 'retired',
    });
    expect(res.statusCode, res.body).toBe(200);
    const summary = res.json();
    expect(summary).toMatchObject({
      agentId: payer,
      status: 'wound_down',
      reasonCode: 'retired',
      gatesLeftReserved: [reserved.gateId],
      escalationsDenied: [escalationId],
      escrowReturned: [{ walletId: payer, currency: 'USD', amount: 800 }],
    });
    expect([...summary.gatesCancelled].sort()).toEqual([escalated.gateId, open.gateId].sort());
    expect(summary.quotesCancelled).toContain(liveQuote.quoteId);
    expect(await balances(t, auth, payer)).toEqual({ available: 4_800, escrow: 200 });
    expect((await get(t, auth, `/x402/gate/${open.gateId}`)).json()).toMatchObject({
      status: 'cancelled',
      quote: { status: 'cancelled' },
    });
    expect((await get(t, auth, `/x402/gate/escalations?gateId=${escalated.gateId}`)).json().items[0]).toMatchObject({
      status: 'denied',
      resolution: { by: `wind-down:${payer}` },
    });

    const repeat = await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payer)}/wind-down`, {
      reasonCode: 'other',
    });
    expect(repeat.json()).toEqual(summary);
    expect(await balances(t, auth, payer)).toEqual({ available: 4_800, escrow: 200 });
    expect(
      await t.runtime.stores.outbox.events.countDocuments({ type: 'x402.agent.wound_down', 'data.agentId': payer }),
    ).toBe(1);

    const newGate = await post(t, auth, '/x402/gate/create', {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 10,
      currency: 'USD',
    });
    expect(newGate.statusCode).toBe(410);
    expect(newGate.json()).toMatchObject({ code: 'X402_AGENT_WOUND_DOWN', details: { agentId: payer } });
    expect(
      (await authorize({ gateId: open.gateId, quoteId: liveQuote.quoteId, requestSha256: liveQuote.requestSha256 }))
        .statusCode,
    ).toBe(410);
    // The reserved gate can no longer pay (contract 11: no verify after a wind-down): the payer is refunded instead.
    const late = await post(t, auth, '/x402/gate/verify', {
      gateId: reserved.gateId,
      evidence: { responseSha256: requestHash() },
    });
    expect(late.statusCode).toBe(410);
    expect(late.json()).toMatchObject({ code: 'X402_AGENT_WOUND_DOWN', details: { agentId: payer } });
    for (let i = 0; i < 50 && (await balances(t, auth, payer)).escrow > 0; i++)
      await new Promise((resolve) => setTimeout(resolve, 100));
    expect(await balances(t, auth, payer)).toEqual({ available: 5_000, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
  });

  it('another tenant sees 404 for every gate, quote, wallet and escalation; scopes are enforced (403)', async () => {
    const { body, gate } = await breachingGate();
    const escalationId = (await authorize(body)).json().details.escalationId;
    const sponsor = await sponsorWallet(t, tenantId, 100);
    const other = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write'], 'other');
    const theirs = await gateParties(t, other.auth, 1_000);
    const probes = [
      get(t, other.auth, `/x402/gate/${gate.gateId}`),
      post(t, other.auth, '/x402/gate/quote', { gateId: gate.gateId, requestSha256: requestHash() }),
      post(t, other.auth, '/x402/gate/authorize-payment', body),
      post(t, other.auth, '/x402/gate/verify', { gateId: gate.gateId, evidence: { responseSha256: requestHash() } }),
      post(t, other.auth, `/x402/gate/escalations/${escalationId}/resolve`, { action: 'approve' }),
      get(t, other.auth, `/x402/wallets/${sponsor}/policy`),
      t.app.inject({
        method: 'PUT',
        url: `/x402/wallets/${sponsor}/policy`,
        headers: other.auth,
        payload: { currency: 'USD' },
      }),
      post(t, other.auth, `/x402/gate/agents/${encodeURIComponent(gate.escrowWalletId)}/wind-down`, {}),
      post(t, other.auth, '/x402/gate/create', {
        payerAgentId: gate.escrowWalletId,
        payeeAgentId: theirs.payee,
        amount: 10,
        currency: 'USD',
      }),
      post(t, other.auth, '/x402/gate/create', {
        payerAgentId: theirs.payer,
        payeeAgentId: theirs.payee,
        amount: 10,
        currency: 'USD',
        sponsorWalletId: sponsor,
      }),
    ];
    for (const res of await Promise.all(probes)) expect(res.statusCode, res.body).toBe(404);
    expect((await get(t, other.auth, '/x402/gate/escalations')).json().items).toEqual([]);
    expect((await get(t, auth, `/x402/gate/escalations?gateId=${gate.gateId}`)).json().items[0].status).toBe('pending');

    const reader = await t.tenantWithKey(['x402:read']);
    expect(
      (await post(t, reader.auth, '/x402/gate/quote', { gateId: gate.gateId, requestSha256: requestHash() }))
        .statusCode,
    ).toBe(403);
    expect(
      (
        await t.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${sponsor}/policy`,
          headers: reader.auth,
          payload: { currency: 'USD' },
        })
      ).statusCode,
    ).toBe(403);
    expect((await get(t, reader.auth, '/x402/gate/escalations')).statusCode).toBe(200);
    const runsOnly = await t.tenantWithKey(['runs:write']);
    expect((await get(t, runsOnly.auth, `/x402/gate/${gate.gateId}`)).statusCode).toBe(403);
    expect((await get(t, runsOnly.auth, `/x402/gate/${gate.gateId}`)).json()).toMatchObject({
      code: 'FORBIDDEN',
      details: { requiredScope: 'x402:read' },
    });
  });

  it('Idempotency-Key replays gate creation and policy updates (PUT too)', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const headers = { 'idempotency-key': 'create-gate-1' };
    const payload = { payerAgentId: payer, payeeAgentId: payee, amount: 400, currency: 'USD' };
    const first = await post(t, auth, '/x402/gate/create', payload, headers);
    const second = await post(t, auth, '/x402/gate/create', payload, headers);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(second.json().gateId).toBe(first.json().gateId);
    expect(await balances(t, auth, payer)).toEqual({ available: 600, escrow: 400 });
    expect((await post(t, auth, '/x402/gate/create', { ...payload, amount: 401 }, headers)).statusCode).toBe(422);

    const put = () =>
      t.app.inject({
        method: 'PUT',
        url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
        headers: { ...auth, 'idempotency-key': 'policy-1' },
        payload: { currency: 'USD', dailyLimit: 50 },
      });
    const v1 = await put();
    const v2 = await put();
    expect(v2.headers['idempotent-replayed']).toBe('true');
    expect(v2.json().version).toBe(v1.json().version);
    expect((await get(t, auth, `/x402/wallets/${encodeURIComponent(payer)}/policy`)).json().version).toBe(
      v1.json().version,
    );
  });
});
