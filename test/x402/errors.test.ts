import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, gateParties, get, post, quote, requestHash, sponsorWallet } from './helpers.ts';

// Every x402 error code of the contract, each triggered, each shown to change nothing.
describe('x402 error codes', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
  });
  afterAll(() => t.close());

  const authorize = (body: Record<string, unknown>) => post(t, auth, '/x402/gate/authorize-payment', body);
  const count = (name: string) => t.runtime.db.collection(name).countDocuments();

  it('402 INSUFFICIENT_FUNDS creates no gate and moves nothing', async () => {
    const { payer, payee } = await gateParties(t, auth, 100);
    const gatesBefore = await count('x402_gates');
    const res = await post(t, auth, '/x402/gate/create', {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 101,
      currency: 'USD',
    });
    expect(res.statusCode).toBe(402);
    expect(res.json()).toMatchObject({ code: 'INSUFFICIENT_FUNDS', details: { needed: 101, available: 100 } });
    expect(await count('x402_gates')).toBe(gatesBefore);
    expect(await balances(t, auth, payer)).toEqual({ available: 100, escrow: 0 });
  });

  it('quote errors: X402_QUOTE_NOT_FOUND, X402_QUOTE_MISMATCH, X402_QUOTE_EXPIRED, X402_REQUEST_BINDING_MISMATCH', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    const other = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    const q = await quote(t, auth, gate.gateId);
    const otherQuote = await quote(t, auth, other.gateId);

    const notFound = await authorize({
      gateId: gate.gateId,
      quoteId: 'quo_doesnotexist',
      requestSha256: q.requestSha256,
    });
    expect(notFound.json()).toMatchObject({ code: 'X402_QUOTE_NOT_FOUND' });
    expect(notFound.statusCode).toBe(409);
    const mismatch = await authorize({
      gateId: gate.gateId,
      quoteId: otherQuote.quoteId,
      requestSha256: otherQuote.requestSha256,
    });
    expect(mismatch.json()).toMatchObject({ code: 'X402_QUOTE_MISMATCH' });
    const binding = await authorize({
      gateId: gate.gateId,
      quoteId: q.quoteId,
      requestSha256: requestHash('other request'),
    });
    expect(binding.json()).toMatchObject({ code: 'X402_REQUEST_BINDING_MISMATCH' });

    // A newer quote for another request supersedes the first one.
    const newer = await quote(t, auth, gate.gateId, requestHash('second'), 1);
    expect(
      (await authorize({ gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 })).json(),
    ).toMatchObject({ code: 'X402_QUOTE_MISMATCH' });
    await new Promise((r) => setTimeout(r, 1_100));
    const expired = await authorize({
      gateId: gate.gateId,
      quoteId: newer.quoteId,
      requestSha256: newer.requestSha256,
    });
    expect(expired.json()).toMatchObject({ code: 'X402_QUOTE_EXPIRED' });

    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json()).toMatchObject({
      status: 'held',
      authorization: null,
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 800, escrow: 200 });
  });

  it('X402_WALLET_DECISION_REQUIRED and X402_WALLET_POLICY_VIOLATION (with the rule) authorize nothing', async () => {
    const { payer, payee } = await gateParties(t, auth, 0);
    const sponsor = await sponsorWallet(t, tenantId, 1_000);
    const gate = await createGate(t, auth, {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 300,
      sponsorWalletId: sponsor,
      toolId: 'search',
    });
    const q = await quote(t, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };

    expect((await authorize(body)).json()).toMatchObject({
      code: 'X402_WALLET_DECISION_REQUIRED',
      details: { reason: 'missing' },
    });
    expect((await authorize({ ...body, walletDecisionToken: 'not.a.token' })).json()).toMatchObject({
      code: 'X402_WALLET_DECISION_REQUIRED',
      details: { reason: 'invalid' },
    });

    const walletAuthorize = () => post(t, auth, `/x402/wallets/${sponsor}/authorize`, body);
    expect((await walletAuthorize()).json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'policy' },
    });
    const setPolicy = (policy: Record<string, unknown>) =>
      t.app.inject({
        method: 'PUT',
        url: `/x402/wallets/${sponsor}/policy`,
        headers: auth,
        payload: { currency: 'USD', ...policy },
      });
    const violations: Array<[Record<string, unknown>, string]> = [
      [{ currency: 'EUR' }, 'currency'],
      [{ perCallLimit: 299 }, 'perCallLimit'],
      [{ dailyLimit: 299 }, 'dailyLimit'],
      [{ allowedPayeeAgentIds: [payer] }, 'allowedPayeeAgentIds'],
      [{ allowedToolIds: ['other-tool'] }, 'allowedToolIds'],
    ];
    for (const [policy, rule] of violations) {
      expect((await setPolicy(policy)).statusCode).toBe(200);
      const res = await walletAuthorize();
      expect(res.statusCode).toBe(409);
      expect(res.json(), rule).toMatchObject({
        code: 'X402_WALLET_POLICY_VIOLATION',
        details: { rule, walletId: sponsor },
      });
    }
    expect(await t.runtime.db.collection('x402_daily_spends').countDocuments()).toBe(0);
    expect((await get(t, auth, `/x402/wallets/${sponsor}/policy`)).json()).toMatchObject({
      version: 5,
      allowedToolIds: ['other-tool'],
    });

    // A decision for this gate does not authorize another one.
    await setPolicy({ perCallLimit: 1_000 });
    const second = await createGate(t, auth, {
      payerAgentId: payer,
      payeeAgentId: payee,
      amount: 300,
      sponsorWalletId: sponsor,
    });
    const q2 = await quote(t, auth, second.gateId);
    const decision = (
      await post(t, auth, `/x402/wallets/${sponsor}/authorize`, {
        gateId: second.gateId,
        quoteId: q2.quoteId,
        requestSha256: q2.requestSha256,
      })
    ).json();
    expect((await authorize({ ...body, walletDecisionToken: decision.walletDecisionToken })).json()).toMatchObject({
      code: 'X402_WALLET_DECISION_REQUIRED',
      details: { reason: 'mismatch' },
    });
    expect((await get(t, auth, `/x402/gate/${gate.gateId}`)).json().authorization).toBeNull();
    expect(await balances(t, auth, sponsor)).toEqual({ available: 400, escrow: 600 });
  });

  it('X402_PAYMENT_NOT_AUTHORIZED when a success is reported for a gate nobody authorized; X402_GATE_TERMINAL after settling', async () => {
    const { payer, payee } = await gateParties(t, auth, 500);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 500 });
    const q = await quote(t, auth, gate.gateId);
    const res = await post(t, auth, '/x402/gate/verify', {
      gateId: gate.gateId,
      evidence: { responseSha256: requestHash() },
    });
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ code: 'X402_PAYMENT_NOT_AUTHORIZED' });
    expect(await t.runtime.stores.x402.verifications.findOne({ _id: gate.gateId })).toBeNull();
    expect(await balances(t, auth, payer)).toEqual({ available: 0, escrow: 500 });

    expect(
      (await authorize({ gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 })).statusCode,
    ).toBe(200);
    expect(
      (await post(t, auth, '/x402/gate/verify', { gateId: gate.gateId, evidence: { responseSha256: requestHash() } }))
        .statusCode,
    ).toBe(200);
    const terminal = await post(t, auth, '/x402/gate/quote', { gateId: gate.gateId, requestSha256: requestHash() });
    expect(terminal.json()).toMatchObject({ code: 'X402_GATE_TERMINAL', details: { status: 'released' } });
    expect(await balances(t, auth, payee)).toEqual({ available: 500, escrow: 0 });
  });

  it('bad input is 400 in the contract shape (floats, ttl out of range), same payer and payee 422', async () => {
    const { payer, payee } = await gateParties(t, auth, 100);
    for (const payload of [
      { payerAgentId: payer, payeeAgentId: payee, amount: 10.5, currency: 'USD' },
      { payerAgentId: payer, payeeAgentId: payee, amount: '10', currency: 'USD' },
    ]) {
      const res = await post(t, auth, '/x402/gate/create', payload);
      expect(res.statusCode, JSON.stringify(payload)).toBe(400);
      expect(res.json().code).toBe('VALIDATION_FAILED');
    }
    const samePayee = await post(t, auth, '/x402/gate/create', {
      payerAgentId: payer,
      payeeAgentId: payer,
      amount: 10,
      currency: 'USD',
    });
    expect(samePayee.statusCode).toBe(422); // the schema cannot say "two different agents"
    expect(samePayee.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'body.payeeAgentId' }] },
    });
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 10 });
    for (const ttlSeconds of [0, 3601]) {
      expect(
        (await post(t, auth, '/x402/gate/quote', { gateId: gate.gateId, requestSha256: requestHash(), ttlSeconds }))
          .statusCode,
      ).toBe(400);
    }
    expect(await balances(t, auth, payer)).toEqual({ available: 90, escrow: 10 });
  });
});
