import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { newId, sha256Hex } from '../../src/domain/crypto.ts';
import { ServiceError } from '../../src/domain/errors.ts';
import { settlementTerms, withRunEscrow } from '../../src/services/escrow.ts';
import { createLogger } from '../../src/logger.ts';
import { connectRuntime, createRuntime, type Runtime } from '../../src/runtime.ts';
import { RUN_GRACE_MS } from '../../src/store/ledger.ts';
import { deriveSettlement } from '../../src/domain/settlement.ts';
import { candidateEntries, readSettlement, termsOf } from '../../src/store/settlements.ts';
import { disputeSplit } from '../../src/domain/money.ts';
import { advanceSettlement } from '../../src/services/settlement.ts';
import { createSettleProcessor } from '../../src/workers/settle.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

const RUNS = Number(process.env.SETTLE_RUNS ?? 500);
const CURRENCIES = ['USD', 'USDC'];

/** Deterministic pseudo-random numbers, so a failing seed can be replayed (printed on failure). */
function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let x = Math.imul(s ^ (s >>> 15), 1 | s);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

class Crash extends Error {}

describe('settlement money under retries, races and crashes (randomized)', () => {
  let t: TestApp;
  let second: Runtime; // another "worker process": its own connections to the same servers
  const seed = Number(process.env.SETTLE_SEED ?? Date.now() % 1_000_000);
  const random = rng(seed);
  const pick = <T>(items: readonly T[]) => items[Math.floor(random() * items.length)]!;

  beforeAll(async () => {
    t = await startTestApp({ overrides: { SWEEP_STALE_AFTER_MS: '0' } });
    const config = loadConfig(t.env.vars);
    second = createRuntime(config, createLogger(config, 'second'));
    await connectRuntime(second, 10_000);
  });
  afterAll(async () => {
    await second.close();
    await t.close();
  });

  it(`keeps every currency balanced and every effect single across ${RUNS} settlements (seed ${seed})`, async () => {
    const runtime = t.runtime;
    const tenant = await runtime.stores.tenants.create({ name: 'random' });
    const tenantId = tenant._id;
    const mkAgent = async (role: string) => {
      const agentId = `rand:agent:${role}-${newId('x')}`;
      await runtime.stores.agents.create(tenantId, {
        _id: agentId,
        displayName: null,
        metadataJson: null,
        status: 'active',
        keys: {},
        createdAt: new Date(),
      });
      await runtime.stores.ledger.ensureWallet(agentId, tenantId, 'agent');
      return agentId;
    };
    const payers = await Promise.all(Array.from({ length: 12 }, (_, i) => mkAgent(`payer${i}`)));
    const payees = await Promise.all(Array.from({ length: 12 }, (_, i) => mkAgent(`payee${i}`)));
    const credited: Record<string, number> = { USD: 0, USDC: 0 };
    for (const payer of payers) {
      for (const currency of CURRENCIES) {
        const amount = 20_000 + Math.floor(random() * 200_000);
        await runtime.stores.ledger.apply({
          _id: `credit:${payer}:${currency}`,
          tenantId,
          kind: 'credit',
          currency,
          legs: [{ walletId: payer, bucket: 'available', delta: amount }],
          ref: {},
        });
        credited[currency]! += amount;
      }
    }

    // Crash between the legs of ledger entries now and then, and between a leg's position claim and its marker,
    // on both "processes".
    for (const r of [runtime, second]) {
      r.stores.ledger.failAfterLeg = (_entry, leg) => {
        if (leg === 0 && random() < 0.08) throw new Crash('killed between ledger legs');
      };
      r.stores.ledger.failAfterClaim = () => {
        if (random() < 0.03) throw new Crash('killed between a position claim and its leg marker');
      };
    }
    const steps = [
      'released',
      'decided',
      'holdback-released',
      'dispute-payer-paid',
      'dispute-payee-paid',
      'held-resolved',
    ];
    const crashy = () => {
      const at = random() < 0.35 ? pick(steps) : null;
      return (step: string) => {
        if (step === at) throw new Crash(`killed after ${step}`);
      };
    };
    const attempt = async (r: Runtime, settlementId: string, crash = crashy()) => {
      try {
        return await advanceSettlement(r, settlementId, crash);
      } catch (err) {
        if (err instanceof Crash) return null;
        throw err;
      }
    };
    /** A job: its first run may crash anywhere; BullMQ retries it until it completes; a duplicate copy races it. */
    const job = async (settlementId: string) => {
      const duplicate = attempt(second, settlementId);
      for (let tries = 0; tries < 20 && !(await attempt(runtime, settlementId)); tries++);
      await duplicate;
    };
    const read = async (settlementId: string) =>
      readSettlement(
        runtime.stores.settlements,
        runtime.stores.ledger,
        (await runtime.stores.settlements.get(settlementId))!,
      );

    let refused = 0;
    const settled: string[] = [];
    const work = Array.from({ length: RUNS }, () => async () => {
      const payer = pick(payers);
      const payee = pick(payees);
      const terms = settlementTerms({
        payerAgentId: payer,
        amount: 1 + Math.floor(random() * 9_000),
        currency: pick(CURRENCIES),
        holdbackBps: pick([0, 0, 250, 1_000, 3_333, 5_000, 10_000, Math.floor(random() * 10_001)]),
        disputeWindowSeconds: pick([0, 1, 3_600]),
      });
      const runId = newId('run');
      const insertRun = () =>
        runtime.stores.runs.createOrResume({
          _id: runId,
          tenantId,
          agentId: payee,
          terms: {},
          settlement: terms,
          status: 'finalized',
          verdict: random() < 0.7 ? 'pass' : 'fail',
          artifactId: `art_${sha256Hex(runId)}`,
          createdAt: new Date(),
          finalizeRequestedAt: new Date(),
          finalHead: { seq: 0, chainHash: null },
          finalizedAt: new Date(),
          finalizeError: null,
        });
      try {
        await withRunEscrow(runtime, tenantId, runId, payee, terms, insertRun);
      } catch (err) {
        if (err instanceof ServiceError && err.code === 'INSUFFICIENT_FUNDS') {
          refused++;
          return;
        }
        if (err instanceof Crash) return; // the request died between the lock's legs: the sweeper must give it back
        throw err;
      }
      const s = await runtime.stores.settlements.createOrGet({
        tenantId,
        runId,
        payerWalletId: payer,
        payeeWalletId: payee,
        amount: terms.amount,
        currency: terms.currency,
        holdbackBps: terms.holdbackBps,
        disputeWindowSeconds: terms.disputeWindowSeconds,
      });
      settled.push(s._id);
      await job(s._id);

      const { view, facts } = await read(s._id);
      if (view.status === 'completed' && terms.disputeWindowSeconds === 3_600 && random() < 0.5) {
        const disputeId = newId('dsp');
        const frozenAmount = view.holdbackState === 'held' ? view.holdback : 0;
        const opened = await runtime.stores.settlements.claim(s._id, 'holdback', {
          fate: 'dispute',
          disputeId,
          reason: 'random',
          evidenceJson: null,
          frozenAmount,
          at: new Date().toISOString(),
        });
        expect(opened.won).toBe(true);
        if (random() < 0.8) {
          const outcome = pick(['payee', 'payer', 'split'] as const);
          const bps = outcome === 'split' ? Math.floor(random() * 10_001) : undefined;
          await runtime.stores.settlements.claim(s._id, 'ruling', {
            outcome,
            payerShareBps: bps ?? null,
            ...disputeSplit(frozenAmount, outcome, bps),
            at: new Date().toISOString(),
          });
          await job(s._id);
        }
      } else if (view.status === 'held' && !facts.heldRuling && random() < 0.6) {
        await runtime.stores.settlements.claim(s._id, 'heldRuling', {
          outcome: pick(['release', 'refund'] as const),
          at: new Date().toISOString(),
        });
        await job(s._id);
      }
    });
    // Ten at a time, so payers' accounts see real contention.
    const queue = [...work];
    await Promise.all(
      Array.from({ length: 10 }, async () => {
        while (queue.length > 0) await queue.shift()!();
      }),
    );

    // Stop crashing; let the windows of 1 s end; then the sweepers of both processes repair everything, twice.
    for (const r of [runtime, second]) {
      r.stores.ledger.failAfterLeg = null;
      r.stores.ledger.failAfterClaim = null;
    }
    await new Promise((r) => setTimeout(r, 1_200));
    // "Afterwards" means once repair has nothing left to do: sweep (on both processes at once) until quiet.
    // A lock the sweep itself finished is checked against its run RUN_GRACE_MS later, so quiet must last that long.
    let busyAt = Date.now();
    for (let round = 0; round < 60; round++) {
      const outcomes = (await Promise.all([
        createSettleProcessor(runtime).sweep!(),
        createSettleProcessor(second).sweep!(),
      ])) as Array<Record<string, number>>;
      if (!outcomes.every((o) => o.entries === 0 && o.settlements === 0 && o.locksChecked === 0 && o.unlocked === 0))
        busyAt = Date.now();
      else if (Date.now() - busyAt > RUN_GRACE_MS) break;
      await new Promise((r) => setTimeout(r, 250));
    }

    // 1. Every chain is gapless and never negative, and every currency balances: credited = available + escrow
    //    (+ 0 paid out, as this service has no payouts).
    const postings = await runtime.stores.ledger.postings.find({}).toArray();
    const byAccount = new Map<string, typeof postings>();
    for (const p of postings) byAccount.set(p.account, [...(byAccount.get(p.account) ?? []), p]);
    for (const [account, chain] of byAccount) {
      chain.sort((a, b) => a.seq - b.seq);
      let running = 0;
      chain.forEach((p, i) => {
        running += p.delta;
        expect(p.seq, account).toBe(i + 1);
        expect(p.balanceAfter, account).toBe(running);
        expect(p.balanceAfter).toBeGreaterThanOrEqual(0);
      });
    }
    const balances = new Map<string, Awaited<ReturnType<typeof runtime.stores.ledger.balances>>>();
    for (const wallet of [...payers, ...payees]) balances.set(wallet, await runtime.stores.ledger.balances(wallet));
    for (const currency of CURRENCIES) {
      let held = 0;
      for (const b of balances.values()) held += (b[currency]?.available ?? 0) + (b[currency]?.escrow ?? 0);
      expect(held, `${currency} balances`).toBe(credited[currency]);
    }
    expect(await runtime.stores.ledger.entries.countDocuments({ state: 'pending' })).toBe(0);
    const legs = new Set(postings.map((p) => `${p.entryId}#${p.leg}`));
    expect(legs.size).toBe(postings.length);

    // 2. Each settlement's money happened exactly once: released + refunded + still in escrow = amount, and every
    //    wallet holds exactly what its settlements say.
    const all = await runtime.stores.settlements.settlements.find({ tenantId }).toArray();
    expect(all.length).toBe(settled.length);
    const views = await Promise.all(
      all.map((s) => readSettlement(runtime.stores.settlements, runtime.stores.ledger, s)),
    );
    // A read looks only at what the settlement's state involves: it sees what reading every fact and every entry it
    // might have sees, in every state these runs reached.
    const now = new Date();
    for (const { doc } of views) {
      const lean = await readSettlement(runtime.stores.settlements, runtime.stores.ledger, doc, now);
      const facts = await runtime.stores.settlements.factsOf(doc._id);
      const applied = await runtime.stores.ledger.appliedAmong(candidateEntries(doc, facts));
      expect({ facts: lean.facts, view: lean.view }, doc._id).toEqual({
        facts,
        view: deriveSettlement(termsOf(doc), facts, applied, now),
      });
    }
    expect(new Set(views.map((v) => `${v.view.status}/${v.view.holdbackState}`)).size).toBeGreaterThanOrEqual(5);
    const outstanding = ({ view, doc }: (typeof views)[number]) =>
      view.status === 'held' || view.status === 'pending'
        ? doc.amount
        : ['held', 'frozen', 'resolving', 'releasing'].includes(view.holdbackState)
          ? view.holdback
          : 0;
    const escrowByPayer = new Map<string, number>();
    const receivedByPayee = new Map<string, number>();
    for (const st of views) {
      const { doc, view } = st;
      expect(view.status, doc._id).not.toBe('pending');
      expect(['resolving', 'releasing']).not.toContain(view.holdbackState);
      expect(
        view.releasedAmount + view.refundedAmount + outstanding(st),
        `${doc._id} ${view.status}/${view.holdbackState}`,
      ).toBe(doc.amount);
      escrowByPayer.set(
        `${doc.payerWalletId}|${doc.currency}`,
        (escrowByPayer.get(`${doc.payerWalletId}|${doc.currency}`) ?? 0) + outstanding(st),
      );
      receivedByPayee.set(
        `${doc.payeeWalletId}|${doc.currency}`,
        (receivedByPayee.get(`${doc.payeeWalletId}|${doc.currency}`) ?? 0) + view.releasedAmount,
      );
      if (view.holdbackState === 'held') expect(doc.disputeWindowSeconds).toBe(3_600);
    }
    for (const currency of CURRENCIES) {
      for (const payee of payees)
        expect(balances.get(payee)![currency]?.available ?? 0, `${payee} received`).toBe(
          receivedByPayee.get(`${payee}|${currency}`) ?? 0,
        );
      for (const payer of payers)
        expect(balances.get(payer)![currency]?.escrow ?? 0, `${payer} escrow`).toBe(
          escrowByPayer.get(`${payer}|${currency}`) ?? 0,
        );
    }

    // 3. Every event was emitted once: one id per cause, and one decision event per settlement.
    const events = await runtime.stores.outbox.events.find({ tenantId }).toArray();
    expect(new Set(events.map((e) => e._id)).size).toBe(events.length);
    const decisions = events.filter((e) => e.type === 'settlement.completed' || e.type === 'settlement.held');
    const perSettlement = new Map<string, number>();
    for (const e of decisions)
      perSettlement.set(String(e.data.settlementId), (perSettlement.get(String(e.data.settlementId)) ?? 0) + 1);
    for (const { doc, facts } of views) {
      const heldThenReleased = facts.heldRuling?.outcome === 'release';
      expect(perSettlement.get(doc._id), doc._id).toBe(heldThenReleased ? 2 : 1);
    }
    expect(refused).toBeLessThan(RUNS);
  }, 900_000); // about a minute alone on 2 cores; generous for a loaded CI machine
});
