import type { Server } from 'node:http';
import {
  decodePaymentRequiredHeader,
  decodePaymentResponseHeader,
  decodePaymentSignatureHeader,
} from '@x402/core/http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sessionPayingFetch } from '../../examples/session-tool/caller.ts';
import { createSessionTool } from '../../examples/session-tool/tool.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { gateParties, listeningForX402 } from './helpers.ts';

describe('x402 v2 sessions: stock fetch wrapper -> stock express middleware -> this service as escrow-session facilitator', () => {
  let t: TestApp;
  let base: string;
  let payerKey: string;
  let auth: Record<string, string>;
  let network: `${string}:${string}`;
  let tool: Server;
  let toolUrl: string;
  let payer: string;
  let payee: string;

  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    const listening = await listeningForX402(t);
    ({ base, network, auth, payerKey } = listening);
    const { providerKey } = listening;
    ({ payer, payee } = await gateParties(t, auth, 1_000));
    tool = createSessionTool({
      serviceUrl: base,
      apiKey: providerKey,
      network,
      payeeAgentId: payee,
      searchPrice: '$0.05',
      rowPrice: 2,
      maxRows: 10,
    }).listen(0, '127.0.0.1');
    await new Promise((resolve) => tool.once('listening', resolve));
    toolUrl = `http://127.0.0.1:${(tool.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    await new Promise((resolve) => tool.close(resolve));
    await t.close();
  });

  /** A fetch that counts the payer's own requests to the service (the tool's facilitator calls are the provider's). */
  function counting() {
    const calls: string[] = [];
    const fetch: typeof globalThis.fetch = (input, init) => {
      const url = String(input instanceof Request ? input.url : input);
      if (url.startsWith(base)) calls.push(`${init?.method ?? 'GET'} ${url.slice(base.length)}`);
      return globalThis.fetch(input, init);
    };
    return { calls, fetch };
  }

  it('pays fixed and metered calls from one session opened with one request, and returns the rest at close', async () => {
    const { calls, fetch } = counting();
    const paying = sessionPayingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer,
      network,
      budget: 500,
      fetch,
    });
    const answers = [];
    for (const path of ['/search?q=a', '/search?q=b', '/rows?n=3', '/rows?n=0', '/search?q=c']) {
      const res = await paying.fetch(toolUrl + path);
      expect(res.status, path).toBe(200);
      await res.json();
      answers.push(decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!));
    }
    // One request of the payer's to the service for five paid calls: the session's open.
    expect(calls).toEqual(['POST /x402/sessions']);
    expect(answers.map((a) => [a.success, a.amount])).toEqual([
      [true, '5'],
      [true, '5'],
      [true, '6'],
      [true, '0'],
      [true, '5'],
    ]);
    const sessionId = answers[0]!.extra!.sessionId as string;
    expect(answers.every((a) => a.extra!.sessionId === sessionId && a.transaction.startsWith(`${sessionId}#`))).toBe(
      true,
    );
    // Metered: 6 of the 20 the payer authorized for /rows?n=3 were charged, and the rest went back to the budget at once.
    expect(
      (await t.app.inject({ method: 'GET', url: `/x402/sessions/${sessionId}`, headers: auth })).json(),
    ).toMatchObject({ status: 'open', spent: 21, remaining: 479 });

    await paying.close();
    expect(await balances(t, auth, payer)).toEqual({ available: 979, escrow: 0 });
    expect(await balances(t, auth, payee)).toEqual({ available: 21, escrow: 0 });
    const statement = (
      await t.app.inject({ method: 'GET', url: `/x402/sessions/${sessionId}/statement`, headers: auth })
    ).json();
    expect(statement.charges.map((c: { amount: number }) => c.amount)).toEqual([5, 5, 6, 0, 5]);
    await expectCleanAudit(t);
  });

  it('opens the next session when the budget could not cover a call, closing the spent one', async () => {
    const { calls, fetch } = counting();
    const paying = sessionPayingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer,
      network,
      budget: 12,
      fetch,
    });
    const before = await balances(t, auth, payer);
    for (let i = 0; i < 3; i++) expect((await paying.fetch(`${toolUrl}/search?q=${i}`)).status).toBe(200);
    expect(calls.filter((c) => c === 'POST /x402/sessions')).toHaveLength(2);
    await paying.close();
    expect(await balances(t, auth, payer)).toEqual({ available: before.available - 15, escrow: 0 });
    await expectCleanAudit(t);
  });

  it('refuses a payment payload sent again: the payment id was settled once', async () => {
    let signature: string | null = null;
    const capture: typeof globalThis.fetch = (input, init) => {
      const header = new Headers(input instanceof Request ? input.headers : init?.headers).get('PAYMENT-SIGNATURE');
      if (header) signature = header;
      return globalThis.fetch(input, init);
    };
    const paying = sessionPayingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer,
      network,
      budget: 100,
      fetch: capture,
    });
    expect((await paying.fetch(`${toolUrl}/search?q=replay`)).status).toBe(200);
    expect(signature).not.toBeNull();
    const replayed = await globalThis.fetch(`${toolUrl}/search?q=replay`, {
      headers: { 'PAYMENT-SIGNATURE': signature! },
    });
    expect(replayed.status).toBe(402);
    expect(JSON.stringify(decodePaymentRequiredHeader(replayed.headers.get('PAYMENT-REQUIRED')!))).toContain(
      'session_payment_reused',
    );

    // A provider whose settle timed out settles again: the same payment id answers the same charge, charged once.
    const paymentPayload = decodePaymentSignatureHeader(signature!);
    const settle = () =>
      t.app.inject({
        method: 'POST',
        url: '/x402/facilitator/settle',
        headers: auth,
        payload: { x402Version: 2, paymentPayload, paymentRequirements: paymentPayload.accepted },
      });
    const [first, again] = [(await settle()).json(), (await settle()).json()];
    expect(first).toMatchObject({ success: true, amount: '5' });
    expect(again).toEqual(first);
    const sessionId = paymentPayload.payload.sessionId as string;
    expect(
      (await t.app.inject({ method: 'GET', url: `/x402/sessions/${sessionId}`, headers: auth })).json(),
    ).toMatchObject({ spent: 5, charges: 1 });
    // ... or looks it up by its payment id, or by the body it sent: settled, with the answer settle gave.
    const paymentId = `${sessionId}:${paymentPayload.payload.paymentId as string}`;
    const byId = (
      await t.app.inject({
        method: 'GET',
        url: `/x402/facilitator/payments/${encodeURIComponent(paymentId)}`,
        headers: auth,
      })
    ).json();
    expect(byId).toMatchObject({
      paymentId,
      status: 'settled',
      settlement: { ...first, extra: { ...first.extra, remaining: expect.any(Number) } },
    });
    const byBody = await t.app.inject({
      method: 'POST',
      url: '/x402/facilitator/status',
      headers: auth,
      payload: { x402Version: 2, paymentPayload, paymentRequirements: paymentPayload.accepted },
    });
    expect(byBody.json()).toMatchObject({ paymentId, status: 'settled' });
    const never = (
      await t.app.inject({
        method: 'GET',
        url: `/x402/facilitator/payments/${encodeURIComponent(`${sessionId}:never-seen`)}`,
        headers: auth,
      })
    ).json();
    expect(never).toMatchObject({ status: 'unknown', settlement: null });

    // A payment verified (its price held) but never settled: authorized until the session closes, then refused,
    // and the close voids its hold: the payer pays nothing for it.
    const held = { ...paymentPayload, payload: { ...paymentPayload.payload, paymentId: 'verified-only' } };
    const verified = await t.app.inject({
      method: 'POST',
      url: '/x402/facilitator/verify',
      headers: auth,
      payload: { x402Version: 2, paymentPayload: held, paymentRequirements: held.accepted },
    });
    expect(verified.json()).toMatchObject({ isValid: true });
    const heldUrl = `/x402/facilitator/payments/${encodeURIComponent(`${sessionId}:verified-only`)}`;
    expect((await t.app.inject({ method: 'GET', url: heldUrl, headers: auth })).json()).toMatchObject({
      status: 'authorized',
      settleBy: expect.any(String),
    });
    await paying.close();
    expect((await t.app.inject({ method: 'GET', url: heldUrl, headers: auth })).json()).toMatchObject({
      status: 'refused',
      settlement: { success: false, errorReason: 'session_closed' },
    });
    const statement = (
      await t.app.inject({ method: 'GET', url: `/x402/sessions/${sessionId}/statement`, headers: auth })
    ).json();
    expect(statement.body).toMatchObject({ totalCharged: 5, voided: 1 });

    // Once the closed session's budget is gone from Redis, a lookup still finds the settled payment (and the voided
    // hold) in the session's payment index, a charge is refused as closed, and neither puts the budget back.
    const budgetKeys = ['budget', 'payments'].map((k) => `${t.runtime.config.redisPrefix}:{ses:${sessionId}}:${k}`);
    await t.runtime.redis.del(...budgetKeys);
    expect(
      (
        await t.app.inject({
          method: 'GET',
          url: `/x402/facilitator/payments/${encodeURIComponent(paymentId)}`,
          headers: auth,
        })
      ).json(),
    ).toMatchObject({
      status: 'settled',
      settlementStatus: 'settled',
      settledAmount: '5',
      settledAt: expect.any(String),
      settlement: { success: true, status: 'settled', amount: '5', transaction: first.transaction },
    });
    expect((await t.app.inject({ method: 'GET', url: heldUrl, headers: auth })).json()).toMatchObject({
      status: 'refused',
      settlement: { success: false, errorReason: 'session_closed' },
    });
    const late = await t.app.inject({
      method: 'POST',
      url: `/x402/sessions/${sessionId}/charges`,
      headers: auth,
      payload: { paymentId: 'too-late', payeeAgentId: payee, amount: 1 },
    });
    expect(late.json()).toMatchObject({ code: 'X402_SESSION_CLOSED' });
    expect(await t.runtime.redis.exists(...budgetKeys)).toBe(0);
  });
});
