import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobIdFor } from '../../src/queues/index.ts';
import { gateSettlementId } from '../../src/services/x402/service.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import {
  createGate,
  expectLedgerBalances,
  gateParties,
  get,
  post,
  quote,
  requestHash,
  sponsorWallet,
} from './helpers.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));

describe('x402 under concurrency (FerretDB: no read-modify-write anywhere)', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  const children: ChildProcess[] = [];
  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
  });
  afterAll(async () => {
    await Promise.all(
      children.map(
        (c) =>
          new Promise((resolve) => {
            c.once('exit', resolve);
            c.kill('SIGTERM');
          }),
      ),
    );
    await t.close();
  });

  it('100 concurrent wallet authorizations of 100 against a daily limit of 1000: exactly 10 succeed', async () => {
    const { payer, payee } = await gateParties(t, auth, 0);
    const sponsor = await sponsorWallet(t, tenantId, 10_000);
    expect(
      (
        await t.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${sponsor}/policy`,
          headers: auth,
          payload: { currency: 'USD', dailyLimit: 1_000 },
        })
      ).statusCode,
    ).toBe(200);
    const quoted = [];
    for (let i = 0; i < 100; i++) {
      const gate = await createGate(t, auth, {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 100,
        sponsorWalletId: sponsor,
      });
      quoted.push({ gateId: gate.gateId, ...(await quote(t, auth, gate.gateId)) });
    }
    const results = await Promise.all(
      quoted.map((q) =>
        post(t, auth, `/x402/wallets/${sponsor}/authorize`, {
          gateId: q.gateId,
          quoteId: q.quoteId,
          requestSha256: q.requestSha256,
        }),
      ),
    );
    const statuses = results.map((r) => r.statusCode);
    expect(statuses.filter((s) => s === 200)).toHaveLength(10);
    expect(statuses.filter((s) => s === 409)).toHaveLength(90);
    expect(results.find((r) => r.statusCode === 409)!.json()).toMatchObject({
      code: 'X402_WALLET_POLICY_VIOLATION',
      details: { rule: 'dailyLimit', limit: 1_000, spentToday: 1_000 },
    });
    const spends = await t.runtime.db.collection('x402_daily_spends').find({ ref: sponsor }).toArray();
    expect(spends.map((s) => s.total).sort((a, b) => a - b)).toEqual([
      100, 200, 300, 400, 500, 600, 700, 800, 900, 1_000,
    ]);
    // A repeat of an approved decision answers the same token and counts nothing more.
    const approved = quoted[statuses.indexOf(200)]!;
    const repeat = await post(t, auth, `/x402/wallets/${sponsor}/authorize`, {
      gateId: approved.gateId,
      quoteId: approved.quoteId,
      requestSha256: approved.requestSha256,
    });
    expect(repeat.json().walletDecisionToken).toBe(results[statuses.indexOf(200)]!.json().walletDecisionToken);
    expect(await t.runtime.db.collection('x402_daily_spends').countDocuments({ ref: sponsor })).toBe(10);
  }, 120_000);

  it('50 concurrent authorize-payment calls on one gate return one token', async () => {
    const { payer, payee } = await gateParties(t, auth, 1_000);
    expect(
      (
        await t.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
          headers: auth,
          payload: { currency: 'USD', dailyLimit: 5_000 },
        })
      ).statusCode,
    ).toBe(200);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 1_000 });
    const q = await quote(t, auth, gate.gateId);
    const results = await Promise.all(
      Array.from({ length: 50 }, () =>
        post(t, auth, '/x402/gate/authorize-payment', {
          gateId: gate.gateId,
          quoteId: q.quoteId,
          requestSha256: q.requestSha256,
        }),
      ),
    );
    expect(results.map((r) => r.statusCode)).toEqual(Array(50).fill(200));
    expect(new Set(results.map((r) => r.json().token)).size).toBe(1);
    expect(new Set(results.map((r) => r.json().authorizationRef)).size).toBe(1);
    const spends = await t.runtime.db.collection('x402_daily_spends').find({ ref: payer }).toArray();
    expect(spends.map((s) => s.amount)).toEqual([1_000]);
    expect(await balances(t, auth, payer)).toEqual({ available: 0, escrow: 1_000 });
  });

  it('verify processed twice, by two worker processes at once, moves the money once', async () => {
    const { payer, payee } = await gateParties(t, auth, 10_000);
    const gates = [];
    for (let i = 0; i < 4; i++) {
      const gate = await createGate(t, auth, {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 1_000,
        holdbackBps: 2_000,
        disputeWindowSeconds: 1,
      });
      const q = await quote(t, auth, gate.gateId, requestHash(`two-${i}`));
      expect(
        (
          await post(t, auth, '/x402/gate/authorize-payment', {
            gateId: gate.gateId,
            quoteId: q.quoteId,
            requestSha256: q.requestSha256,
          })
        ).statusCode,
      ).toBe(200);
      gates.push(gate.gateId);
    }
    // The report recorded, then several copies of the job, for two other processes to race on.
    for (const gateId of gates) {
      await t.runtime.stores.x402.verifications.insertOne({
        _id: gateId,
        tenantId,
        verificationStatus: 'verified',
        evidence: { responseSha256: requestHash('ok'), providerSignature: null },
        at: new Date(),
      });
      for (let copy = 0; copy < 6; copy++)
        await t.runtime.producers.enqueue(
          'x402-verify',
          { tenantId, gateId },
          jobIdFor('x402-verify', gateId, `copy${copy}`),
        );
    }
    for (let i = 0; i < 2; i++) {
      children.push(
        spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', 'worker', 'x402-verify', 'settle'], {
          cwd: root,
          env: { ...process.env, ...t.env.vars, WORKER_CONCURRENCY: '4', LOG_LEVEL: 'warn' },
          stdio: 'ignore',
        }),
      );
    }
    for (const gateId of gates) {
      const deadline = Date.now() + 30_000;
      while ((await get(t, auth, `/x402/gate/${gateId}`)).json().settlement?.holdbackState !== 'released') {
        if (Date.now() > deadline) throw new Error(`gate ${gateId} not settled`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    expect(await balances(t, auth, payee)).toEqual({ available: 4_000, escrow: 0 });
    expect(await balances(t, auth, payer)).toEqual({ available: 6_000, escrow: 0 });
    const releases = await t.runtime.stores.ledger.entries
      .find({ kind: { $in: ['settlement_release', 'holdback_release'] } })
      .toArray();
    expect(releases.map((e) => e._id).sort()).toEqual(
      gates.flatMap((g) => [`settle:${gateSettlementId(g)}:holdback`, `settle:${gateSettlementId(g)}:release`]).sort(),
    );
    await expectLedgerBalances(t);
  }, 90_000);
});
