// What must hold after any fault, read straight from the database the service wrote: every run finalized once,
// every settlement decided once (one decision fact, one settlement event, ledger legs posted once), nothing left
// pending, and every currency balanced (total credited = available + escrow + paid out; this service pays nothing
// out, so paid out is 0).
import { MongoClient, type Db } from 'mongodb';
import { expect } from 'vitest';
import { deriveSettlement, type SettlementFacts } from '../../src/domain/settlement.ts';
import { termsOf, type SettlementDoc } from '../../src/store/settlements.ts';

export interface AuditResult {
  runs: number;
  verdicts: { pass: number; fail: number };
  settlements: Record<string, number>;
  outboxEvents: Array<{ _id: string; type: string }>;
  credited: Record<string, number>;
  held: Record<string, number>;
}

/**
 * Each settlement's status as the service works it out (its facts and the ledger entries applied), read straight
 * from the collections: a settlement record holds its terms only.
 */
export async function settlementStatuses(db: Db): Promise<Map<string, string>> {
  const [settlements, facts, entries] = await Promise.all([
    db.collection<SettlementDoc>('settlements').find({}).toArray(),
    db.collection<FactRecord>('settlement_facts').find({}).toArray(),
    db.collection<EntryRecord>('ledger_entries').find({ state: 'applied' }).toArray(),
  ]);
  return statusesOf(settlements, facts, entries);
}

type FactRecord = { settlementId: string; kind: keyof SettlementFacts; data: unknown };
type EntryRecord = { entryId: string; state: string };

/** The same, from records already read (entries in any state: only the applied ones count). */
function statusesOf(settlements: SettlementDoc[], facts: FactRecord[], entries: EntryRecord[]): Map<string, string> {
  const factsOf = new Map<string, SettlementFacts>();
  for (const f of facts) factsOf.set(f.settlementId, { ...factsOf.get(f.settlementId), [f.kind]: f.data });
  const applied = new Set(entries.filter((e) => e.state === 'applied').map((e) => e.entryId));
  const now = new Date();
  return new Map(
    settlements.map((s) => [s._id, deriveSettlement(termsOf(s), factsOf.get(s._id) ?? {}, applied, now).status]),
  );
}

export async function auditDatabase(mongoUrl: string, runIds: string[]): Promise<AuditResult> {
  const client = new MongoClient(mongoUrl, { serverSelectionTimeoutMS: 10_000 });
  try {
    const db = client.db();
    const runs = await db.collection<any>('runs').find({}).toArray();
    const byId = new Map(runs.map((r) => [r._id, r]));
    const verdicts = { pass: 0, fail: 0 };
    for (const runId of runIds) {
      const run = byId.get(runId);
      expect(run?.status, `run ${runId}`).toBe('finalized');
      verdicts[run.verdict as 'pass' | 'fail']++;
    }
    // One artifact per run.
    const artifacts = await db.collection<any>('artifacts').find({}).toArray();
    for (const runId of runIds)
      expect(
        artifacts.filter((a) => a.runId === runId),
        `artifacts of ${runId}`,
      ).toHaveLength(1);

    // Settlements: one per run, each decided once, none pending.
    const settlements = await db.collection<any>('settlements').find({}).toArray();
    const facts = await db.collection<any>('settlement_facts').find({}).toArray();
    const entries = await db.collection<any>('ledger_entries').find({}).toArray();
    const statusCount: Record<string, number> = {};
    for (const runId of runIds) {
      const mine = settlements.filter((s) => s.runId === runId);
      expect(mine, `settlements of ${runId}`).toHaveLength(1);
      const decisions = facts.filter((f) => f.kind === 'decision' && f.settlementId === mine[0]._id);
      expect(decisions, `decisions of ${runId}`).toHaveLength(1);
    }
    for (const status of statusesOf(settlements, facts, entries).values())
      statusCount[status] = (statusCount[status] ?? 0) + 1;
    expect(statusCount.pending ?? 0, 'settlements still pending').toBe(0);

    // Outbox: exactly one run.finalized per run and one settlement.completed|held per settlement.
    const outbox = await db.collection<any>('outbox_events').find({}).toArray();
    for (const runId of runIds) {
      expect(
        outbox.filter((e) => e.type === 'run.finalized' && e.data.runId === runId),
        `run.finalized of ${runId}`,
      ).toHaveLength(1);
    }
    for (const s of settlements) {
      expect(
        outbox.filter((e) => e.type.startsWith('settlement.') && e.data.settlementId === s._id),
        `settlement events of ${s._id}`,
      ).toHaveLength(1);
    }

    // Ledger: nothing pending, every leg posted once, every chain gapless and never negative, every currency balanced.
    expect(
      entries.filter((e) => e.state === 'pending'),
      'pending ledger entries',
    ).toHaveLength(0);
    const postings = await db.collection<any>('ledger_postings').find({}).toArray();
    expect(new Set(postings.map((p) => `${p.entryId}#${p.leg}`)).size, 'each leg posted once').toBe(postings.length);
    const chains = new Map<string, any[]>();
    for (const p of postings) chains.set(p.account, [...(chains.get(p.account) ?? []), p]);
    const held: Record<string, number> = {};
    for (const [account, chain] of chains) {
      chain.sort((a, b) => a.seq - b.seq);
      let running = 0;
      chain.forEach((p, i) => {
        running += p.delta;
        expect(p.seq, account).toBe(i + 1);
        expect(p.balanceAfter, account).toBe(running);
        expect(p.balanceAfter, account).toBeGreaterThanOrEqual(0);
      });
      held[chain[0].currency] = (held[chain[0].currency] ?? 0) + running;
    }
    const credited: Record<string, number> = {};
    for (const e of entries.filter((x) => x.kind === 'credit' && x.state === 'applied')) {
      credited[e.currency] =
        (credited[e.currency] ?? 0) + e.legs.reduce((sum: number, l: { delta: number }) => sum + l.delta, 0);
    }
    expect(held, 'available + escrow per currency = credited').toEqual(credited);

    // Nothing left behind: no run waiting in the finalize due list, and no settlement overdue in its due list (a
    // held or completed settlement stays listed until its ruling or its window's end, which is in the future).
    const finalizeDue = await db.collection<any>('due_finalize').find({}).toArray();
    expect(
      finalizeDue.filter((d) => runIds.includes(d._id)),
      'runs left finalizing',
    ).toEqual([]);
    const settleDue = await db.collection<any>('due_settlements').find({}).toArray();
    expect(
      settleDue.filter((d) => d.dueAt.getTime() < Date.now() - 10_000),
      'overdue settlements',
    ).toEqual([]);
    return {
      runs: runIds.length,
      verdicts,
      settlements: statusCount,
      outboxEvents: outbox.map((e) => ({ _id: e._id, type: e.type })),
      credited,
      held,
    };
  } finally {
    await client.close();
  }
}

/** Waits until every run's run.finalized is in the outbox: one whose emit failed in the outage is owed by the sweeper. */
export async function eventuallyAnnounced(mongoUrl: string, runIds: string[], timeoutMs: number): Promise<void> {
  const client = new MongoClient(mongoUrl, { serverSelectionTimeoutMS: 10_000 });
  try {
    const outbox = client.db().collection<any>('outbox_events');
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const announced = new Set((await outbox.find({ type: 'run.finalized' }).toArray()).map((e) => e.data.runId));
      if (runIds.every((id) => announced.has(id))) return;
      if (Date.now() > deadline) return; // the audit names what is missing
      await new Promise((r) => setTimeout(r, 250));
    }
  } finally {
    await client.close();
  }
}
