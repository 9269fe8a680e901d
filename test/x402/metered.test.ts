import type { Server } from 'node:http';
import { decodePaymentResponseHeader } from '@x402/core/http';
import type { PaymentPayload } from '@x402/core/types';
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer } from '@x402/express';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { payingFetch } from '../../examples/paid-tool/caller.ts';
import { createPaidTool } from '../../examples/paid-tool/tool.ts';
import { escrowGateFacilitator } from '../../src/x402/facilitator.ts';
import { EscrowGateServerScheme } from '../../src/x402/server.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, get, post, listeningForX402 } from './helpers.ts';

// Metered ("upto") capture: the stock middleware's settlement override charges less than the authorized maximum;
// the payer pays exactly that (holdback on it), and the rest is back in its available funds at once.

const FUNDS = 1_000;
const MAX_WORDS = 50;
const CENTS_PER_WORD = 2; // a summary costs at most 100 cents

function listen(app: ReturnType<typeof express>): Promise<{ server: Server; url: string }> {
  const server = app.listen(0, '127.0.0.1');
  return new Promise((resolve) =>
    server.once('listening', () =>
      resolve({ server, url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }),
    ),
  );
}

describe('x402 metered capture: stock fetch wrapper -> stock express middleware with settlement overrides', () => {
  let t: TestApp;
  let base: string;
  let auth: Record<string, string>;
  let payerKey: string;
  let providerKey: string;
  let network: `${string}:${string}`;
  const servers: Server[] = [];
  let toolUrl: string;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['x402-verify', 'settle', 'webhook-dispatch'],
      overrides: { RATE_LIMIT_MAX: '100000' },
    });
    ({ base, network, auth, payerKey, providerKey } = await listeningForX402(t));
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
    await t.close();
  });

  /** A fresh payer and payee, and the example tool paying the payee (one tool per payee). */
  async function parties() {
    const { payer, payee } = await gateParties(t, auth, FUNDS);
    const tool = await listen(
      createPaidTool({
        serviceUrl: base,
        apiKey: providerKey,
        network,
        payeeAgentId: payee,
        holdbackBps: 1_000,
        maxWords: MAX_WORDS,
        centsPerWord: CENTS_PER_WORD,
      }),
    );
    servers.push(tool.server);
    toolUrl = tool.url;
    const sent: Headers[] = [];
    const recording: typeof fetch = async (input, init) => {
      sent.push(new Headers(input instanceof Request ? input.headers : init?.headers));
      return fetch(input, init);
    };
    return {
      payer,
      payee,
      paidFetch: payingFetch({ serviceUrl: base, apiKey: payerKey, payerAgentId: payer, network, fetch: recording }),
      sent,
    };
  }

  const facilitator = (path: string, body: unknown) =>
    t.app.inject({
      method: 'POST',
      url: `/x402/facilitator/${path}`,
      headers: { authorization: `Bearer ${providerKey}` },
      payload: body as Record<string, unknown>,
    });

  it('charges exactly the words served: the payee gets that less holdback, the rest of the maximum is back with the payer at once', async () => {
    const { payer, payee, paidFetch, sent } = await parties();
    const res = await paidFetch(`${toolUrl}/summarize?words=5`);
    expect(res.status, await res.clone().text()).toBe(200);
    expect(await res.json()).toMatchObject({ words: 5, charged: 10 });

    const receipt = decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!);
    expect(receipt).toMatchObject({
      success: true,
      payer,
      amount: '10',
      extra: { status: 'released', releasedNow: 9, holdback: 1 },
    });
    // 100 were locked: 10 charged (9 now, 1 held back), 90 back in the payer's available funds.
    expect(await balances(t, auth, payee)).toEqual({ available: 9, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: FUNDS - 10, escrow: 1 });

    // The gate says what was authorized and what was captured; its signed receipt commits to both.
    const paymentPayload = JSON.parse(
      Buffer.from(sent.at(-1)!.get('PAYMENT-SIGNATURE')!, 'base64').toString('utf8'),
    ) as PaymentPayload;
    expect(paymentPayload.accepted).toMatchObject({ amount: '100', extra: { metered: true } });
    const gate = (await get(t, auth, `/x402/gate/${paymentPayload.payload.gateId as string}`)).json();
    expect(gate).toMatchObject({
      status: 'released',
      amount: 100,
      verification: { capturedAmount: 10 },
      settlement: { releasedAmount: 9, refundedAmount: 90, holdback: 1 },
    });
    expect(gate.receipt.body).toMatchObject({
      amount: 100,
      captured: 10,
      releasedNow: 9,
      holdback: 1,
      verdict: 'pass',
    });
    // The one movement is announced once: the release, with the part of the reserve the call did not cost.
    const settlementId = gate.settlement.settlementId as string;
    const completed = await t.runtime.stores.outbox.events
      .find({ type: 'settlement.completed', 'data.settlementId': settlementId })
      .toArray();
    expect(completed.map((e) => e.data)).toEqual([
      {
        runId: null,
        gateId: gate.gateId,
        sessionId: null,
        settlementId,
        amount: 9,
        holdback: 1,
        currency: 'USD',
        uncaptured: 90,
      },
    ]);

    // Settling the same payment again, with this amount or another, answers the first settlement and moves nothing.
    const body = (amount: string) => ({
      x402Version: 2,
      paymentPayload,
      paymentRequirements: { ...paymentPayload.accepted, amount },
    });
    for (const amount of ['10', '40', '0']) {
      expect((await facilitator('settle', body(amount))).json()).toMatchObject({
        success: true,
        amount: '10',
        transaction: receipt.transaction,
        extra: { releasedNow: 9, holdback: 1 },
      });
    }
    expect(await balances(t, auth, payee)).toEqual({ available: 9, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: FUNDS - 10, escrow: 1 });
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  it('charges only what was served when the text is shorter than asked, and never more than the maximum', async () => {
    const { payer, payee, paidFetch } = await parties();
    const res = await paidFetch(`${toolUrl}/summarize?words=500`); // clamped to 50; the text has 17 words
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ words: 17, charged: 34 });
    expect(decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!)).toMatchObject({
      success: true,
      amount: '34',
      extra: { releasedNow: 31, holdback: 3 },
    });
    expect(await balances(t, auth, payee)).toEqual({ available: 31, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: FUNDS - 34, escrow: 3 });
    await expectLedgerBalances(t);
  });

  it('allows a charge of zero: the call is served, the payee gets nothing, the whole maximum is back with the payer', async () => {
    const { payer, payee, paidFetch, sent } = await parties();
    const res = await paidFetch(`${toolUrl}/summarize?words=0`);
    expect(res.status, await res.clone().text()).toBe(200);
    expect(await res.json()).toMatchObject({ words: 0, charged: 0 });
    expect(decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!)).toMatchObject({
      success: true,
      amount: '0',
      extra: { status: 'refunded', releasedNow: 0, holdback: 0 },
    });
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: FUNDS, escrow: 0 });
    const gateId = (
      JSON.parse(Buffer.from(sent.at(-1)!.get('PAYMENT-SIGNATURE')!, 'base64').toString('utf8')) as PaymentPayload
    ).payload.gateId as string;
    expect((await get(t, auth, `/x402/gate/${gateId}`)).json()).toMatchObject({
      status: 'refunded',
      settlement: { status: 'refunded', releasedAmount: 0, refundedAmount: 100 },
    });
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });

  it('refuses an override above the maximum (capture_exceeds_authorization): the caller is not served, nothing moves', async () => {
    const { payer, payee } = await gateParties(t, auth, FUNDS);
    // A provider with a bug: it charges more than the price it asked the payer to authorize.
    const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl: base, apiKey: providerKey })).register(
      network,
      new EscrowGateServerScheme({ metered: true }),
    );
    const app = express();
    app.use(
      paymentMiddleware(
        { 'GET /greedy': { accepts: { scheme: 'escrow-gate', network, payTo: payee, price: '$0.50' } } },
        server,
      ),
    );
    app.get('/greedy', (_req, res) => {
      setSettlementOverrides(res, { amount: '51' });
      res.json({ served: true });
    });
    const greedy = await listen(app);
    servers.push(greedy.server);
    const sent: Headers[] = [];
    const paidFetch = payingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer,
      network,
      fetch: async (input, init) => {
        sent.push(new Headers(input instanceof Request ? input.headers : init?.headers));
        return fetch(input, init);
      },
    });

    const res = await paidFetch(`${greedy.url}/greedy`);
    expect(res.status).toBe(402);
    expect(await res.text()).not.toContain('served');
    expect(decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!)).toMatchObject({
      success: false,
      errorReason: 'capture_exceeds_authorization',
    });
    expect(await balances(t, auth, payee)).toEqual({ available: 0, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: FUNDS - 50, escrow: 50 }); // still only authorized
    const gateId = (
      JSON.parse(Buffer.from(sent.at(-1)!.get('PAYMENT-SIGNATURE')!, 'base64').toString('utf8')) as PaymentPayload
    ).payload.gateId as string;
    expect((await get(t, auth, `/x402/gate/${gateId}`)).json()).toMatchObject({
      status: 'authorized',
      verification: null,
    });

    // The gate's own verify refuses the same (422), and records nothing: a correct report afterwards still pays.
    const over = await post(t, auth, '/x402/gate/verify', {
      gateId,
      evidence: { responseSha256: 'a'.repeat(64) },
      amount: 51,
    });
    expect(over.statusCode, over.body).toBe(422);
    expect(over.json()).toMatchObject({
      code: 'X402_CAPTURE_EXCEEDS_AUTHORIZATION',
      details: { amount: 51, authorized: 50 },
    });
    const failedWithAmount = await post(t, auth, '/x402/gate/verify', {
      gateId,
      evidence: { responseSha256: 'a'.repeat(64) },
      verificationStatus: 'failed',
      amount: 5,
    });
    expect(failedWithAmount.statusCode, failedWithAmount.body).toBe(422);
    expect(failedWithAmount.json()).toMatchObject({ code: 'VALIDATION_FAILED' });
    expect((await get(t, auth, `/x402/gate/${gateId}`)).json()).toMatchObject({
      status: 'authorized',
      verification: null,
    });
    const ok = await post(t, auth, '/x402/gate/verify', {
      gateId,
      evidence: { responseSha256: 'a'.repeat(64) },
      amount: 20,
    });
    expect(ok.statusCode, ok.body).toBe(200);
    expect(ok.json()).toMatchObject({
      status: 'released',
      verification: { capturedAmount: 20 },
      settlement: { releasedAmount: 20, refundedAmount: 30 },
    });
    expect(await balances(t, auth, payee)).toEqual({ available: 20, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: FUNDS - 20, escrow: 0 });
    await expectLedgerBalances(t);
    await expectCleanAudit(t);
  });
});
