import { recorded } from '../domain/money.ts';
import type { Collection, Db, Document, OptionalUnlessRequiredId } from 'mongodb';
import type { PolicyBreach, VerificationOutcome, WalletPolicy } from '../domain/x402.ts';
import type { RedisClient } from '../redis.ts';
import { DueWorkStore, type DuePartitions } from './due-work.ts';
import type { ReportedHead } from './ledger.ts';
import { ListIndex } from './list-index.ts';
import { insertFirst, insertInOrder } from './mongo.ts';
import type { SettlementDoc } from './settlements.ts';

// The x402 gate's records. Every one is found by `_id` (on FerretDB nothing else uses an index), and every fact is
// recorded by a unique insert; the one kind of updated document (chain heads) is a cache.

export interface GateDoc {
  _id: string;
  tenantId: string;
  payerAgentId: string;
  payeeAgentId: string;
  /** Whose escrow holds the amount: the sponsor wallet when there is one (the sponsor pays), else the payer's. */
  escrowWalletId: string;
  sponsorWalletId: string | null;
  toolId: string | null;
  amount: number;
  currency: string;
  holdbackBps: number;
  disputeWindowSeconds: number;
  /** The run this payment is for, when the gate was created for one (events name it beside the gate). Absent on old records. */
  runId?: string | null;
  /** Test traffic: its events are marked and delivered only to endpoints that include test events. Absent on old records. */
  test?: boolean;
  createdAt: Date;
}

export interface QuoteDoc {
  _id: string;
  tenantId: string;
  gateId: string;
  /** Its position in the gate's quote chain; only the last position is current. */
  slot: number;
  requestSha256: string;
  quoteSha256: string;
  ttlSeconds: number;
  createdAt: Date;
  expiresAt: Date;
}

/** A position in a chain `<key>#<seq>`: the gate's quotes, an agent's gates, a tenant's escalations. */
export interface SlotDoc extends Document {
  _id: string;
  ref: string;
}

/**
 * What a gate's escrow is committed to, first writer wins (`_id` = gateId): a payment authorization, a
 * cancellation by wind-down, voiding by a failed verification, or expiry (the sweeper, past the held gate's
 * deadline). So a wind-down, an expiry and an authorization racing on one gate can never both happen.
 */
export type CommitmentDoc = {
  _id: string;
  tenantId: string;
  at: Date;
} & (
  | {
      kind: 'authorization';
      authorizationRef: string;
      quoteId: string;
      requestSha256: string;
      token: string;
      tokenKid: string;
      jti: string;
      expiresAt: Date;
      escalationId: string | null;
    }
  | { kind: 'cancellation'; windDownOf: string }
  | { kind: 'voided' }
  | { kind: 'expired' }
);

/**
 * The gate's one verification slot (`_id` = gateId), first writer wins: the provider's report, or the gate's return
 * (`expired`, `wound_down`: no report may come any more; evidence null). Whatever wins is what the settlement decides.
 */
export interface VerificationDoc {
  _id: string;
  tenantId: string;
  verificationStatus: VerificationOutcome;
  evidence: { responseSha256: string | null; providerSignature: string | null };
  /** What a verified call cost (metered capture, at most the gate's amount); absent: the whole amount. */
  captured?: number;
  at: Date;
  /**
   * Not a fact, a hint: the reporting process's heads of the payer's accounts (its lock posts there), which the
   * verify job learns instead of reading past its own (see LedgerStore.learnReportedHeads).
   */
  ledgerHeads?: ReportedHead[];
  /**
   * Copies of the gate and the commitment the report was made against (facts that never change, so the copies are
   * the facts) and of the gate's settlement as the reporting request stored it before the report (its terms, which
   * never change): the verify job takes them from here instead of reading each. A return recorded by
   * a sweeper has none.
   */
  against?: { gate: GateDoc; commitment: CommitmentDoc; settlement?: SettlementDoc };
}

export interface WindDownDoc {
  _id: string;
  tenantId: string;
  reasonCode: string | null;
  reasonMessage: string | null;
  at: Date;
}

export interface WindDownSummary {
  agentId: string;
  status: 'wound_down';
  reasonCode: string | null;
  reasonMessage: string | null;
  woundDownAt: string;
  gatesCancelled: string[];
  gatesLeftReserved: string[];
  quotesCancelled: string[];
  escalationsDenied: string[];
  /** Payment sessions the agent paid or was paid by, closed by this wind-down (absent in summaries made before sessions). */
  sessionsClosed?: string[];
  escrowReturned: Array<{ walletId: string; currency: string; amount: number }>;
}

export interface PolicyVersionDoc {
  _id: string;
  tenantId: string;
  walletId: string;
  version: number;
  policy: WalletPolicy;
  at: Date;
}

/** One authorized spend on a wallet's UTC day: position `<wallet>#<day>#<seq>`, carrying the day's running total. */
export interface SpendDoc extends Document {
  _id: string;
  ref: string;
  /** wallet#gate#quote: unique, so one decision is counted once whatever races happen. */
  decisionKey: string;
  amount: number;
  total: number;
  at: Date;
}

export interface WalletDecisionDoc {
  _id: string;
  tenantId: string;
  token: string;
  expiresAt: Date;
  at: Date;
}

export interface EscalationDoc {
  _id: string;
  tenantId: string;
  gateId: string;
  quoteId: string;
  requestSha256: string;
  walletId: string;
  payerAgentId: string;
  payeeAgentId: string;
  amount: number;
  currency: string;
  breach: PolicyBreach;
  createdAt: Date;
  /** When it is denied by itself if nobody decided (absent on escalations raised before deadlines: the default). */
  deadlineAt?: Date;
}

/** Who decided an escalation, as events and views name them: the API key id, `admin`, `deadline`, `wind-down:<agent>`. */
export type Decider =
  | { kind: 'tenant' }
  | { kind: 'api-key'; keyId: string }
  | { kind: 'admin' }
  | { kind: 'deadline' }
  | { kind: 'wind-down'; agentId: string };

export interface ResolutionDoc {
  _id: string;
  action: 'approve' | 'deny';
  reason: string | null;
  /** Who resolved it (`tenant`: an escalation resolved before deciders were recorded). */
  by: Decider;
  at: Date;
}

export interface OverrideUseDoc {
  _id: string;
  gateId: string;
  at: Date;
}

function remember<T extends { _id: string }>(known: Map<string, T>, doc: T): void {
  if (known.size >= IMMUTABLE_CACHE_LIMIT) known.clear();
  known.set(doc._id, doc);
}

/** Thrown by `SlotChain.append` when the insert collided on a unique key other than the position. */
export class OtherKeyTaken extends Error {}

const HEAD_CACHE_LIMIT = 50_000;
const IMMUTABLE_CACHE_LIMIT = 50_000;
const HEAD_WRITE_EVERY = 16;

/** Appends one ordered insert carries at most (group commit, see SlotChain). */
const MAX_GROUP_APPENDS = 64;

type RecordBuilder<T> = (seq: number, previous: T | null) => Promise<Omit<T, '_id'> | null> | Omit<T, '_id'> | null;

interface WaitingAppend<T> {
  build: RecordBuilder<T>;
  resolve: (doc: T | null) => void;
  reject: (err: unknown) => void;
}

/**
 * A chain of positions `<key>#1, <key>#2, …`, each claimed by a unique insert: two writers of one position never
 * both win, and every record is read by `_id`. Appends are queued per key within the process (which removes most
 * contention); other processes are kept apart by the unique insert itself. The head (highest position) is cached in
 * memory and, for chains that grow long, in a heads document that is only a starting point for probing forward.
 *
 * With `groupCommit`, the appends that queue on one key while an earlier one is in flight are claimed together: built
 * one after another on consecutive positions, each on the record before it, and inserted by one ordered insert, which
 * stops at its first position taken (so no record lands after a position that was not won). Only for chains whose
 * `build` needs nothing but the record before it: one wallet's daily spends, where 50 decisions at once on one
 * sponsor wallet otherwise wait for 50 inserts one after another (issue 40).
 */
export class SlotChain<T extends Document & { _id: string }> {
  private readonly headCache = new Map<string, number>();
  private readonly recordCache = new Map<string, T>();
  private readonly queues = new Map<string, Promise<unknown>>();
  /** Per key, with groupCommit: the appends waiting while one batch is in flight. */
  private readonly waiting = new Map<string, Array<WaitingAppend<T>>>();

  constructor(
    readonly records: Collection<T>,
    private readonly heads: Collection<{ _id: string; seq: number }> | null,
    private readonly headPrefix: string,
    private readonly options: { groupCommit?: boolean } = {},
  ) {}

  id(key: string, seq: number): string {
    return `${key}#${seq}`;
  }

  /** Records are immutable once inserted, so a record read once can be served from memory afterwards. */
  async get(key: string, seq: number): Promise<T | null> {
    const id = this.id(key, seq);
    const cached = this.recordCache.get(id);
    if (cached) return cached;
    const doc = (await this.records.findOne({ _id: id } as never)) as T | null;
    if (doc) this.remember(id, doc);
    return doc;
  }

  private remember(id: string, doc: T) {
    if (this.recordCache.size > HEAD_CACHE_LIMIT) this.recordCache.clear();
    this.recordCache.set(id, doc);
  }

  /** The highest position taken (0 for an empty chain). */
  async head(key: string): Promise<number> {
    let seq = this.headCache.get(key);
    if (seq === undefined)
      seq = (this.heads && (await this.heads.findOne({ _id: `${this.headPrefix}:${key}` }))?.seq) || 0;
    while (await this.records.findOne({ _id: this.id(key, seq + 1) } as never, { projection: { _id: 1 } })) seq++;
    this.noteHead(key, seq);
    return seq;
  }

  /** A chain this process has just brought into being (its key is new): its first append need not probe. */
  startEmpty(key: string) {
    if (this.headCache.size > HEAD_CACHE_LIMIT) this.headCache.clear();
    if (!this.headCache.has(key)) this.headCache.set(key, 0);
  }

  private noteHead(key: string, seq: number) {
    if (this.headCache.size > HEAD_CACHE_LIMIT) this.headCache.clear();
    if ((this.headCache.get(key) ?? 0) < seq) this.headCache.set(key, seq);
  }

  /**
   * Appends at the next free position. `build` sees the position and the record before it and returns the record,
   * or null to refuse (nothing is written). Throws OtherKeyTaken when the insert lost on another unique key.
   */
  append(key: string, build: RecordBuilder<T>): Promise<T | null> {
    if (this.options.groupCommit) return this.appendGrouped(key, build);
    return this.serialized(key, async () => {
      // A remembered head is tried as is: when another process moved it on, the insert says so and we probe on.
      let seq = this.headCache.get(key) ?? (await this.head(key));
      for (;;) {
        const previous = seq > 0 ? await this.get(key, seq) : null;
        const body = await build(seq + 1, previous);
        if (!body) return null;
        const doc = { ...body, _id: this.id(key, seq + 1) } as unknown as T;
        if (await insertFirst(this.records, doc as OptionalUnlessRequiredId<T>)) {
          this.noteHead(key, seq + 1);
          this.remember(doc._id, doc);
          await this.writeHeadEvery(key, seq, seq + 1);
          return doc;
        }
        if (!(await this.records.findOne({ _id: doc._id } as never, { projection: { _id: 1 } })))
          throw new OtherKeyTaken(doc._id);
        seq++; // another writer took this position: build on theirs
      }
    });
  }

  /** A cache for cold starts, written every few positions; it only shortens the probe of a cold process. */
  private async writeHeadEvery(key: string, from: number, to: number): Promise<void> {
    if (!this.heads || Math.floor(to / HEAD_WRITE_EVERY) === Math.floor(from / HEAD_WRITE_EVERY)) return;
    await this.heads
      .updateOne({ _id: `${this.headPrefix}:${key}` }, { $max: { seq: to } }, { upsert: true })
      .catch(() => undefined);
  }

  private appendGrouped(key: string, build: RecordBuilder<T>): Promise<T | null> {
    return new Promise<T | null>((resolve, reject) => {
      const queued = this.waiting.get(key);
      if (queued) return void queued.push({ build, resolve, reject });
      // Nobody holds the key: this append starts its batch, and whatever arrives meanwhile forms the next one.
      this.waiting.set(key, [{ build, resolve, reject }]);
      void this.drain(key);
    });
  }

  private async drain(key: string): Promise<void> {
    for (;;) {
      const queued = this.waiting.get(key)!;
      if (queued.length === 0) return void this.waiting.delete(key);
      const batch = queued.splice(0, MAX_GROUP_APPENDS);
      try {
        await this.appendBatch(key, batch);
      } catch (err) {
        for (const w of batch) w.reject(err); // unsure what was inserted: each caller finds out as on any failure
      }
    }
  }

  /**
   * Builds the batch at consecutive positions from the head and claims them by one ordered insert. A record refused
   * by its build takes no position. What the insert did not reach (its first failure and everything after it, refusals
   * included: they were judged on totals that did not all land) is built again on what the chain then holds. The
   * first failure is either a position another writer took (probe on) or another unique key (OtherKeyTaken for it).
   */
  private async appendBatch(key: string, batch: Array<WaitingAppend<T>>): Promise<void> {
    let seq = this.headCache.get(key) ?? (await this.head(key));
    let pending = batch;
    while (pending.length > 0) {
      let previous = seq > 0 ? await this.get(key, seq) : null;
      const built: Array<{ w: WaitingAppend<T>; doc: T | null }> = [];
      const docs: T[] = [];
      for (const w of pending) {
        const position = seq + 1 + docs.length;
        let body: Omit<T, '_id'> | null;
        try {
          body = await w.build(position, previous);
        } catch (err) {
          w.reject(err); // a build that fails takes no position and holds no one up
          continue;
        }
        const doc = body ? ({ ...body, _id: this.id(key, position) } as T) : null;
        built.push({ w, doc });
        if (doc) docs.push((previous = doc));
      }
      const inserted = docs.length > 0 ? await insertInOrder(this.records, docs as OptionalUnlessRequiredId<T>[]) : 0;
      const reached = built.findIndex((b) => b.doc !== null && docs.indexOf(b.doc) >= inserted);
      for (const b of reached < 0 ? built : built.slice(0, reached)) {
        if (b.doc) this.remember(b.doc._id, b.doc);
        b.w.resolve(b.doc);
      }
      if (inserted > 0) {
        this.noteHead(key, seq + inserted);
        await this.writeHeadEvery(key, seq, seq + inserted);
        seq += inserted;
      }
      if (reached < 0) return;
      const failed = built[reached]!;
      pending = built.slice(reached + 1).map((b) => b.w);
      if (await this.isTaken(failed.doc!._id)) {
        // Another writer took this position, and likely a run of them (its own batch): build past them.
        seq = await this.headFrom(key, seq + 1);
        this.noteHead(key, seq);
        pending.unshift(failed.w);
      } else failed.w.reject(new OtherKeyTaken(failed.doc!._id));
    }
  }

  private async isTaken(id: string): Promise<boolean> {
    return (await this.records.findOne({ _id: id } as never, { projection: { _id: 1 } })) !== null;
  }

  /**
   * The head at or past `taken`, a position known to be taken. A chain's positions are taken without gaps (each
   * insert is at a position right after one known taken), so the first free one is found by doubling steps, then
   * halving: a few reads by `_id` however many positions another process took at once. One taken meanwhile makes the
   * next insert fail and look again.
   */
  private async headFrom(key: string, taken: number): Promise<number> {
    let low = taken;
    let step = 1;
    while (await this.isTaken(this.id(key, low + step))) {
      low += step;
      step *= 2;
    }
    for (let high = low + step; high - low > 1;) {
      const middle = Math.floor((low + high) / 2);
      if (await this.isTaken(this.id(key, middle))) low = middle;
      else high = middle;
    }
    return low;
  }

  private serialized<R>(key: string, work: () => Promise<R>): Promise<R> {
    const previous = this.queues.get(key) ?? Promise.resolve();
    const run = previous.then(work, work);
    const tail = run.catch(() => undefined);
    this.queues.set(key, tail);
    void tail.then(() => {
      if (this.queues.get(key) === tail) this.queues.delete(key);
    });
    return run;
  }
}

export class X402Store {
  readonly gates: Collection<GateDoc>;
  readonly quotes: Collection<QuoteDoc>;
  readonly commitments: Collection<CommitmentDoc>;
  readonly verifications: Collection<VerificationDoc>;
  readonly windDowns: Collection<WindDownDoc>;
  readonly windDownSummaries: Collection<{ _id: string; summary: WindDownSummary }>;
  readonly walletDecisions: Collection<WalletDecisionDoc>;
  readonly escalations: Collection<EscalationDoc>;
  readonly resolutions: Collection<ResolutionDoc>;
  readonly overrideUses: Collection<OverrideUseDoc>;
  /** `<gateId>#<n>` -> quoteId: the gate's quotes in order; the last one is current. */
  readonly quoteSlots: SlotChain<SlotDoc>;
  /** `<agentId>#<n>` -> gateId: every gate an agent pays or is paid by (what a wind-down walks). */
  readonly agentGates: SlotChain<SlotDoc>;
  /** `<tenantId>#<n>` -> escalationId: what the escalation list pages through, newest first. */
  readonly tenantEscalations: SlotChain<SlotDoc>;
  /** `<walletId>#<n>`: policy versions; the last one is in force. */
  readonly policies: SlotChain<PolicyVersionDoc & Document>;
  /** `<walletId>#<day>#<n>`: authorized spends with the day's running total. */
  readonly spends: SlotChain<SpendDoc>;
  /**
   * Gates whose reserve is not settled yet (see DueWorkStore), due when the sweeper should look: marked before the
   * gate's lock, removed once its money is returned or handed to its settlement.
   */
  readonly due: DueWorkStore;
  /**
   * Escalations nobody has decided yet, due at their deadline (see DueWorkStore): marked before the escalation is
   * recorded, removed once the sweep has seen it decided (by a person, or by itself at the deadline).
   */
  readonly escalationsDue: DueWorkStore;
  /** The gate and escalation lists (see list-index.ts): entered before the document is stored. */
  readonly listed: ListIndex;

  constructor(db: Db, redis: RedisClient, redisPrefix: string, listed: ListIndex, partitions?: DuePartitions) {
    this.listed = listed;
    this.gates = db.collection('x402_gates');
    this.quotes = db.collection('x402_quotes');
    this.commitments = db.collection('x402_gate_commitments');
    this.verifications = db.collection('x402_verifications');
    this.windDowns = db.collection('x402_wind_downs');
    this.windDownSummaries = db.collection('x402_wind_down_summaries');
    this.walletDecisions = db.collection('x402_wallet_decisions');
    this.escalations = db.collection('x402_escalations');
    this.resolutions = db.collection('x402_escalation_resolutions');
    this.overrideUses = db.collection('x402_override_uses');
    const heads = db.collection<{ _id: string; seq: number }>('x402_chain_heads');
    this.quoteSlots = new SlotChain(db.collection('x402_quote_slots'), null, 'quotes');
    this.agentGates = new SlotChain(db.collection('x402_agent_gates'), heads, 'agent-gates');
    this.tenantEscalations = new SlotChain(db.collection('x402_tenant_escalations'), heads, 'tenant-escalations');
    this.policies = new SlotChain(db.collection('x402_wallet_policies'), null, 'policies');
    // One sponsor wallet pays for many calls at once: its day's spends are claimed by group commit (issue 40).
    this.spends = new SlotChain(db.collection('x402_daily_spends'), heads, 'spends', { groupCommit: true });
    // Partitioned by gate id, as its x402-verify jobs are; an escalation is marked with its gate's id as owner.
    this.due = new DueWorkStore(db, 'x402_gates', redis, redisPrefix, { partitions });
    this.escalationsDue = new DueWorkStore(db, 'x402_escalations', redis, redisPrefix, { partitions });
  }

  /**
   * Gates and quotes never change once stored, so one read or written here is served from memory afterwards (a
   * gate is remembered only once funded: one whose funding was refused is deleted before anyone is told its id).
   */
  private readonly knownGates = new Map<string, GateDoc>();
  private readonly knownQuotes = new Map<string, QuoteDoc>();

  rememberGate(gate: GateDoc): void {
    remember(this.knownGates, gate);
  }

  rememberQuote(quote: QuoteDoc): void {
    remember(this.knownQuotes, quote);
  }

  /**
   * A gate's commitment is a fact (first writer wins, never updated or removed): once this process has written or
   * read it, it is served from memory. Its absence is not a fact (another process may commit the gate at any time):
   * a gate with no known commitment is read every time.
   */
  private readonly knownCommitments = new Map<string, CommitmentDoc>();

  private rememberCommitment(commitment: CommitmentDoc): void {
    remember(this.knownCommitments, commitment);
  }

  /** The gate and commitment a report carries copies of, remembered as if read (a copy that does not match is left). */
  rememberFactsOf(verification: VerificationDoc): void {
    const against = verification.against;
    if (
      !against ||
      against.gate._id !== verification._id ||
      against.gate.tenantId !== verification.tenantId ||
      against.commitment._id !== verification._id
    )
      return;
    this.rememberGate(against.gate);
    this.rememberCommitment(against.commitment);
  }

  /** Whether this process has seen the gate's commitment (then commitmentOf answers from memory). */
  knowsCommitment(gateId: string): boolean {
    return this.knownCommitments.has(gateId);
  }

  commitmentOf(gateId: string): Promise<CommitmentDoc | null> {
    return this.immutableById(this.knownCommitments, this.commitments, gateId);
  }

  /** A record that never changes once stored, from memory once seen (its absence is read again every time). */
  private async immutableById<T extends { _id: string }>(
    known: Map<string, T>,
    collection: Collection<T>,
    id: string,
  ): Promise<T | null> {
    const cached = known.get(id);
    if (cached) return cached;
    const found = (await collection.findOne({ _id: id } as never)) as T | null;
    if (found) remember(known, found);
    return found;
  }

  /** The gate as MongoDB holds it now, never from memory (the ledger audit must see a refused gate gone). */
  storedGate(gateId: string): Promise<GateDoc | null> {
    return this.gates.findOne({ _id: gateId });
  }

  /**
   * Whether a spend was counted under this decision key, on any day (a scan of the spends: only on the path that
   * found a breach, which is rare and refused anyway).
   */
  async spentUnder(decisionKey: string): Promise<boolean> {
    return (await this.spends.records.findOne({ decisionKey }, { projection: { _id: 1 } })) !== null;
  }

  /** A gate of any tenant (the sweeper's read), from memory once seen. */
  gateById(gateId: string): Promise<GateDoc | null> {
    return this.immutableById(this.knownGates, this.gates, gateId);
  }

  /**
   * Records the gate, or finds the one recorded before under the same id (a create resumed after a crash or a
   * 5xx: its id derives from the client's Idempotency-Key). `created` false hands back the earlier gate.
   */
  async recordGate(gate: GateDoc): Promise<{ created: boolean; gate: GateDoc }> {
    await this.listed.add({
      kind: 'gates',
      id: gate._id,
      tenantId: gate.tenantId,
      at: gate.createdAt,
      agentIds: [gate.payerAgentId, gate.payeeAgentId],
    });
    if (await insertFirst(this.gates, gate)) return { created: true, gate };
    const existing = await this.gates.findOne({ _id: gate._id });
    if (!existing) throw new Error(`gate ${gate._id} collided but is not stored`);
    return { created: false, gate: existing };
  }

  /** Claims the gate's commitment (first writer wins): whether this one won. */
  private async claimCommitment(commitment: CommitmentDoc): Promise<boolean> {
    const won = await insertFirst(this.commitments, commitment);
    if (won) this.rememberCommitment(commitment);
    return won;
  }

  /** Claims the gate's commitment and hands back whichever commitment won. */
  private async commit(commitment: CommitmentDoc): Promise<CommitmentDoc> {
    if (await this.claimCommitment(commitment)) return commitment;
    return recorded(await this.commitmentOf(commitment._id), `commitment ${commitment._id}`);
  }

  /** The gate's payment authorization, if the gate had no commitment yet: whether it is now the gate's. */
  recordAuthorization(authorization: Extract<CommitmentDoc, { kind: 'authorization' }>): Promise<boolean> {
    return this.claimCommitment(authorization);
  }

  /** The gate cancelled by this agent's wind-down; answers the commitment that won (this one or an earlier one). */
  recordCancellation(gate: Pick<GateDoc, '_id' | 'tenantId'>, windDownOf: string): Promise<CommitmentDoc> {
    return this.commit({ _id: gate._id, tenantId: gate.tenantId, at: new Date(), kind: 'cancellation', windDownOf });
  }

  /** The held gate expired (the sweeper, past its deadline); answers the commitment that won. */
  recordExpiry(gate: Pick<GateDoc, '_id' | 'tenantId'>): Promise<CommitmentDoc> {
    return this.commit({ _id: gate._id, tenantId: gate.tenantId, at: new Date(), kind: 'expired' });
  }

  /** The gate voided by a failure report before anyone authorized it; answers the commitment that won. */
  recordVoiding(gate: Pick<GateDoc, '_id' | 'tenantId'>): Promise<CommitmentDoc> {
    return this.commit({ _id: gate._id, tenantId: gate.tenantId, at: new Date(), kind: 'voided' });
  }

  /** A gate whose lock was refused whole: it never held money, so it goes (its index entries then point at nothing). */
  async removeRefusedGate(gateId: string): Promise<void> {
    this.knownGates.delete(gateId);
    await this.gates.deleteOne({ _id: gateId });
  }

  /** What holds the gate's verification slot, if anything (read every time: its absence is no fact). */
  verificationOf(gateId: string): Promise<VerificationDoc | null> {
    return this.verifications.findOne({ _id: gateId });
  }

  /** Claims the gate's verification slot (first writer wins): whether this one won, and the one that did. */
  async recordVerification(verification: VerificationDoc): Promise<{ won: boolean; verification: VerificationDoc }> {
    if (await insertFirst(this.verifications, verification)) return { won: true, verification };
    return {
      won: false,
      verification: recorded(await this.verificationOf(verification._id), `verification ${verification._id}`),
    };
  }

  /** The tenant's gate (another tenant's is not found), from memory once seen. */
  async gateOfTenant(gateId: string, tenantId: string): Promise<GateDoc | null> {
    const gate = await this.immutableById(this.knownGates, this.gates, gateId);
    return gate && gate.tenantId === tenantId ? gate : null;
  }

  /** The tenant's quote, from memory once seen. */
  async quoteOfTenant(quoteId: string, tenantId: string): Promise<QuoteDoc | null> {
    const quote = await this.immutableById(this.knownQuotes, this.quotes, quoteId);
    return quote && quote.tenantId === tenantId ? quote : null;
  }

  /** Stores a quote the gate's quote chain already names; served from memory afterwards. */
  async recordQuote(quote: QuoteDoc): Promise<void> {
    await this.quotes.insertOne(quote);
    this.rememberQuote(quote);
  }

  /** The gate's current quote: the last of its quote chain. */
  async currentQuote(gateId: string): Promise<{ slot: number; quote: QuoteDoc | null }> {
    const slot = await this.quoteSlots.head(gateId);
    if (slot === 0) return { slot, quote: null };
    const ref = await this.quoteSlots.get(gateId, slot);
    return { slot, quote: ref ? await this.immutableById(this.knownQuotes, this.quotes, ref.ref) : null };
  }

  /** The policy in force for a wallet (its last version), or null. */
  async policyOf(walletId: string): Promise<PolicyVersionDoc | null> {
    const version = await this.policies.head(walletId);
    return version === 0 ? null : this.policies.get(walletId, version);
  }

  /** The sponsor wallet's decision on one gate and quote (`_id` = wallet#gate#quote), expired or not. */
  walletDecisionOf(decisionId: string): Promise<WalletDecisionDoc | null> {
    return this.walletDecisions.findOne({ _id: decisionId });
  }

  /**
   * Records a wallet decision (first writer wins), replacing an expired one first; answers the decision that holds
   * the slot (a concurrent decision that got there first is handed back instead).
   */
  async recordWalletDecision(decision: WalletDecisionDoc, replacesExpired: boolean): Promise<WalletDecisionDoc> {
    if (replacesExpired) await this.walletDecisions.deleteOne({ _id: decision._id });
    if (await insertFirst(this.walletDecisions, decision)) return decision;
    return (await this.walletDecisionOf(decision._id)) ?? decision;
  }

  /** The escalation raised for one gate and quote (first writer wins): whether this one was recorded. */
  async recordEscalation(e: EscalationDoc): Promise<boolean> {
    await this.listed.add({
      kind: 'escalations',
      id: e._id,
      tenantId: e.tenantId,
      at: e.createdAt,
      agentIds: [e.payerAgentId, e.payeeAgentId],
    });
    return insertFirst(this.escalations, e);
  }

  escalationOf(escalationId: string): Promise<EscalationDoc | null> {
    return this.escalations.findOne({ _id: escalationId });
  }

  /** The tenant's escalation (another tenant's is not found, never revealed). */
  async escalationOfTenant(escalationId: string, tenantId: string): Promise<EscalationDoc | null> {
    const escalation = await this.escalationOf(escalationId);
    return escalation && escalation.tenantId === tenantId ? escalation : null;
  }

  /** How the escalation was resolved, if it was. */
  resolutionOf(escalationId: string): Promise<ResolutionDoc | null> {
    return this.resolutions.findOne({ _id: escalationId });
  }

  /** Resolves the escalation (first writer wins): whether this resolution won, and the one that did. */
  async recordResolution(resolution: ResolutionDoc): Promise<{ won: boolean; resolution: ResolutionDoc | null }> {
    if (await insertFirst(this.resolutions, resolution)) return { won: true, resolution };
    return { won: false, resolution: await this.resolutionOf(resolution._id) };
  }

  /** The approved escalation's override spent on this gate (once): whether this use is the one recorded. */
  recordOverrideUse(escalationId: string, gateId: string, at: Date): Promise<boolean> {
    return insertFirst(this.overrideUses, { _id: escalationId, gateId, at });
  }

  async isOverrideUsed(escalationId: string): Promise<boolean> {
    return (await this.overrideUses.findOne({ _id: escalationId }, { projection: { _id: 1 } })) !== null;
  }

  /** Records the agent's wind-down (first call wins): whether this call recorded it. */
  recordWindDown(windDown: WindDownDoc): Promise<boolean> {
    return insertFirst(this.windDowns, windDown);
  }

  windDownOf(agentId: string): Promise<WindDownDoc | null> {
    return this.windDowns.findOne({ _id: agentId });
  }

  /** Whether the agent's wind-down is recorded: an exact read, never cached. */
  async isWoundDown(agentId: string): Promise<boolean> {
    return (await this.windDowns.findOne({ _id: agentId }, { projection: { _id: 1 } })) !== null;
  }

  /** What the agent's wind-down did, once it finished. */
  async windDownSummaryOf(agentId: string): Promise<WindDownSummary | null> {
    return (await this.windDownSummaries.findOne({ _id: agentId }))?.summary ?? null;
  }

  /** Records what the wind-down did (first writer wins) and answers the summary recorded. */
  async recordWindDownSummary(agentId: string, summary: WindDownSummary): Promise<WindDownSummary> {
    if (await insertFirst(this.windDownSummaries, { _id: agentId, summary })) return summary;
    return (await this.windDownSummaryOf(agentId))!;
  }
}
