// Issue 38: a sponsor wallet's daily limit counted an approved wallet decision a second time at authorize-payment,
// so decisions within the limit ended in escalations (sequentially the last, concurrently all of them).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import {
  createGate,
  expectLedgerBalances,
  gateParties,
  post,
  quote,
  sponsorWallet,
  twoApiProcesses,
  X402_SCOPES,
} from './helpers.ts';

describe('x402 wallet daily limit: a decision and its authorize-payment count once', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  beforeAll(async () => {
    t = await startTestApp({ overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ auth, tenantId } = await t.tenantWithKey([...X402_SCOPES]));
  });
  afterAll(() => t.close());

  /** A sponsor wallet (daily limit 100) paying for `count` quoted gates of 30. */
  async function sponsoredGates(count: number) {
    const sponsor = await sponsorWallet(t, tenantId, 1_000);
    const policy = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${sponsor}/policy`,
      headers: auth,
      payload: { currency: 'USD', dailyLimit: 100 },
    });
    expect(policy.statusCode, policy.body).toBe(200);
    return { sponsor, gates: await gatesOf(sponsor, count) };
  }

  /** `count` quoted gates of 30 between two new agents, sponsored by `sponsor`. */
  async function gatesOf(sponsor: string, count: number) {
    const { payer, payee } = await gateParties(t, auth, 0);
    const gates = [];
    for (let i = 0; i < count; i++) {
      const gate = await createGate(t, auth, {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 30,
        sponsorWalletId: sponsor,
      });
      const q = await quote(t, auth, gate.gateId);
      gates.push({ gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 });
    }
    return gates;
  }

  const decide = (sponsor: string, body: { gateId: string; quoteId: string; requestSha256: string }) =>
    post(t, auth, `/x402/wallets/${sponsor}/authorize`, body);
  const pay = (body: { gateId: string; quoteId: string; requestSha256: string }, walletDecisionToken: string) =>
    post(t, auth, '/x402/gate/authorize-payment', { ...body, walletDecisionToken });
  const spendTotals = async (sponsor: string) =>
    (await t.runtime.db.collection('x402_daily_spends').find({ ref: sponsor }).toArray())
      .map((s) => s.total as number)
      .sort((a, b) => a - b);

  /** The limit still holds once 90 is counted: a fourth gate of 30 is refused at its wallet decision. */
  async function expectLimitHolds(sponsor: string) {
    const [fourth] = await gatesOf(sponsor, 1);
    const refused = await decide(sponsor, fourth!);
    expect(refused.statusCode, refused.body).toBe(409);
    expect(refused.json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'dailyLimit', limit: 100, spentToday: 90 },
    });
  }

  it('one after another: three decisions of 30 under a limit of 100 each authorize', async () => {
    const { sponsor, gates } = await sponsoredGates(3);
    for (const gate of gates) {
      const decision = await decide(sponsor, gate);
      expect(decision.statusCode, decision.body).toBe(200);
      const paid = await pay(gate, decision.json().walletDecisionToken);
      expect(paid.statusCode, paid.body).toBe(200);
      expect(paid.json()).toMatchObject({ reserve: { amount: 30, status: 'reserved' } });
    }
    expect(await spendTotals(sponsor)).toEqual([30, 60, 90]);
    expect(await balances(t, auth, sponsor)).toEqual({ available: 910, escrow: 90 });
    await expectLimitHolds(sponsor);
  });

  it('at once: three decisions, then their three authorize-payments, all authorize', async () => {
    const { sponsor, gates } = await sponsoredGates(3);
    const decisions = await Promise.all(gates.map((g) => decide(sponsor, g)));
    expect(decisions.map((d) => d.statusCode)).toEqual([200, 200, 200]);
    const paid = await Promise.all(gates.map((g, i) => pay(g, decisions[i]!.json().walletDecisionToken)));
    expect(
      paid.map((p) => p.statusCode),
      paid.map((p) => p.body).join('\n'),
    ).toEqual([200, 200, 200]);
    expect(await spendTotals(sponsor)).toEqual([30, 60, 90]);
    await expectLimitHolds(sponsor);
  });

  it('at once: each gate decided then paid, the three chains interleaved, all authorize', async () => {
    const { sponsor, gates } = await sponsoredGates(3);
    const paid = await Promise.all(
      gates.map(async (g) => {
        const decision = await decide(sponsor, g);
        expect(decision.statusCode, decision.body).toBe(200);
        return pay(g, decision.json().walletDecisionToken);
      }),
    );
    expect(
      paid.map((p) => p.statusCode),
      paid.map((p) => p.body).join('\n'),
    ).toEqual([200, 200, 200]);
    expect(await spendTotals(sponsor)).toEqual([30, 60, 90]);
    await expectLimitHolds(sponsor);
  });

  it('a decision taken before the policy had a daily limit is counted at authorize-payment under the new one', async () => {
    const sponsor = await sponsorWallet(t, tenantId, 1_000);
    const setPolicy = async (payload: Record<string, unknown>) => {
      const res = await t.app.inject({
        method: 'PUT',
        url: `/x402/wallets/${sponsor}/policy`,
        headers: auth,
        payload: { currency: 'USD', ...payload },
      });
      expect(res.statusCode, res.body).toBe(200);
    };
    await setPolicy({}); // no daily limit
    const [first, second] = await gatesOf(sponsor, 2);
    const decisions = await Promise.all([decide(sponsor, first!), decide(sponsor, second!)]);
    expect(decisions.map((d) => d.statusCode)).toEqual([200, 200]);
    expect(await spendTotals(sponsor)).toEqual([]); // no daily limit: nothing to count
    // The decisions' policy version is no longer in force: their payments are counted against the new limit.
    await setPolicy({ dailyLimit: 50, onBreach: 'refuse' });
    const paid = await pay(first!, decisions[0]!.json().walletDecisionToken);
    expect(paid.statusCode, paid.body).toBe(200);
    expect(await spendTotals(sponsor)).toEqual([30]);
    const refused = await pay(second!, decisions[1]!.json().walletDecisionToken);
    expect(refused.statusCode, refused.body).toBe(409);
    expect(refused.json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'dailyLimit', limit: 50, spentToday: 30 },
    });
    expect(await spendTotals(sponsor)).toEqual([30]);
  });

  it("a payer's own limit: concurrent repeats of one authorize-payment that fills the day all get its one token", async () => {
    const { payer, payee } = await gateParties(t, auth, 100);
    const policy = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: auth,
      payload: { currency: 'USD', dailyLimit: 30 },
    });
    expect(policy.statusCode, policy.body).toBe(200);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 30 });
    const q = await quote(t, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };
    const results = await Promise.all(
      Array.from({ length: 10 }, () => post(t, auth, '/x402/gate/authorize-payment', body)),
    );
    expect(
      results.map((r) => r.statusCode),
      results.map((r) => r.body).join('\n'),
    ).toEqual(Array(10).fill(200));
    expect(new Set(results.map((r) => r.json().token)).size).toBe(1);
    expect(await spendTotals(payer)).toEqual([30]);
    // An authorized gate waits on no person.
    expect(await t.runtime.stores.x402.escalations.countDocuments({ gateId: gate.gateId })).toBe(0);
    await expectLedgerBalances(t);
  });
});

describe('x402 wallet daily limit across two API processes', () => {
  const p = twoApiProcesses();

  it('decisions taken by one process, their authorize-payments sent at once to the other: all authorize, the limit holds', async () => {
    const { first, second } = p;
    const { auth, tenantId } = await first.tenantWithKey([...X402_SCOPES]);
    const { payer, payee } = await gateParties(first, auth, 0);
    const sponsor = await sponsorWallet(first, tenantId, 1_000);
    expect(
      (
        await first.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${sponsor}/policy`,
          headers: auth,
          payload: { currency: 'USD', dailyLimit: 100 },
        })
      ).statusCode,
    ).toBe(200);
    const gates = [];
    for (let i = 0; i < 4; i++) {
      const gate = await createGate(first, auth, {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 30,
        sponsorWalletId: sponsor,
      });
      const q = await quote(first, auth, gate.gateId);
      gates.push({ gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 });
    }
    const decisions = await Promise.all(gates.map((g) => post(first, auth, `/x402/wallets/${sponsor}/authorize`, g)));
    const decided = gates.filter((_, i) => decisions[i]!.statusCode === 200);
    expect(decided).toHaveLength(3); // 4 x 30 against 100: one refused
    const tokens = decisions.filter((d) => d.statusCode === 200).map((d) => d.json().walletDecisionToken as string);
    const paid = await Promise.all(
      decided.map((g, i) =>
        post(second, auth, '/x402/gate/authorize-payment', { ...g, walletDecisionToken: tokens[i] }),
      ),
    );
    expect(
      paid.map((r) => r.statusCode),
      paid.map((r) => r.body).join('\n'),
    ).toEqual([200, 200, 200]);
    const spends = await first.runtime.db.collection('x402_daily_spends').find({ ref: sponsor }).toArray();
    expect(spends.map((s) => s.total as number).sort((a, b) => a - b)).toEqual([30, 60, 90]);
  });
});
