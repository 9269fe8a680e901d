import { randomBytes } from 'node:crypto';
import type { PaymentPayload, PaymentRequirements } from '@x402/core/types';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints } from '../../src/domain/failpoints.ts';
import { X402_SCHEME } from '../../src/domain/x402.ts';
import { EscrowGateClientScheme } from '../../src/x402/client.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, expectLedgerBalances, gateParties, post, listeningForX402 } from './helpers.ts';

// GET /x402/facilitator/payments/{paymentId}: a resource server whose settle timed out finds out, definitively,
// whether the payment was settled, refused or never seen, and never pays twice.

describe('x402 facilitator: payment status by payment id', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let payerKey: string;
  let providerKey: string;
  let network: `${string}:${string}`;
  let base: string;

  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ base, network, auth, payerKey, providerKey } = await listeningForX402(t));
  });
  afterAll(() => t.close());

  /** A payment authorized by the payer's client scheme for a provider's requirement, and the body settle takes. */
  async function pay(overrides: Partial<PaymentRequirements> = {}) {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    const url = `https://tool.example/search?q=${randomBytes(4).toString('hex')}`;
    const requirements: PaymentRequirements = {
      scheme: X402_SCHEME,
      network,
      asset: 'USD',
      amount: '100',
      payTo: payee,
      maxTimeoutSeconds: 60,
      extra: {
        holdbackBps: 0,
        disputeWindowSeconds: 86_400,
        method: 'GET',
        resource: url,
        paymentNonce: randomBytes(8).toString('hex'),
      },
      ...overrides,
    };
    const result = await new EscrowGateClientScheme({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer,
    }).createPaymentPayload(2, requirements);
    const paymentPayload: PaymentPayload = {
      x402Version: 2,
      resource: { url },
      accepted: requirements,
      payload: result.payload,
    };
    return {
      payer,
      payee,
      gateId: result.payload.gateId as string,
      body: { x402Version: 2, paymentPayload, paymentRequirements: requirements },
    };
  }

  const settle = (body: unknown, key = providerKey) =>
    t.app.inject({
      method: 'POST',
      url: '/x402/facilitator/settle',
      headers: { authorization: `Bearer ${key}` },
      payload: body as Record<string, unknown>,
    });
  const status = async (paymentId: string, key = providerKey) => {
    const res = await t.app.inject({
      method: 'GET',
      url: `/x402/facilitator/payments/${encodeURIComponent(paymentId)}`,
      headers: { authorization: `Bearer ${key}` },
    });
    expect(res.statusCode, res.body).toBe(200);
    return res.json();
  };

  it('never seen: an id nobody issued, and a gate nobody paid for, are unknown', async () => {
    expect(await status('gate_doesNotExist0000000000')).toEqual({
      paymentId: 'gate_doesNotExist0000000000',
      status: 'unknown',
      settlementStatus: 'unresolved',
      settledAt: null,
      settledAmount: null,
      settleBy: null,
      settlement: null,
    });
    const { payer, payee } = await gateParties(t, auth, 100);
    const held = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    expect(await status(held.gateId)).toMatchObject({
      status: 'unknown',
      settlementStatus: 'unresolved',
      settlement: null,
    });
  });

  it('authorized, then settled: the lookup answers what settle answered, and a lost answer is found without paying twice', async () => {
    const { payer, payee, gateId, body } = await pay({ amount: '100' });
    const before = await status(gateId);
    expect(before).toMatchObject({
      paymentId: gateId,
      status: 'authorized',
      settlementStatus: 'unresolved',
      settledAt: null,
      settledAmount: null,
      settlement: null,
    });
    expect(Date.parse(before.settleBy)).toBeGreaterThan(Date.now());

    // The provider settles a metered 60 and "loses" the answer (a timeout on its side).
    const lost = (await settle({ ...body, paymentRequirements: { ...body.paymentRequirements, amount: '60' } })).json();
    expect(lost).toMatchObject({ success: true, status: 'settled', amount: '60', settledAt: expect.any(String) });
    expect(Date.now() - Date.parse(lost.settledAt)).toBeLessThan(60_000);
    const found = await status(gateId);
    expect(found).toEqual({
      paymentId: gateId,
      status: 'settled',
      settlementStatus: 'settled',
      settledAt: lost.settledAt,
      settledAmount: '60',
      settleBy: null,
      settlement: lost,
    });
    // The same with the body settle was sent, as a resource server has it at hand.
    const byBody = await t.app.inject({
      method: 'POST',
      url: '/x402/facilitator/status',
      headers: { authorization: `Bearer ${providerKey}` },
      payload: body,
    });
    expect(byBody.statusCode, byBody.body).toBe(200);
    expect(byBody.json()).toEqual(found);

    // A settle retried anyway (even asking the full amount) answers the same settlement: paid once.
    expect((await settle(body)).json()).toEqual(lost);
    expect(await balances(t, auth, payee)).toEqual({ available: 60, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 940, escrow: 0 });
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  it('settling: reported but not decided (the reporting request died before its job); a settle then finishes it once', async () => {
    const { payee, gateId, body } = await pay();
    armFailpoint('x402.verify.reported');
    try {
      const crashed = await post(t, auth, '/x402/gate/verify', {
        gateId,
        evidence: { responseSha256: 'c'.repeat(64) },
        amount: 30,
      });
      expect(crashed.statusCode).toBe(500);
    } finally {
      disarmFailpoints();
    }
    expect(await status(gateId)).toEqual({
      paymentId: gateId,
      status: 'settling',
      settlementStatus: 'unresolved',
      settledAt: null,
      settledAmount: null,
      settleBy: null,
      settlement: null,
    });
    // The report stands (30, first wins): settle makes sure its job runs and answers it.
    const settled = (await settle(body)).json();
    expect(settled).toMatchObject({ success: true, amount: '30' });
    expect(await status(gateId)).toMatchObject({ status: 'settled', settlement: settled });
    expect(await balances(t, auth, payee)).toEqual({ available: 30, escrow: 0 });
  });

  it('refused: a payment refunded by a failed verification reads refused with the reason settle gives', async () => {
    const { payer, gateId, body } = await pay();
    const failed = await post(t, auth, '/x402/gate/verify', {
      gateId,
      evidence: { responseSha256: 'b'.repeat(64) },
      verificationStatus: 'failed',
    });
    expect(failed.statusCode, failed.body).toBe(200);
    const found = await status(gateId);
    expect(found).toMatchObject({
      status: 'refused',
      settlementStatus: 'failed',
      settledAt: null,
      settledAmount: null,
      settlement: { success: false, status: 'failed', errorReason: 'verification_failed', payer },
    });
    expect((await settle(body)).json()).toEqual(found.settlement);
    expect(await balances(t, auth, payer)).toEqual({ available: 1_000, escrow: 0 });
  });

  it("another tenant's payment is unknown, settled or not; the lookup needs x402:read", async () => {
    const { gateId, body } = await pay();
    await settle(body);
    expect((await status(gateId)).status).toBe('settled');
    const other = await t.tenantWithKey(['x402:read'], 'other');
    expect(await status(gateId, other.token)).toEqual({
      paymentId: gateId,
      status: 'unknown',
      settlementStatus: 'unresolved',
      settledAt: null,
      settledAmount: null,
      settleBy: null,
      settlement: null,
    });
    const noScope = await t.tenantWithKey(['runs:read'], 'noscope');
    expect(
      (
        await t.app.inject({
          method: 'GET',
          url: `/x402/facilitator/payments/${gateId}`,
          headers: { authorization: `Bearer ${noScope.token}` },
        })
      ).statusCode,
    ).toBe(403);
    expect((await t.app.inject({ method: 'GET', url: `/x402/facilitator/payments/${gateId}` })).statusCode).toBe(401);
  });

  it("a settle repeated after the payment's quote expired still answers the first settlement; a first settle then is refused", async () => {
    // Quotes of 5 s: room for the first settle under load; then both tokens are waited out.
    const settled = await pay({ maxTimeoutSeconds: 5 });
    const first = (await settle(settled.body)).json();
    expect(first).toMatchObject({ success: true });
    const unsettled = await pay({ maxTimeoutSeconds: 5 });
    await new Promise((resolve) => setTimeout(resolve, 6_100));
    expect((await settle(settled.body)).json()).toEqual(first);
    expect((await settle(unsettled.body)).json()).toMatchObject({ success: false, errorReason: 'quote_expired' });
    expect(await balances(t, auth, unsettled.payee)).toEqual({ available: 0, escrow: 0 });
  });
});
