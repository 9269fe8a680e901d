import type { Collection, Db } from 'mongodb';
import type { RedisClient } from '../redis.ts';
import { canonicalize } from '../domain/canonical-json.ts';
import type { RunArtifact } from '../domain/artifact.ts';
import type { ChainHead, EventEnvelope } from '../domain/event-chain.ts';
import { errors, serviceError } from '../domain/errors.ts';
import type { PriceSchedule } from '../domain/pricing.ts';
import type { Terms, Verdict } from '../domain/terms.ts';
import { ownerOf } from '../queues/index.ts';
import { DueWorkStore, type DuePartitions } from './due-work.ts';
import { EventIdIndex } from './event-id-index.ts';
import { ListIndex, type ListEntry } from './list-index.ts';
import { insertFirst, isDuplicateKey } from './mongo.ts';

export type RunStatus = 'in_progress' | 'finalizing' | 'finalized';

/** Money terms a run settles under (contract section 7); amounts are integer minor units. */
export interface RunSettlementTerms {
  payerAgentId: string;
  amount: number;
  currency: string;
  holdbackBps: number;
  disputeWindowSeconds: number;
}

export interface RunDoc {
  _id: string;
  tenantId: string;
  agentId: string;
  terms: Terms;
  /** The run's price schedule when it is priced by use (absent on runs without one). */
  pricing?: PriceSchedule;
  settlement: RunSettlementTerms | null;
  status: RunStatus;
  verdict: Verdict | null;
  artifactId: string | null;
  createdAt: Date;
  /** When finalize was first requested: it is the artifact's finalizedAt, so a retried build is identical. */
  finalizeRequestedAt: Date | null;
  /** The head frozen by the seal: the artifact covers exactly events 1..finalHead.seq (the live head is in run_heads). */
  finalHead: ChainHead | null;
  finalizedAt: Date | null;
  /** Set when the run's data could never make an artifact: the run is finalized as `fail` with this reason. */
  finalizeError: { code: string; message: string } | null;
}

/** A stored event: the envelope, with the payload kept as its canonical JSON so it round-trips exactly. */
export type StoredEvent = Omit<EventEnvelope, 'payload'> & { payloadJson: string };

/**
 * One appended batch, stored as one document (so a batch is stored whole or not at all). Its id is
 * `${runId}:${firstSeq}`: every batch starts right after the head its writer verified against, so two writers of
 * the same position collide on the id and exactly one wins. A seal takes the next position the same way when the
 * run is finalized, so no append can ever land after it.
 */
export interface RunBatchDoc {
  _id: string;
  tenantId: string;
  runId: string;
  firstSeq: number;
  lastSeq: number;
  /**
   * The events as JSON of StoredEvent[]: one string costs FerretDB a fifth of what 100 sub-documents of 12 fields
   * do to write and read (measured: 3.7 vs 15 ms CPU to insert, 4-7 vs 20-30 ms to read). Batches written before
   * carry `events` instead; readers take either (batchEvents).
   */
  eventsJson?: string;
  /** chainHash of the last event (null for a seal): the head without parsing the events. */
  lastChainHash?: string | null;
  events?: StoredEvent[];
  /** The service's MAC saying these events' signatures were verified at append (domain batchAttestation). */
  attestation?: string;
  /** Present on the seal only: the head the artifact covers, and when finalize was first requested. */
  seal?: { finalHead: ChainHead; sealedAt: Date };
  receivedAt: Date;
}

/** Cache of a run's head, in its own document so that appenders never write the run document itself. */
interface RunHeadDoc {
  _id: string;
  seq: number;
  chainHash: string | null;
  sealed: boolean;
}

export interface ArtifactDoc {
  _id: string;
  tenantId: string;
  runId: string;
  agentId: string;
  artifactHash: string;
  /** Canonical JSON of the artifact without events.items; the items are the run's stored events 1..count. */
  headerJson: string;
  eventCount: number;
  createdAt: Date;
}

export type ArtifactHeader = Omit<RunArtifact, 'events'> & { events: Omit<RunArtifact['events'], 'items'> };

/** Runs whose head one process remembers (a few hundred bytes each). */
const MAX_HEAD_HINTS = 20_000;

/** Most batch reads one chain walk has in flight (the driver's pool is 50). */
const MAX_READ_AHEAD = 32;

function positionId(runId: string, seq: number): string {
  return `${runId}:${seq}`;
}

export function toEnvelope(e: StoredEvent): EventEnvelope {
  const { payloadJson, ...rest } = e;
  return { ...rest, payload: JSON.parse(payloadJson) };
}

function toStored(e: EventEnvelope): StoredEvent {
  const { payload, ...rest } = e;
  return { ...rest, payloadJson: canonicalize(payload) };
}

/** The stored events of a batch document, in either storage form. */
export function batchEvents(doc: Pick<RunBatchDoc, 'eventsJson' | 'events'>): StoredEvent[] {
  return doc.eventsJson !== undefined ? (JSON.parse(doc.eventsJson) as StoredEvent[]) : (doc.events ?? []);
}

function lastChainHashOf(doc: RunBatchDoc): string {
  return doc.lastChainHash ?? batchEvents(doc).at(-1)!.chainHash;
}

/** The batch fields that hold its events, as appends store them. */
export function storedBatchEvents(events: EventEnvelope[]): Pick<RunBatchDoc, 'eventsJson' | 'lastChainHash'> {
  return { eventsJson: JSON.stringify(events.map(toStored)), lastChainHash: events.at(-1)!.chainHash };
}

/** What an append needs of a run. */
export type AppendTarget = Pick<RunDoc, '_id' | 'tenantId' | 'agentId' | 'status'>;

export function runListEntry(
  run: Pick<RunDoc, '_id' | 'tenantId' | 'agentId' | 'settlement' | 'createdAt'>,
): ListEntry {
  return {
    kind: 'runs',
    id: run._id,
    tenantId: run.tenantId,
    at: run.createdAt,
    agentIds: [run.agentId, ...(run.settlement ? [run.settlement.payerAgentId] : [])],
  };
}

export class RunStore {
  readonly runs: Collection<RunDoc>;
  readonly batches: Collection<RunBatchDoc>;
  readonly heads: Collection<RunHeadDoc>;
  readonly artifacts: Collection<ArtifactDoc>;
  /** Runs whose finalize is requested and not yet done (see DueWorkStore). */
  readonly finalizeDue: DueWorkStore;
  /** The run lists (see list-index.ts): a run is entered before it is stored. */
  readonly listed: ListIndex;

  constructor(db: Db, redis: RedisClient, redisPrefix: string, listed: ListIndex, partitions?: DuePartitions) {
    this.listed = listed;
    this.runs = db.collection<RunDoc>('runs');
    this.batches = db.collection<RunBatchDoc>('run_batches');
    this.heads = db.collection<RunHeadDoc>('run_heads');
    this.artifacts = db.collection<ArtifactDoc>('artifacts');
    // A record's id is its run's; its partition is its finalize job's (`tenantId/runId`).
    this.finalizeDue = new DueWorkStore(db, 'finalize', redis, redisPrefix, {
      partitions,
      ownerOf: (runId, tenantId) => ownerOf('finalize', { tenantId, runId }),
    });
  }

  /**
   * Stores a new run; a run already stored under this id (a create retried under the same idempotency key) is
   * answered as it is, unless it was made from another request (then 422 IDEMPOTENCY_KEY_REUSED).
   */
  async createOrResume(run: RunDoc): Promise<RunDoc> {
    await this.listed.add(runListEntry(run));
    if (!(await insertFirst(this.runs, run))) {
      const existing = (await this.runs.findOne({ _id: run._id }))!;
      const same = (r: RunDoc) =>
        canonicalize({ t: r.tenantId, a: r.agentId, terms: r.terms, p: r.pricing ?? null, s: r.settlement });
      if (same(existing) !== same(run))
        throw serviceError('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was used for a different request');
      return existing;
    }
    this.remember(run._id, { head: { seq: 0, chainHash: null }, sealed: false }); // a new run starts empty
    return run;
  }

  /** Sets settlement terms on a run that had none; returns the run as it is afterwards (first terms win). */
  async attachSettlement(tenantId: string, runId: string, terms: RunSettlementTerms): Promise<RunDoc> {
    const run = await this.get(tenantId, runId);
    if (!run) throw errors.notFound('run');
    if (run.settlement) return run;
    await this.listed.add(runListEntry({ ...run, settlement: terms })); // now listed under its payer too
    // The run's escrow lock (one per run, by its entry id) already decided which terms win; this records them.
    await this.runs.updateOne({ _id: runId }, { $set: { settlement: terms } });
    return { ...run, settlement: terms };
  }

  /** The run if it belongs to the tenant (looked up by id alone; another tenant's run is simply not found). */
  async get(tenantId: string, runId: string): Promise<RunDoc | null> {
    const run = await this.runs.findOne({ _id: runId });
    return run?.tenantId === tenantId ? run : null;
  }

  getAny(runId: string): Promise<RunDoc | null> {
    return this.runs.findOne({ _id: runId });
  }

  /**
   * Runs this process has seen in progress, for appends. What an append needs of a run never changes (its tenant,
   * agent and id) except the status, and the status is not what stops a late append: the seal is, since a batch
   * cannot take the position the seal holds (see append). So an entry is good until this process learns of a seal
   * (remember drops it then).
   */
  private readonly appendable = new Map<string, AppendTarget>();

  /** The run if it belongs to the tenant, from memory while this process knows it in progress (see appendable). */
  async getForAppend(tenantId: string, runId: string): Promise<AppendTarget | null> {
    const known = this.appendable.get(runId);
    if (known) return known.tenantId === tenantId ? known : null;
    const run = await this.runs.findOne({ _id: runId });
    const target = run && { _id: run._id, tenantId: run.tenantId, agentId: run.agentId, status: run.status };
    if (target?.status === 'in_progress') {
      this.appendable.set(runId, target); // only what an append needs: a whole run (terms, settlement) is ten times that
      if (this.appendable.size > MAX_HEAD_HINTS) this.appendable.delete(this.appendable.keys().next().value!);
    } else this.appendable.delete(runId);
    return target?.tenantId === tenantId ? target : null;
  }

  /**
   * Heads this process has seen stored (appended, walked to or sealed), so the next append or read of the run can
   * start from there without reading the head cache document. Batches are never removed and a seal is for ever, so
   * such a head is a lower bound of the true one, and every user walks forward from it (repairHead) or lets the
   * position insert decide (append), exactly as with a head cache document that trails.
   */
  private readonly headHints = new Map<string, { head: ChainHead; sealed: boolean }>();

  /** Which event ids the run's batches hold, for the runs this process appends to (see EventIdIndex). */
  private readonly eventIds = new EventIdIndex();

  private remember(runId: string, known: { head: ChainHead; sealed: boolean }): void {
    if (known.sealed) {
      this.appendable.delete(runId);
      this.eventIds.drop(runId); // nothing more is appended
    }
    const had = this.headHints.get(runId);
    if (had && (had.head.seq > known.head.seq || (had.sealed && !known.sealed))) return; // never move a hint back
    this.headHints.delete(runId); // re-inserted last: the map's order is least recently written first
    this.headHints.set(runId, known);
    if (this.headHints.size > MAX_HEAD_HINTS) this.headHints.delete(this.headHints.keys().next().value!);
  }

  /** A lower bound of the head: this process's hint if it has one (no I/O), else the head cache document. */
  async knownHead(runId: string): Promise<{ head: ChainHead; sealed: boolean }> {
    return this.headHints.get(runId) ?? (await this.head(runId));
  }

  /** Whether this process holds a head hint for the run (a read can then go straight to the next position). */
  hasHeadHint(runId: string): boolean {
    return this.headHints.has(runId);
  }

  /** The head, and whether the run is sealed, as far as the cache knows (see repairHead for the truth). */
  async head(runId: string): Promise<{ head: ChainHead; sealed: boolean }> {
    const doc = await this.heads.findOne({ _id: runId });
    return doc
      ? { head: { seq: doc.seq, chainHash: doc.chainHash }, sealed: doc.sealed }
      : { head: { seq: 0, chainHash: null }, sealed: false };
  }

  /** Walks the stored batches forward from the cached head: the true head, and whether a seal ends the chain. */
  async repairHead(
    runId: string,
    known?: { head: ChainHead; sealed: boolean },
  ): Promise<{ head: ChainHead; sealed: boolean }> {
    const cached = known ?? (await this.knownHead(runId));
    let { head, sealed } = cached;
    while (!sealed) {
      const next = await this.batches.findOne({ _id: positionId(runId, head.seq + 1) });
      if (!next) break;
      if (next.seal) sealed = true;
      else head = { seq: next.lastSeq, chainHash: lastChainHashOf(next) };
    }
    if (head.seq !== cached.head.seq || sealed !== cached.sealed) await this.cacheHead(runId, head, sealed);
    else this.remember(runId, { head, sealed });
    return { head, sealed };
  }

  private async cacheHead(runId: string, head: ChainHead, sealed: boolean): Promise<void> {
    this.remember(runId, { head, sealed });
    // Best effort: a lost or stale cache write only means the next reader walks a little further.
    await this.heads
      .updateOne({ _id: runId }, { $set: { seq: head.seq, chainHash: head.chainHash, sealed } }, { upsert: true })
      .catch((err) => {
        if (!isDuplicateKey(err)) throw err;
      });
  }

  /**
   * Stored events of the run with these ids, among positions 1..head.seq (the head the caller verified against; all
   * of them are stored). The index is brought up to that head first (reading only batches it has not seen), then
   * each candidate batch is read once by its position id.
   */
  async findByEventIds(runId: string, head: ChainHead, ids: readonly string[]): Promise<EventEnvelope[]> {
    const from = this.eventIds.coveredUpTo(runId) + 1;
    if (from <= head.seq)
      await this.walkBatches(runId, from, head.seq, (batch, events) =>
        this.eventIds.add(
          runId,
          batch.firstSeq,
          batch.lastSeq,
          events.map((e) => e.id),
        ),
      );
    const wanted = new Set(ids);
    const starts = new Set(ids.flatMap((id) => this.eventIds.candidates(runId, id)));
    const batches = await Promise.all([...starts].map((seq) => this.batches.findOne({ _id: positionId(runId, seq) })));
    return batches.flatMap((batch) =>
      batch && !batch.seal
        ? batchEvents(batch)
            .filter((e) => wanted.has(e.id))
            .map(toEnvelope)
        : [],
    );
  }

  /** Events 1..upToSeq in order, walking the run's batches by their position ids. */
  async listEvents(runId: string, upToSeq: number): Promise<EventEnvelope[]> {
    return (await this.readChain(runId, upToSeq)).events;
  }

  /** Events 1..upToSeq in order, and the batches they came from (each whole, with its attestation). */
  async readChain(
    runId: string,
    upToSeq: number,
  ): Promise<{ events: EventEnvelope[]; batches: Array<{ events: EventEnvelope[]; attestation: string | null }> }> {
    const events: EventEnvelope[] = [];
    const batches: Array<{ events: EventEnvelope[]; attestation: string | null }> = [];
    await this.walkBatches(runId, 1, upToSeq, (batch, stored) => {
      const whole = stored.map(toEnvelope);
      batches.push({ events: whole, attestation: batch.attestation ?? null });
      for (const e of whole) if (e.seq <= upToSeq) events.push(e);
    });
    return { events, batches };
  }

  /**
   * Visits, in order, the stored batches holding positions fromSeq..upToSeq (fromSeq must start a batch), until a
   * seal or a missing position ends the chain. Each batch's id derives from the previous one's last position; batches
   * of a run usually have one size, so the positions after the last batch read are guessed from its size and read
   * together (up to MAX_READ_AHEAD at once, doubling while the guesses hold). A wrong guess costs one wasted read;
   * the walk itself stays exact.
   */
  private async walkBatches(
    runId: string,
    fromSeq: number,
    upToSeq: number,
    visit: (batch: RunBatchDoc, events: StoredEvent[]) => void,
  ): Promise<void> {
    let seq = fromSeq;
    let size = 0;
    let window = 1;
    while (seq <= upToSeq) {
      const positions = [seq];
      for (let p = seq + size; size > 0 && p <= upToSeq && positions.length < window; p += size) positions.push(p);
      const docs = await Promise.all(positions.map((p) => this.batches.findOne({ _id: positionId(runId, p) })));
      for (const [i, batch] of docs.entries()) {
        if (positions[i] !== seq) break; // a guess past a batch of another size: read again from seq
        if (!batch || batch.seal) return;
        visit(batch, batchEvents(batch));
        size = batch.lastSeq - batch.firstSeq + 1;
        seq = batch.lastSeq + 1;
      }
      window = Math.min(MAX_READ_AHEAD, window * 2);
    }
  }

  /**
   * Stores verified events that follow `expectedHead`, as one document: all of them or none. Exactly one writer
   * wins a position; the loser gets CHAIN_CONFLICT with the true head, or TRANSITION_ILLEGAL once the run is sealed.
   */
  async append(
    run: Pick<RunDoc, '_id' | 'tenantId'>,
    expectedHead: ChainHead,
    events: EventEnvelope[],
    attestation?: string,
    now = new Date(),
  ): Promise<ChainHead> {
    const first = events[0]!;
    const last = events.at(-1)!;
    const batchId = positionId(run._id, first.seq);
    // An id names one event of the run: one the chain below this position already holds is refused.
    // (The same event found again is this batch's own earlier try: the position insert below recognises it.)
    const byId = new Map(events.map((e) => [e.id, e]));
    const used = (await this.findByEventIds(run._id, expectedHead, [...byId.keys()])).find(
      (e) => e.seq !== byId.get(e.id)!.seq || e.chainHash !== byId.get(e.id)!.chainHash,
    );
    if (used)
      throw errors.conflict('CHAIN_CONFLICT', `event id ${used.id} is already used by a different event`, {
        head: expectedHead,
        eventId: used.id,
      });
    const stored = await insertFirst(this.batches, {
      _id: batchId,
      tenantId: run.tenantId,
      runId: run._id,
      firstSeq: first.seq,
      lastSeq: last.seq,
      ...storedBatchEvents(events),
      ...(attestation === undefined ? {} : { attestation }),
      receivedAt: now,
    });
    if (!stored) {
      const existing = await this.batches.findOne({ _id: batchId });
      // The same batch stored by an earlier try whose answer was lost (the head cache had not caught up): a resend.
      const existingEvents = existing && !existing.seal ? batchEvents(existing) : null;
      const sameBatch =
        existingEvents !== null &&
        existingEvents.length === events.length &&
        existingEvents.every((e, i) => e.id === events[i]!.id && e.chainHash === events[i]!.chainHash);
      const { head, sealed } = await this.repairHead(run._id);
      if (sameBatch) return { seq: last.seq, chainHash: last.chainHash };
      if (sealed) throw errors.transitionIllegal('the run is being finalized', 'finalizing');
      const positionTaken = existing !== null;
      throw errors.conflict(
        'CHAIN_CONFLICT',
        positionTaken
          ? 'prevChainHash is not the run head; another event took this position'
          : 'an event id of this batch is already used in the run',
        { head },
      );
    }
    const newHead: ChainHead = { seq: last.seq, chainHash: last.chainHash };
    this.eventIds.add(
      run._id,
      first.seq,
      last.seq,
      events.map((e) => e.id),
    );
    if (expectedHead.seq + 1 === first.seq) {
      // The batch is stored, which is all the caller waits for: this process's hint moves now, and the head cache
      // document (for other processes) follows without holding the answer; a lost write only means a longer walk.
      this.remember(run._id, { head: newHead, sealed: false });
      void this.cacheHead(run._id, newHead, false).catch(() => undefined);
    }
    return newHead;
  }

  /**
   * Seals the run: a seal takes the position after the true head (first writer wins), so the artifact covers
   * exactly the events stored before it, and no append can land after it. Returns the winning seal.
   */
  async seal(tenantId: string, runId: string, now = new Date()): Promise<NonNullable<RunBatchDoc['seal']>> {
    for (;;) {
      const { head, sealed } = await this.repairHead(runId);
      if (sealed) {
        const existing = await this.batches.findOne({ _id: positionId(runId, head.seq + 1) });
        if (existing?.seal) return existing.seal;
        continue;
      }
      const seal = { finalHead: head, sealedAt: now };
      if (
        await insertFirst(this.batches, {
          _id: positionId(runId, head.seq + 1),
          tenantId,
          runId,
          firstSeq: head.seq + 1,
          lastSeq: head.seq,
          eventsJson: '[]',
          lastChainHash: null,
          seal,
          receivedAt: now,
        })
      ) {
        // The seal is stored: the head cache document follows without holding the answer (as after an append).
        this.remember(runId, { head, sealed: true });
        void this.cacheHead(runId, head, true).catch(() => undefined);
        return seal;
      }
      // An append or another seal took the position: look again.
    }
  }

  /**
   * Finalize: seal the chain, then record on the run (a cache of the seal) that it is finalizing. A repeat
   * returns the run as it is.
   */
  async beginFinalize(tenantId: string, runId: string, now = new Date()): Promise<RunDoc> {
    const run = await this.get(tenantId, runId);
    if (!run) throw errors.notFound('run');
    if (run.status !== 'in_progress') return run;
    // Due before sealed: a crash after the seal leaves the run findable by the finalize sweeper.
    await this.finalizeDue.mark(runId, tenantId, now);
    const seal = await this.seal(tenantId, runId, now);
    const latest = await this.runs.findOne({ _id: runId });
    if (latest?.status !== 'in_progress') return latest!;
    const finalizing = { status: 'finalizing' as const, finalizeRequestedAt: seal.sealedAt, finalHead: seal.finalHead };
    // Every writer derives the same values from the one seal, so a racing or repeated write changes nothing.
    await this.runs.updateOne({ _id: runId }, { $set: finalizing });
    return { ...latest, ...finalizing };
  }

  /** Stores the artifact once; its id is its content hash, so a rebuilt artifact is the same record. */
  async saveArtifact(tenantId: string, artifact: RunArtifact, now = new Date()): Promise<void> {
    const { items: _items, ...eventsHeader } = artifact.events;
    const header = { ...artifact, events: eventsHeader };
    // A rebuilt artifact has the same content and so the same id: losing this insert means it is stored already.
    await insertFirst(this.artifacts, {
      _id: artifact.artifactId,
      tenantId,
      runId: artifact.runId,
      agentId: artifact.agentId,
      artifactHash: artifact.artifactHash,
      headerJson: canonicalize(header),
      eventCount: artifact.events.count,
      createdAt: now,
    });
  }

  /** finalizing -> finalized; the value is the same for every writer (the artifact is content-addressed). */
  async markFinalized(runId: string, artifactId: string, verdict: Verdict, now = new Date()): Promise<void> {
    await this.moveToFinalized(runId, { artifactId, verdict, finalizeError: null }, now);
  }

  /** finalizing -> finalized as `fail`, for a run whose stored data can never make an artifact. */
  async markFinalizeFailed(runId: string, error: { code: string; message: string }, now = new Date()): Promise<void> {
    await this.moveToFinalized(runId, { artifactId: null, verdict: 'fail', finalizeError: error }, now);
  }

  private async moveToFinalized(
    runId: string,
    outcome: Pick<RunDoc, 'artifactId' | 'verdict' | 'finalizeError'>,
    now: Date,
  ): Promise<void> {
    const run = await this.runs.findOne({ _id: runId });
    if (run?.status === 'finalizing')
      await this.runs.updateOne({ _id: runId }, { $set: { status: 'finalized', finalizedAt: now, ...outcome } });
    // The due record stays until run.finalized is recorded too (services/runs.ts finalizeRun removes it).
  }

  getArtifactDoc(artifactId: string): Promise<ArtifactDoc | null> {
    return this.artifacts.findOne({ _id: artifactId });
  }

  /** The artifact without its event items (everything a verification summary shows). */
  artifactHeader(doc: ArtifactDoc): ArtifactHeader {
    return JSON.parse(doc.headerJson) as ArtifactHeader;
  }

  /** The full artifact: its stored header plus the run's events 1..count. */
  async loadArtifact(doc: ArtifactDoc): Promise<RunArtifact> {
    return (await this.loadArtifactChain(doc)).artifact;
  }

  /** The full artifact, and the batches its events came from (for their attestations). */
  async loadArtifactChain(
    doc: ArtifactDoc,
  ): Promise<{ artifact: RunArtifact; batches: Array<{ events: EventEnvelope[]; attestation: string | null }> }> {
    const header = this.artifactHeader(doc);
    const { events: items, batches } = await this.readChain(doc.runId, doc.eventCount);
    return { artifact: { ...header, events: { ...header.events, items } } as RunArtifact, batches };
  }

  /** Runs whose finalize was requested before `olderThan` and is not done: candidates for the sweeper. */
  async staleFinalizing(olderThan: Date, limit: number, partition = 0): Promise<RunDoc[]> {
    const due = await this.finalizeDue.due(olderThan, limit, partition);
    const runs = await Promise.all(due.map((d) => this.runs.findOne({ _id: d._id })));
    const stale: RunDoc[] = [];
    for (const [i, run] of runs.entries()) {
      // Finalizing, or finalized without its run.finalized event recorded yet: the finalize job finishes either.
      if (run?.status === 'finalizing' || run?.status === 'finalized') stale.push(run);
      else if (run?.status === 'in_progress' && !(await this.repairHead(run._id)).sealed) {
        // The request died before its seal: nothing was frozen, so nothing is owed (a new request marks it again).
        await this.finalizeDue.done(due[i]!._id);
      } else if (run?.status === 'in_progress') {
        stale.push(await this.beginFinalize(run.tenantId, run._id)); // sealed, but the run never heard of it
      } else {
        await this.finalizeDue.done(due[i]!._id); // gone: the record outlived its work
      }
    }
    return stale;
  }
}
