import type { Server } from 'node:http';
import { decodePaymentResponseHeader } from '@x402/core/http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { meteredPayingFetch } from '../../examples/metered-tool/caller.ts';
import { createMeteredTool } from '../../examples/metered-tool/tool.ts';
import { verifyStatement } from '../../src/domain/x402-sessions.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { registerAgent, type TestAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, credit } from '../helpers/money.ts';
import { listeningForX402 } from './helpers.ts';

// examples/metered-tool: a tool priced per token behind the stock @x402/express middleware, a caller with the stock
// @x402/fetch wrapper, this service as the escrow-session facilitator. The payee signs each call's usage at settle,
// the session prices it, the caller acknowledges what it read, and the statement recomputes offline.

describe('x402 v2 witnessed usage: stock fetch wrapper -> stock express middleware -> priced session', () => {
  let t: TestApp;
  let base: string;
  let payerKey: string;
  let auth: Record<string, string>;
  let network: `${string}:${string}`;
  let tool: Server;
  let toolUrl: string;
  let payer: TestAgent;
  let payee: TestAgent;
  let providerKey: string;

  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    const listening = await listeningForX402(t);
    ({ base, network, auth, payerKey, providerKey } = listening);
    payer = await registerAgent(t, auth);
    payee = await registerAgent(t, auth);
    await credit(t, payer.agentId, 1_000);
    tool = createMeteredTool({
      serviceUrl: base,
      apiKey: providerKey,
      network,
      payeeAgentId: payee.agentId,
      payeeKey: payee,
      price: 1,
      per: 10,
      maxPerCall: 50,
    }).listen(0, '127.0.0.1');
    await new Promise((resolve) => tool.once('listening', resolve));
    toolUrl = `http://127.0.0.1:${(tool.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    await new Promise((resolve) => tool.close(resolve));
    await t.close();
  });

  async function statementOf(sessionId: string) {
    return (await t.app.inject({ method: 'GET', url: `/x402/sessions/${sessionId}/statement`, headers: auth })).json();
  }

  it('charges the priced usage of each call, pays what the caller acknowledged, and the statement recomputes offline', async () => {
    const before = await balances(t, auth, payer.agentId);
    const paying = meteredPayingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer.agentId,
      payerKey: payer,
      network,
      budget: 200,
      ackBatchSize: 2,
    });
    const answers = [];
    // 3 words echoed 3 times: 12 tokens, 2 units; 1 word once: 2 tokens, the minimum 1; 8 words x 5: 48 tokens, 5.
    for (const path of [
      '/complete?prompt=hello+metered+world&repeat=3',
      '/complete?prompt=one',
      '/complete?prompt=a+b+c+d+e+f+g+h&repeat=5',
    ]) {
      const res = await paying.fetch(toolUrl + path);
      expect(res.status, path).toBe(200);
      await res.json();
      answers.push(decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!));
    }
    expect(answers.map((a) => [a.success, a.amount])).toEqual([
      [true, '2'],
      [true, '1'],
      [true, '5'],
    ]);
    const sessionId = answers[0]!.extra!.sessionId as string;
    const usage = answers.map((a) => (a.extra!.usage as { record: { usage: unknown } }).record.usage);
    expect(usage).toEqual([{ tokens: 12 }, { tokens: 2 }, { tokens: 48 }]);
    // The priced session holds what the route priced at most (50) per call, and charged the priced usage.
    const session = (await t.app.inject({ method: 'GET', url: `/x402/sessions/${sessionId}`, headers: auth })).json();
    expect(session).toMatchObject({
      status: 'open',
      spent: 8,
      requireAcknowledgedUsage: true,
      pricing: { prices: { tokens: { price: 1, per: 10 } }, minimum: 1 },
    });

    await paying.close();
    const statement = await statementOf(sessionId);
    expect(statement.body).toMatchObject({ totalCharged: 8, unacknowledged: 0, refunded: 192 });
    expect(statement.charges.map((c: { usage: { payerSignature: unknown } }) => c.usage.payerSignature)).toEqual([
      expect.objectContaining({ keyId: payer.keyId }),
      expect.objectContaining({ keyId: payer.keyId }),
      expect.objectContaining({ keyId: payer.keyId }),
    ]);
    const jwks = (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
    expect(verifyStatement(statement, jwks)).toMatchObject({ verified: true });
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: before.available - 8, escrow: 0 });
    expect(await balances(t, auth, payee.agentId)).toEqual({ available: 8, escrow: 0 });
    await expectCleanAudit(t);
  });

  it("a tool that signs usage with a key not the payee's is refused at settle (usage_payee_signature_invalid), nothing charged", async () => {
    const impostor = await registerAgent(t, auth);
    const forged = createMeteredTool({
      serviceUrl: base,
      apiKey: providerKey,
      network,
      payeeAgentId: payee.agentId,
      payeeKey: impostor,
    }).listen(0, '127.0.0.1');
    await new Promise((resolve) => forged.once('listening', resolve));
    try {
      const before = await balances(t, auth, payer.agentId);
      const paying = meteredPayingFetch({
        serviceUrl: base,
        apiKey: payerKey,
        payerAgentId: payer.agentId,
        payerKey: payer,
        network,
        budget: 100,
      });
      const res = await paying.fetch(
        `http://127.0.0.1:${(forged.address() as { port: number }).port}/complete?prompt=x`,
      );
      expect(res.status).toBe(402);
      const answer = decodePaymentResponseHeader(res.headers.get('PAYMENT-RESPONSE')!);
      expect(answer).toMatchObject({ success: false, errorReason: 'usage_payee_signature_invalid' });
      await paying.close();
      expect(await balances(t, auth, payer.agentId)).toEqual(before);
    } finally {
      await new Promise((resolve) => forged.close(resolve));
    }
  });

  it('usage the caller does not acknowledge goes back to it at the close', async () => {
    const before = await balances(t, auth, payer.agentId);
    const paidBefore = (await balances(t, auth, payee.agentId)).available;
    // The caller refuses to acknowledge a response of more than 20 tokens.
    const paying = meteredPayingFetch({
      serviceUrl: base,
      apiKey: payerKey,
      payerAgentId: payer.agentId,
      payerKey: payer,
      network,
      budget: 100,
      accept: (record) => (record.usage.tokens ?? 0) <= 20,
    });
    const small = await paying.fetch(`${toolUrl}/complete?prompt=x+y&repeat=1`); // 4 tokens: 1
    const large = await paying.fetch(`${toolUrl}/complete?prompt=a+b+c+d+e+f+g+h+i+j&repeat=3`); // 40 tokens: 4
    expect([small.status, large.status]).toEqual([200, 200]);
    const sessionId = decodePaymentResponseHeader(small.headers.get('PAYMENT-RESPONSE')!).extra!.sessionId as string;
    await paying.close();
    const statement = await statementOf(sessionId);
    expect(statement.body).toMatchObject({ totalCharged: 1, unacknowledged: 4, refunded: 99 });
    expect(statement.charges[1].usage.payerSignature).toBeNull();
    const jwks = (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
    expect(verifyStatement(statement, jwks).verified).toBe(true);
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: before.available - 1, escrow: 0 });
    expect((await balances(t, auth, payee.agentId)).available).toBe(paidBefore + 1);
  });
});
