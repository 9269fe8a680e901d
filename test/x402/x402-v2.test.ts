import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { decodePaymentRequiredHeader, decodePaymentResponseHeader } from '@x402/core/http';
import type { PaymentPayload, PaymentRequirements } from '@x402/core/types';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { payingFetch } from '../../examples/paid-tool/caller.ts';
import { createPaidTool } from '../../examples/paid-tool/tool.ts';
import { X402_SCHEME } from '../../src/domain/x402.ts';
import { EscrowGateClientScheme } from '../../src/x402/client.ts';
import { EscrowGateServerScheme } from '../../src/x402/server.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, listeningForX402 } from './helpers.ts';

describe('x402 v2: stock fetch wrapper -> stock express middleware -> this service as escrow-gate facilitator', () => {
  let t: TestApp;
  let base: string;
  let payerAuth: Record<string, string>;
  let payerKey: string;
  let providerKey: string;
  let network: `${string}:${string}`;
  let tool: Server;
  let toolUrl: string;
  let payer: string;
  let payee: string;
  let searches = 0;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['x402-verify', 'settle', 'webhook-dispatch'],
      overrides: { RATE_LIMIT_MAX: '100000' },
    });
    ({ base, network, auth: payerAuth, payerKey, providerKey } = await listeningForX402(t));
    ({ payer, payee } = await gateParties(t, payerAuth, 1_000));
    const app = createPaidTool({
      serviceUrl: base,
      apiKey: providerKey,
      network,
      payeeAgentId: payee,
      price: '$1.00',
      holdbackBps: 1_000,
      search: (q) => ({ q, n: ++searches }),
    });
    tool = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => tool.once('listening', resolve));
    toolUrl = `http://127.0.0.1:${(tool.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    await new Promise((resolve) => tool.close(resolve));
    await t.close();
  });

  /** Requirements the tool would answer for `url`, paid by the client scheme directly (no tool in between). */
  async function pay(url: string, overrides: Partial<PaymentRequirements> = {}) {
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
    const scheme = new EscrowGateClientScheme({ serviceUrl: base, apiKey: payerKey, payerAgentId: payer });
    const result = await scheme.createPaymentPayload(2, requirements);
    const paymentPayload: PaymentPayload = {
      x402Version: 2,
      resource: { url },
      accepted: requirements,
      payload: result.payload,
    };
    return { requirements, paymentPayload };
  }

  const facilitator = (path: 'verify' | 'settle', key: string, body: unknown) =>
    t.app.inject({
      method: 'POST',
      url: `/x402/facilitator/${path}`,
      headers: { authorization: `Bearer ${key}` },
      payload: body as Record<string, unknown>,
    });

  it('pays a call once: the route runs once, the payee gets amount minus holdback, the caller gets PAYMENT-RESPONSE; a replay is refused', async () => {
    const sent: Array<Headers> = [];
    const recordingFetch: typeof fetch = async (input, init) => {
      sent.push(new Headers(input instanceof Request ? input.headers : init?.headers));
      return fetch(input, init);
    };
    const paidFetch = payingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer,
      network,
      fetch: recordingFetch,
    });
    const res = await paidFetch(`${toolUrl}/search?q=ledger`);
    expect(res.status, await res.clone().text()).toBe(200);
    expect(await res.json()).toEqual({ q: 'ledger', n: 1 });
    expect(searches).toBe(1);

    const receipt = decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!);
    expect(receipt).toMatchObject({
      success: true,
      network,
      payer,
      amount: '100',
      transaction: expect.stringMatching(/^stl_/),
    });
    expect(receipt.extra).toMatchObject({
      status: 'released',
      releasedNow: 90,
      holdback: 10,
      receiptHash: expect.stringMatching(/^[0-9a-f]{64}$/),
    });
    expect(await balances(t, payerAuth, payee)).toEqual({ available: 90, escrow: 0 });
    expect(await balances(t, payerAuth, payer)).toEqual({ available: 900, escrow: 10 });

    // The same payment header again: refused before the route runs, nothing moves.
    const header = sent.at(-1)!.get('PAYMENT-SIGNATURE')!;
    expect(header).toBeTruthy();
    const replay = await fetch(`${toolUrl}/search?q=ledger`, { headers: { 'PAYMENT-SIGNATURE': header } });
    expect(replay.status).toBe(402);
    expect(decodePaymentRequiredHeader(replay.headers.get('PAYMENT-REQUIRED')!).error).toBe('payment_already_settled');
    expect(searches).toBe(1);

    // At the facilitator: verify refuses it, settle answers the first settlement again.
    const paymentPayload = JSON.parse(Buffer.from(header, 'base64').toString('utf8')) as PaymentPayload;
    const body = { x402Version: 2, paymentPayload, paymentRequirements: paymentPayload.accepted };
    expect((await facilitator('verify', providerKey, body)).json()).toMatchObject({
      isValid: false,
      invalidReason: 'payment_already_settled',
    });
    const settledAgain = await facilitator('settle', providerKey, body);
    expect(settledAgain.json()).toMatchObject({
      success: true,
      transaction: receipt.transaction,
      extra: { releasedNow: 90, holdback: 10 },
    });
    expect(await balances(t, payerAuth, payee)).toEqual({ available: 90, escrow: 0 });
    expect(await balances(t, payerAuth, payer)).toEqual({ available: 900, escrow: 10 });
    await expectLedgerBalances(t);
  });

  it('refuses a token for another payee, amount, request or signer, another scheme, and another tenant', async () => {
    const url = `${toolUrl}/search?q=bindings`;
    const { requirements, paymentPayload } = await pay(url);
    const body = (r: Partial<PaymentRequirements>, p: Partial<PaymentPayload> = {}) => ({
      x402Version: 2,
      paymentPayload: { ...paymentPayload, ...p },
      paymentRequirements: { ...requirements, ...r },
    });
    const reason = async (b: unknown, key = providerKey) => {
      const res = await facilitator('verify', key, b);
      expect(res.statusCode, res.body).toBe(200);
      return res.json().invalidReason as string | undefined;
    };

    expect((await facilitator('verify', providerKey, body({}))).json()).toEqual({ isValid: true, payer });
    const { payee: otherPayee } = await gateParties(t, payerAuth, 0);
    expect(await reason(body({ payTo: otherPayee }))).toBe('payee_mismatch');
    expect(await reason(body({ amount: '200' }))).toBe('amount_mismatch');
    expect(await reason(body({ extra: { ...requirements.extra, resource: `${toolUrl}/search?q=other` } }))).toBe(
      'request_binding_mismatch',
    );
    expect(await reason(body({ extra: { ...requirements.extra, method: 'POST' } }))).toBe('request_binding_mismatch');
    expect(await reason(body({ scheme: 'exact' }))).toBe('unsupported_scheme');
    const token = paymentPayload.payload.token as string;
    const forged = `${token.slice(0, -4)}${token.endsWith('AAAA') ? 'BBBB' : 'AAAA'}`;
    expect(await reason(body({}, { payload: { ...paymentPayload.payload, token: forged } }))).toBe('invalid_signature');

    // Another tenant's provider learns nothing about the gate, and cannot settle it.
    const other = await t.tenantWithKey(['x402:write'], 'other');
    const foreign = await facilitator('verify', other.token, body({}));
    expect(foreign.json()).toEqual({
      isValid: false,
      invalidReason: 'gate_not_found',
      invalidMessage: 'no such gate for this credential',
    });
    expect((await facilitator('settle', other.token, body({}))).json()).toMatchObject({
      success: false,
      errorReason: 'gate_not_found',
      transaction: '',
    });
    expect(await balances(t, payerAuth, payee)).toEqual({ available: 90, escrow: 0 });

    // Scopes: verify and settle need x402:write.
    const reader = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: other.tenantId, scopes: ['x402:read'] },
    });
    expect((await facilitator('verify', reader.json().token, body({}))).statusCode).toBe(403);
  });

  it('settle answers success only when the payee was paid: a gate refunded by a failed verification is success false', async () => {
    const { requirements, paymentPayload } = await pay(`${toolUrl}/search?q=refunded`);
    const gateId = paymentPayload.payload.gateId as string;
    const before = await balances(t, payerAuth, payee);
    const failed = await t.app.inject({
      method: 'POST',
      url: '/x402/gate/verify',
      headers: payerAuth,
      payload: { gateId, evidence: { responseSha256: 'b'.repeat(64) }, verificationStatus: 'failed' },
    });
    expect(failed.statusCode, failed.body).toBe(200);
    expect(failed.json()).toMatchObject({ status: 'refunded' });

    const body = { x402Version: 2, paymentPayload, paymentRequirements: requirements };
    const settled = await facilitator('settle', providerKey, body);
    expect(settled.statusCode).toBe(200);
    expect(settled.json()).toMatchObject({ success: false, errorReason: 'verification_failed', payer, network });
    expect(await balances(t, payerAuth, payee)).toEqual(before);
  });

  it('refuses a payment whose quote has expired, and moves no money', async () => {
    const { requirements, paymentPayload } = await pay(`${toolUrl}/search?q=late`, { maxTimeoutSeconds: 1 });
    const before = await balances(t, payerAuth, payee);
    await new Promise((resolve) => setTimeout(resolve, 2_100));
    const body = { x402Version: 2, paymentPayload, paymentRequirements: requirements };
    expect((await facilitator('verify', providerKey, body)).json()).toMatchObject({
      isValid: false,
      invalidReason: 'quote_expired',
    });
    expect((await facilitator('settle', providerKey, body)).json()).toMatchObject({
      success: false,
      errorReason: 'quote_expired',
    });
    expect(await balances(t, payerAuth, payee)).toEqual(before);
  });

  it('lists its schemes under its CAIP-2 network without a key, and the OpenAPI document covers the facilitator', async () => {
    const deprecatedNetworks = [
      {
        network: 'agent-settlement:default',
        acceptedUntil: t.config.x402.legacyNetworksUntil.toISOString(),
        replacedBy: network,
      },
    ];
    const expected = {
      kinds: ['escrow-gate', 'escrow-session'].map((scheme) => ({
        x402Version: 2,
        scheme,
        network,
        extra: { deprecatedNetworks },
      })),
      extensions: [],
      signers: {},
    };
    expect(network).toBe('agentstl:default');
    expect(await (await fetch(`${base}/x402/facilitator/supported`)).json()).toEqual(expected);
    // A key changes nothing: the answer is the deployment's, the same for every caller.
    expect(
      await (
        await fetch(`${base}/x402/facilitator/supported`, { headers: { authorization: `Bearer ${providerKey}` } })
      ).json(),
    ).toEqual(expected);
    const doc = JSON.parse(readFileSync(new URL('../../openapi/openapi.json', import.meta.url), 'utf8'));
    expect(doc.paths['/x402/facilitator/verify'].post['x-required-scope']).toBe('x402:write');
    expect(doc.paths['/x402/facilitator/settle'].post['x-required-scope']).toBe('x402:write');
    expect(doc.paths['/x402/facilitator/supported'].get.security).toEqual([]);
  });

  it('prices "$1.23"-style USD in cents exactly and {amount, asset} as given; refuses anything else', async () => {
    const scheme = new EscrowGateServerScheme();
    expect(await scheme.parsePrice('$1.23', network)).toEqual({ amount: '123', asset: 'USD' });
    expect(await scheme.parsePrice('0.1', network)).toEqual({ amount: '10', asset: 'USD' });
    expect(await scheme.parsePrice(2, network)).toEqual({ amount: '200', asset: 'USD' });
    expect(await scheme.parsePrice({ amount: '2500', asset: 'EUR' }, network)).toEqual({
      amount: '2500',
      asset: 'EUR',
    });
    for (const bad of ['$0.001', '$0', 'ten', { amount: '1.5', asset: 'USD' }, { amount: '10', asset: 'usd' }]) {
      await expect(scheme.parsePrice(bad, network)).rejects.toThrow();
    }
  });
});
