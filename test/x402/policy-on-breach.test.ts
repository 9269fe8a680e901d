import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, gateParties, get, post, quote, sponsorWallet } from './helpers.ts';

// A wallet policy's `onBreach` says what a call over a limit gets, for a payer's own wallet and a sponsor wallet
// alike: an escalation a person decides, or a refusal. Unset, an agent's wallet escalates and a sponsor's refuses.
describe('wallet policy onBreach: escalate or refuse, the same for payer and sponsor wallets', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
  });
  afterAll(() => t.close());

  const setPolicy = (walletId: string, policy: Record<string, unknown>) =>
    t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(walletId)}/policy`,
      headers: auth,
      payload: { currency: 'USD', ...policy },
    });
  const authorize = (body: Record<string, unknown>) => post(t, auth, '/x402/gate/authorize-payment', body);
  const escalationsOf = async (gateId: string) =>
    (await get(t, auth, `/x402/gate/escalations?gateId=${gateId}`)).json().items as Array<{ escalationId: string }>;

  /** A 300 call whose escrow wallet (the payer's, or `sponsor`) has a per-call limit of 100. */
  async function overLimitGate(sponsor?: string) {
    const { payer, payee } = await gateParties(t, auth, sponsor ? 0 : 1_000);
    const gate = await createGate(t, auth, {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 300,
      ...(sponsor ? { sponsorWalletId: sponsor } : {}),
    });
    const q = await quote(t, auth, gate.gateId);
    return { payer, gate, body: { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 } };
  }

  it('shows the default by wallet kind: an agent wallet escalates, a sponsor wallet refuses', async () => {
    const { payer } = await gateParties(t, auth, 10); // funding makes the agent's wallet
    const sponsor = await sponsorWallet(t, tenantId, 10);
    expect((await setPolicy(payer, { perCallLimit: 100 })).json()).toMatchObject({ onBreach: 'escalate' });
    expect((await setPolicy(sponsor, { perCallLimit: 100 })).json()).toMatchObject({ onBreach: 'refuse' });
    expect((await get(t, auth, `/x402/wallets/${encodeURIComponent(payer)}/policy`)).json().onBreach).toBe('escalate');
    expect((await get(t, auth, `/x402/wallets/${sponsor}/policy`)).json().onBreach).toBe('refuse');
    const invalid = await setPolicy(sponsor, { onBreach: 'ask' });
    expect(invalid.statusCode).toBe(400);
    expect(invalid.json().details.errors).toEqual([
      { path: 'body.onBreach', message: 'expected one of "escalate", "refuse"' },
    ]);
  });

  it('a sponsor wallet refuses by default: 409 X402_WALLET_POLICY_VIOLATION, no escalation, nothing reserved', async () => {
    const sponsor = await sponsorWallet(t, tenantId, 1_000);
    await setPolicy(sponsor, { perCallLimit: 100 });
    const { gate, body } = await overLimitGate(sponsor);
    const refused = await post(t, auth, `/x402/wallets/${sponsor}/authorize`, body);
    expect(refused.statusCode).toBe(409);
    expect(refused.json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'perCallLimit', walletId: sponsor },
    });
    expect(await escalationsOf(gate.gateId)).toEqual([]);
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json().authorization).toBeNull();
  });

  it('a sponsor wallet with onBreach escalate raises an escalation; its approval stands in for the decision', async () => {
    const sponsor = await sponsorWallet(t, tenantId, 1_000);
    expect((await setPolicy(sponsor, { perCallLimit: 100, onBreach: 'escalate' })).json().onBreach).toBe('escalate');
    const { gate, body } = await overLimitGate(sponsor);
    expect(await balances(t, auth, sponsor)).toEqual({ available: 700, escrow: 300 });

    const escalated = await post(t, auth, `/x402/wallets/${sponsor}/authorize`, body);
    expect(escalated.statusCode).toBe(409);
    expect(escalated.json()).toMatchObject({
      code: 'X402_AUTHORIZATION_ESCALATION_REQUIRED',
      details: {
        escalationId: expect.stringMatching(/^esc_/),
        status: 'pending',
        rule: 'perCallLimit',
        walletId: sponsor,
      },
    });
    const { escalationId } = escalated.json().details;
    expect((await escalationsOf(gate.gateId)).map((e) => e.escalationId)).toEqual([escalationId]);
    // Still no way around it: without the decision or an approved override, authorize-payment refuses.
    expect((await authorize(body)).json()).toMatchObject({ code: 'X402_WALLET_DECISION_REQUIRED' });

    const approved = await post(t, auth, `/x402/gate/escalations/${escalationId}/resolve`, {
      action: 'approve',
      reason: 'a one-off large search',
    });
    expect(approved.statusCode, approved.body).toBe(200);
    const override = approved.json().escalationOverrideToken as string;
    const paid = await authorize({ ...body, escalationOverrideToken: override });
    expect(paid.statusCode, paid.body).toBe(200);
    expect(paid.json()).toMatchObject({ reserve: { amount: 300, currency: 'USD', status: 'reserved' } });
    expect((await authorize({ ...body, escalationOverrideToken: override })).json()).toMatchObject({
      code: 'X402_OVERRIDE_REPLAYED',
    });
    // The approved amount counts against the sponsor's day, as a decision within the limits would.
    const spends = await t.runtime.db.collection('x402_daily_spends').find({ ref: sponsor }).toArray();
    expect(spends.map((s) => s.amount)).toEqual([300]);
  });

  it("an override of another gate's escalation does not stand in for a sponsor's decision", async () => {
    const sponsor = await sponsorWallet(t, tenantId, 1_000);
    await setPolicy(sponsor, { perCallLimit: 100, onBreach: 'escalate' });
    const first = await overLimitGate(sponsor);
    const second = await overLimitGate(sponsor);
    const { escalationId } = (await post(t, auth, `/x402/wallets/${sponsor}/authorize`, first.body)).json().details;
    const override = (
      await post(t, auth, `/x402/gate/escalations/${escalationId}/resolve`, { action: 'approve' })
    ).json().escalationOverrideToken as string;
    const refused = await authorize({ ...second.body, escalationOverrideToken: override });
    expect(refused.json()).toMatchObject({ code: 'X402_OVERRIDE_INVALID' });
    expect((await get(t, auth, `/x402/gate/${second.gate.gateId}`)).json().authorization).toBeNull();
  });

  it('a payer wallet escalates by default and refuses with onBreach refuse, raising no escalation', async () => {
    const escalating = await overLimitGate();
    await setPolicy(escalating.payer, { perCallLimit: 100 });
    expect((await authorize(escalating.body)).json()).toMatchObject({
      code: 'X402_AUTHORIZATION_ESCALATION_REQUIRED',
      details: { rule: 'perCallLimit' },
    });

    const refusing = await overLimitGate();
    await setPolicy(refusing.payer, { perCallLimit: 100, onBreach: 'refuse' });
    const refused = await authorize(refusing.body);
    expect(refused.statusCode).toBe(409);
    expect(refused.json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'perCallLimit', walletId: refusing.payer, limit: 100, amount: 300 },
    });
    expect(await escalationsOf(refusing.gate.gateId)).toEqual([]);
    expect((await get(t, auth, `/x402/gate/${refusing.gate.gateId}`)).json()).toMatchObject({
      status: 'held',
      authorization: null,
    });
    expect(await balances(t, auth, refusing.payer)).toEqual({ available: 700, escrow: 300 });
  });
});
