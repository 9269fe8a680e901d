import { recorded } from '../domain/money.ts';
import type { Collection, Db } from 'mongodb';
import type { RedisClient } from '../redis.ts';
import { sha256Hex } from '../domain/crypto.ts';
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
import { ownerOf } from '../queues/index.ts';
import { DueWorkStore, type DuePartitions } from './due-work.ts';
import type { LedgerStore } from './ledger.ts';
import { ListIndex, type ListEntry } from './list-index.ts';
import { insertFirst } from './mongo.ts';

/**
 * The settlement record: fixed terms written once. Its state is the facts (below) and the ledger, worked out at every
 * read (records stored before this carry a `view` field: a cache nothing reads, no longer written).
 */
export interface SettlementDoc extends Omit<SettlementTerms, 'settlementId'> {
  _id: string;
  tenantId: string;
  /**
   * Set when the settlement pays for an x402 gate instead of a run; `runId` then holds the gate id too, so the
   * unique index on runId keeps one settlement per subject. Its decision is claimed by the x402-verify worker.
   */
  gateId?: string;
  /** Set when the settlement pays a payee of an x402 payment session (`runId` then holds the settlement id). */
  sessionId?: string;
  /** A gate's settlement: the run the gate pays for, when it was created for one (events name it). */
  gateRunId?: string | null;
  /** Test traffic (a test gate's settlement): its events are marked `test` (see OutboxEventDoc.test). */
  test?: boolean;
  createdAt: Date;
}

/** Which settlement a dispute belongs to, recorded before the dispute is claimed (disputes are found by their id). */
export interface DisputeRefDoc {
  _id: string;
  settlementId: string;
  /** When the dispute was opened (refs recorded before the lists existed have none). */
  createdAt?: Date;
}

/**
 * What a settlement's work is routed by (its settle jobs' owner, `tenantId/runId`), so its due record sits in the
 * partition of its jobs (store/due-work.ts).
 */
export function settlementOwner(s: Pick<SettlementDoc, 'tenantId' | 'runId'>): string {
  return ownerOf('settle', { tenantId: s.tenantId, runId: s.runId, settlementId: '' });
}

/** One settlement per run, under an id derived from the run, so the settlement of a run is an id lookup. */
export function settlementIdFor(runId: string): string {
  return `stl_${sha256Hex(`settlement:${runId}`).slice(0, 32)}`;
}

type FactKind = keyof SettlementFacts;
interface FactDoc {
  _id: string;
  settlementId: string;
  kind: FactKind;
  data: unknown;
  at: Date;
}

export function settlementListEntry(
  s: Pick<SettlementDoc, '_id' | 'tenantId' | 'createdAt' | 'payerWalletId' | 'payeeWalletId'>,
): ListEntry {
  // A party's wallet id is its agent id (sponsor wallets are named otherwise and simply match no agent filter).
  return {
    kind: 'settlements',
    id: s._id,
    tenantId: s.tenantId,
    at: s.createdAt,
    agentIds: [s.payerWalletId, s.payeeWalletId],
  };
}

export class SettlementStore {
  readonly settlements: Collection<SettlementDoc>;
  readonly facts: Collection<FactDoc>;
  readonly disputeRefs: Collection<DisputeRefDoc>;
  /** Settlements with a step still to come (see DueWorkStore); removed once final. */
  readonly due: DueWorkStore;
  /** The settlement and dispute lists (see list-index.ts): entered before the document is stored. */
  readonly listed: ListIndex;

  constructor(db: Db, redis: RedisClient, redisPrefix: string, listed: ListIndex, partitions?: DuePartitions) {
    this.listed = listed;
    this.settlements = db.collection<SettlementDoc>('settlements');
    this.facts = db.collection<FactDoc>('settlement_facts');
    this.disputeRefs = db.collection<DisputeRefDoc>('dispute_refs');
    this.due = new DueWorkStore(db, 'settlements', redis, redisPrefix, { partitions });
  }

  /** One settlement per run (its id derives from the run): a repeat or a racing duplicate gets the existing one. */
  async createOrGet(input: Omit<SettlementDoc, '_id' | 'createdAt'>): Promise<SettlementDoc> {
    const _id = settlementIdFor(input.runId);
    const existing = await this.get(_id);
    if (existing) return existing;
    const doc: SettlementDoc = {
      ...input,
      _id,
      createdAt: new Date(),
    };
    await this.due.mark(_id, input.tenantId, new Date(), settlementOwner(input)); // due before it exists: a crash leaves it findable
    await this.listed.add(settlementListEntry(doc));
    return (await insertFirst(this.settlements, doc)) ? doc : recorded(await this.get(_id), `settlement ${_id}`);
  }

  /**
   * The settlement of an x402 gate, under an id derived from the gate (found by `_id`, never by a scan). It is not
   * due for the sweeper until its decision is recorded: advanceSettlement schedules it from then on.
   */
  async createForGate(
    settlementId: string,
    input: Omit<SettlementDoc, '_id' | 'createdAt' | 'runId'> & { gateId: string },
  ): Promise<SettlementDoc> {
    const doc: SettlementDoc = {
      ...input,
      _id: settlementId,
      runId: input.gateId,
      createdAt: new Date(),
    };
    await this.listed.add(settlementListEntry(doc));
    return (await insertFirst(this.settlements, doc))
      ? doc
      : recorded(await this.get(settlementId), `settlement ${settlementId}`);
  }

  /**
   * The settlement of a payee of a closed x402 payment session, under an id derived from the session and the payee.
   * Its decision is claimed by the close right after; advanceSettlement schedules it from then on.
   */
  async createForSession(
    settlementId: string,
    input: Omit<SettlementDoc, '_id' | 'createdAt' | 'runId'> & { sessionId: string },
  ): Promise<SettlementDoc> {
    const doc: SettlementDoc = {
      ...input,
      _id: settlementId,
      runId: settlementId,
      createdAt: new Date(),
    };
    await this.listed.add(settlementListEntry(doc));
    return (await insertFirst(this.settlements, doc))
      ? doc
      : recorded(await this.get(settlementId), `settlement ${settlementId}`);
  }

  get(settlementId: string): Promise<SettlementDoc | null> {
    return this.settlements.findOne({ _id: settlementId });
  }

  byRun(runId: string): Promise<SettlementDoc | null> {
    return this.get(settlementIdFor(runId));
  }

  /**
   * Records a fact once: the first writer wins, everyone gets the winning fact back. This is the only way a
   * settlement changes, and it rests on a unique insert, never on an update.
   */
  async claim(
    settlementId: string,
    kind: 'decision',
    data: DecisionFact,
  ): Promise<{ won: boolean; fact: DecisionFact }>;
  async claim(
    settlementId: string,
    kind: 'holdback',
    data: HoldbackFact,
  ): Promise<{ won: boolean; fact: HoldbackFact }>;
  async claim(settlementId: string, kind: 'ruling', data: RulingFact): Promise<{ won: boolean; fact: RulingFact }>;
  async claim(
    settlementId: string,
    kind: 'heldRuling',
    data: HeldRulingFact,
  ): Promise<{ won: boolean; fact: HeldRulingFact }>;
  async claim(settlementId: string, kind: FactKind, data: unknown): Promise<{ won: boolean; fact: unknown }> {
    const _id = `${settlementId}:${kind}`;
    if (await insertFirst(this.facts, { _id, settlementId, kind, data, at: new Date() }))
      return { won: true, fact: data };
    const winner = await this.facts.findOne({ _id });
    return { won: false, fact: recorded(winner, `settlement fact ${_id}`).data };
  }

  /**
   * Claims the settlement's decision: whether this claim won, and the facts as they then stand. A winner's are the
   * decision alone, read from nothing (every other fact needs the decision first); a loser reads them all.
   */
  async claimDecision(
    settlementId: string,
    decision: DecisionFact,
  ): Promise<{ won: boolean; facts: SettlementFacts & { decision: DecisionFact } }> {
    const claimed = await this.claim(settlementId, 'decision', decision);
    const others = claimed.won ? {} : await this.factsOf(settlementId);
    return { won: claimed.won, facts: { ...others, decision: claimed.fact } };
  }

  async factsOf(settlementId: string): Promise<SettlementFacts> {
    return this.factsAmong(settlementId, ['decision', 'holdback', 'ruling', 'heldRuling']);
  }

  /** Those of the settlement's facts of these kinds that exist. */
  async factsAmong(settlementId: string, kinds: readonly FactKind[]): Promise<SettlementFacts> {
    // Fact ids are known, and on FerretDB an id lookup is far cheaper than any other filter.
    const docs = await Promise.all(kinds.map((kind) => this.facts.findOne({ _id: `${settlementId}:${kind}` })));
    return Object.fromEntries(docs.filter((d) => d !== null).map((d) => [d!.kind, d!.data])) as SettlementFacts;
  }

  /** Records which settlement a dispute id belongs to; done before the dispute itself is claimed. */
  async referDispute(disputeId: string, s: SettlementDoc, at = new Date()): Promise<void> {
    await this.listed.add({ ...settlementListEntry(s), kind: 'disputes', id: disputeId, at });
    await insertFirst(this.disputeRefs, { _id: disputeId, settlementId: s._id, createdAt: at });
  }

  /** The settlement a dispute id was opened on (a reference whose claim lost belongs to no dispute: null). */
  disputeRef(disputeId: string): Promise<DisputeRefDoc | null> {
    return this.disputeRefs.findOne({ _id: disputeId });
  }

  async byDispute(disputeId: string): Promise<SettlementDoc | null> {
    const ref = await this.disputeRefs.findOne({ _id: disputeId });
    return ref ? this.get(ref.settlementId) : null;
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
export function candidateEntries(s: SettlementDoc, facts: SettlementFacts): string[] {
  const ids = [
    entryIds.release(s._id),
    entryIds.holdback(s._id),
    entryIds.held(s._id, 'release'),
    entryIds.held(s._id, 'refund'),
  ];
  if (facts.holdback?.fate === 'dispute')
    ids.push(entryIds.disputeToPayer(facts.holdback.disputeId), entryIds.disputeToPayee(facts.holdback.disputeId));
  return ids;
}

/**
 * The settlement as it stands: its facts and applied entries, folded into what a client sees. Read in the order its
 * facts can come about (a decision before any other fact; a holdback's fate and a ruling only after a pass, a held
 * ruling only after a fail; a dispute's entries only after its ruling), so a read costs what the settlement's state
 * involves: 2 lookups while pending, 4-5 once decided, instead of every fact and entry it might ever have (8).
 */
export async function readSettlement(
  settlements: SettlementStore,
  ledger: LedgerStore,
  s: SettlementDoc,
  now = new Date(),
): Promise<SettlementState> {
  const release = entryIds.release(s._id);
  const [{ decision }, releaseApplied] = await Promise.all([
    settlements.factsAmong(s._id, ['decision']),
    ledger.appliedAmong([release]),
  ]);
  const applied = new Set(releaseApplied);
  let facts: SettlementFacts = {};
  if (decision?.verdict === 'fail') {
    const held = [entryIds.held(s._id, 'release'), entryIds.held(s._id, 'refund')];
    const [later, heldApplied] = await Promise.all([
      settlements.factsAmong(s._id, ['heldRuling']),
      ledger.appliedAmong(held),
    ]);
    facts = { decision, ...later };
    for (const id of heldApplied) applied.add(id);
  } else if (decision) {
    const holdback = decision.holdback > 0 ? [entryIds.holdback(s._id)] : [];
    const [later, holdbackApplied] = await Promise.all([
      settlements.factsAmong(s._id, ['holdback', 'ruling']),
      ledger.appliedAmong(holdback),
    ]);
    facts = { decision, ...later };
    for (const id of holdbackApplied) applied.add(id);
    if (facts.holdback?.fate === 'dispute' && facts.ruling) {
      const dispute = facts.holdback.disputeId;
      for (const id of await ledger.appliedAmong([entryIds.disputeToPayer(dispute), entryIds.disputeToPayee(dispute)]))
        applied.add(id);
    }
  }
  return { doc: s, facts, view: deriveSettlement(termsOf(s), facts, applied, now) };
}

/** The same, from facts and applied entries the caller already holds (the settle worker, after applying them). */
export function settlementState(
  s: SettlementDoc,
  facts: SettlementFacts,
  applied: ReadonlySet<string>,
  now = new Date(),
): SettlementState {
  return { doc: s, facts, view: deriveSettlement(termsOf(s), facts, applied, now) };
}
