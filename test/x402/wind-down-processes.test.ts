import type { CommandStartedEvent } from 'mongodb';
import { beforeAll, describe, expect, it } from 'vitest';
import { createGate, gateParties, post, quote, twoApiProcesses } from './helpers.ts';

/**
 * Two API processes (two runtimes sharing one database and one Redis prefix, so one invalidation channel): each
 * caches agents with whether they are wound down. A wind-down through the first must be refused by the second as
 * soon as it answers, for an agent the second had cached as live.
 */
describe('x402 wind-down across processes', () => {
  const processes = twoApiProcesses();
  beforeAll(async () => {
    const { first, second } = processes;
    // Both caches must be serving from memory, or the second process would read the fact on every call anyway.
    for (let i = 0; i < 100 && !(first.runtime.credentials.isLive() && second.runtime.credentials.isLive()); i++)
      await new Promise((r) => setTimeout(r, 50));
    expect(first.runtime.credentials.isLive() && second.runtime.credentials.isLive()).toBe(true);
  });

  it('a second process refuses create, quote and authorize for an agent wound down through the first, at once', async () => {
    const { first, second, auth } = processes;
    const { payer, payee } = await gateParties(first, auth, 10_000);
    // The second process caches both agents as live: a gate created, quoted and authorized there.
    const warm = await createGate(second, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    const warmQuote = await quote(second, auth, warm.gateId);
    const pending = await createGate(second, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 200 });
    const pendingQuote = await quote(second, auth, pending.gateId);
    const seen: string[] = [];
    const listener = (e: CommandStartedEvent) => seen.push(`${e.commandName} ${String(e.command[e.commandName])}`);
    second.runtime.mongo.on('commandStarted', listener);
    const authorized = await post(second, auth, '/x402/gate/authorize-payment', {
      gateId: warm.gateId,
      quoteId: warmQuote.quoteId,
      requestSha256: warmQuote.requestSha256,
    });
    second.runtime.mongo.off('commandStarted', listener);
    expect(authorized.statusCode, authorized.body).toBe(200);
    expect(seen.filter((c) => c.includes('x402_wind_downs'))).toEqual([]); // served from the cache: nothing read

    const wound = await post(first, auth, `/x402/gate/agents/${encodeURIComponent(payer)}/wind-down`, {
      reasonCode: 'retired',
    });
    expect(wound.statusCode, wound.body).toBe(200);
    expect(wound.json().gatesCancelled).toEqual([pending.gateId]);

    // Straight after the answer, without waiting for anything: the second process no longer serves the agent as live.
    const [authorize, create, requote] = await Promise.all([
      post(second, auth, '/x402/gate/authorize-payment', {
        gateId: pending.gateId,
        quoteId: pendingQuote.quoteId,
        requestSha256: pendingQuote.requestSha256,
      }),
      post(second, auth, '/x402/gate/create', {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 10,
        currency: 'USD',
      }),
      post(second, auth, '/x402/gate/quote', { gateId: pending.gateId, requestSha256: pendingQuote.requestSha256 }),
    ]);
    for (const res of [authorize, create, requote]) {
      expect(res.statusCode, res.body).toBe(410);
      expect(res.json()).toMatchObject({
        code: 'X402_AGENT_WOUND_DOWN',
        details: { agentId: payer, status: 'wound_down' },
      });
    }
    // Only the wound-down agent is refused: its payee can still be paid, through the second process too.
    const other = await gateParties(first, auth, 1_000);
    expect(
      (
        await post(second, auth, '/x402/gate/create', {
          payerAgentId: other.payer,
          payeeAgentId: payee,
          amount: 10,
          currency: 'USD',
        })
      ).statusCode,
    ).toBe(201);
  });
});
