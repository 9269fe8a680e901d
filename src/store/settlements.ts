import type { Collection, Db } from 'mongodb';
import { newId } from '../domain/crypto.ts';
import type {
  DecisionFact,
  HeldRulingFact,
  HoldbackFact,
  RulingFact,
  SettlementFacts,
  SettlementTerms,
  SettlementView,
} from '../domain/settlement.ts';
import { deriveSettlement, entryIds } from '../domain/settlement.ts';
import type { LedgerStore } from './ledger.ts';
import { insertFirst } from './mongo.ts';

/**
 * The settlement record: fixed terms written once, plus a cached view of its state. The cache only steers the
 * sweeper and list queries; the truth is the facts (below) and the ledger, so a lost cache update changes nothing.
 */
export interface SettlementDoc extends Omit<SettlementTerms, 'settlementId'> {
  _id: string;
  tenantId: string;
  /**
   * Set when the settlement pays for an x402 gate instead of a run; `runId` then holds the gate id too, so the
   * unique index on runId keeps one settlement per subject. Its decision is claimed by the x402-verify worker.
   */
  gateId?: string;
  createdAt: Date;
  view: SettlementView;
  /** When the sweeper should look at it again (a cache; see SettlementStore.due). */
  nextCheckAt: Date | null;
}

type FactKind = keyof SettlementFacts;
interface FactDoc {
  _id: string;
  settlementId: string;
  kind: FactKind;
  data: unknown;
  at: Date;
}

export class SettlementStore {
  readonly settlements: Collection<SettlementDoc>;
  readonly facts: Collection<FactDoc>;

  constructor(db: Db) {
    this.settlements = db.collection<SettlementDoc>('settlements');
    this.facts = db.collection<FactDoc>('settlement_facts');
  }

  /** One settlement per run (unique runId): a repeat or a racing duplicate gets the existing one. */
  async createOrGet(input: Omit<SettlementDoc, '_id' | 'createdAt' | 'view' | 'nextCheckAt'>): Promise<SettlementDoc> {
    const existing = await this.byRun(input.runId);
    if (existing) return existing;
    const doc: SettlementDoc = {
      ...input,
      _id: newId('stl'),
      createdAt: new Date(),
      view: { status: 'pending', holdbackState: 'none', holdback: 0, releasedAmount: 0, refundedAmount: 0, disputeWindowEndsAt: null, final: false },
      nextCheckAt: new Date(),
    };
    return (await insertFirst(this.settlements, doc)) ? doc : (await this.byRun(input.runId))!;
  }

  /**
   * The settlement of an x402 gate, under an id derived from the gate (found by `_id`, never by a scan). It is not
   * due for the sweeper until its decision is recorded: advanceSettlement schedules it from then on.
   */
  async createForGate(settlementId: string, input: Omit<SettlementDoc, '_id' | 'createdAt' | 'view' | 'nextCheckAt' | 'runId'> & { gateId: string }): Promise<SettlementDoc> {
    const doc: SettlementDoc = {
      ...input,
      _id: settlementId,
      runId: input.gateId,
      createdAt: new Date(),
      view: { status: 'pending', holdbackState: 'none', holdback: 0, releasedAmount: 0, refundedAmount: 0, disputeWindowEndsAt: null, final: false },
      nextCheckAt: null,
    };
    return (await insertFirst(this.settlements, doc)) ? doc : (await this.get(settlementId))!;
  }

  get(settlementId: string): Promise<SettlementDoc | null> {
    return this.settlements.findOne({ _id: settlementId });
  }

  byRun(runId: string): Promise<SettlementDoc | null> {
    return this.settlements.findOne({ runId });
  }

  /**
   * Records a fact once: the first writer wins, everyone gets the winning fact back. This is the only way a
   * settlement changes, and it rests on a unique insert, never on an update.
   */
  async claim(settlementId: string, kind: 'decision', data: DecisionFact): Promise<{ won: boolean; fact: DecisionFact }>;
  async claim(settlementId: string, kind: 'holdback', data: HoldbackFact): Promise<{ won: boolean; fact: HoldbackFact }>;
  async claim(settlementId: string, kind: 'ruling', data: RulingFact): Promise<{ won: boolean; fact: RulingFact }>;
  async claim(settlementId: string, kind: 'heldRuling', data: HeldRulingFact): Promise<{ won: boolean; fact: HeldRulingFact }>;
  async claim(settlementId: string, kind: FactKind, data: unknown): Promise<{ won: boolean; fact: unknown }> {
    const _id = `${settlementId}:${kind}`;
    if (await insertFirst(this.facts, { _id, settlementId, kind, data, at: new Date() })) return { won: true, fact: data };
    const winner = await this.facts.findOne({ _id });
    return { won: false, fact: winner!.data };
  }

  async factsOf(settlementId: string): Promise<SettlementFacts> {
    // Fact ids are known, and on FerretDB an id lookup is far cheaper than any other filter.
    const kinds: FactKind[] = ['decision', 'holdback', 'ruling', 'heldRuling'];
    const docs = await Promise.all(kinds.map((kind) => this.facts.findOne({ _id: `${settlementId}:${kind}` })));
    return Object.fromEntries(docs.filter((d) => d !== null).map((d) => [d!.kind, d!.data])) as SettlementFacts;
  }

  /** Settlement whose dispute has this id (the holdback fact names it). */
  async byDispute(disputeId: string): Promise<SettlementDoc | null> {
    const fact = await this.facts.findOne({ kind: 'holdback', 'data.disputeId': disputeId });
    return fact ? this.get(fact.settlementId) : null;
  }

  /** Best-effort cache of the derived view; losing this write only means the next read derives it again. */
  async cacheView(settlementId: string, view: SettlementView, nextCheckAt: Date | null): Promise<void> {
    await this.settlements.updateOne({ _id: settlementId }, { $set: { view, nextCheckAt } });
  }

  /** Settlements the sweeper should advance now (not final, and due by their cached next check). */
  due(now: Date, limit: number): Promise<SettlementDoc[]> {
    return this.settlements.find({ nextCheckAt: { $ne: null, $lte: now } }).sort({ nextCheckAt: 1 }).limit(limit).toArray();
  }
}

export interface SettlementState {
  doc: SettlementDoc;
  facts: SettlementFacts;
  view: SettlementView;
}

export function termsOf(s: SettlementDoc): SettlementTerms {
  return {
    settlementId: s._id,
    runId: s.runId,
    payerWalletId: s.payerWalletId,
    payeeWalletId: s.payeeWalletId,
    amount: s.amount,
    currency: s.currency,
    holdbackBps: s.holdbackBps,
    disputeWindowSeconds: s.disputeWindowSeconds,
  };
}

/** Every ledger entry a settlement can ever use. */
function candidateEntries(s: SettlementDoc, facts: SettlementFacts): string[] {
  const ids = [entryIds.release(s._id), entryIds.holdback(s._id), entryIds.held(s._id, 'release'), entryIds.held(s._id, 'refund')];
  if (facts.holdback?.fate === 'dispute') ids.push(entryIds.disputeToPayer(facts.holdback.disputeId), entryIds.disputeToPayee(facts.holdback.disputeId));
  return ids;
}

/** The settlement as it stands: its facts and applied entries, folded into what a client sees. */
export async function readSettlement(settlements: SettlementStore, ledger: LedgerStore, s: SettlementDoc, now = new Date()): Promise<SettlementState> {
  const facts = await settlements.factsOf(s._id);
  const applied = await ledger.appliedAmong(candidateEntries(s, facts));
  return { doc: s, facts, view: deriveSettlement(termsOf(s), facts, applied, now) };
}

/** The same, from facts and applied entries the caller already holds (the settle worker, after applying them). */
export function settlementState(s: SettlementDoc, facts: SettlementFacts, applied: ReadonlySet<string>, now = new Date()): SettlementState {
  return { doc: s, facts, view: deriveSettlement(termsOf(s), facts, applied, now) };
}
