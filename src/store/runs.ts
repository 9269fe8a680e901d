import type { Collection, Db } from 'mongodb';
import { canonicalize } from '../domain/canonical-json.ts';
import type { RunArtifact } from '../domain/artifact.ts';
import type { ChainHead, EventEnvelope } from '../domain/event-chain.ts';
import { errors } from '../domain/errors.ts';
import type { Terms, Verdict } from '../domain/terms.ts';
import { insertFirst, isDuplicateKey } from './mongo.ts';
import { TenantScopedCollection } from './tenant-scope.ts';

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
  events: StoredEvent[];
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

export class RunStore {
  readonly runs: Collection<RunDoc>;
  readonly batches: Collection<RunBatchDoc>;
  readonly heads: Collection<RunHeadDoc>;
  readonly artifacts: Collection<ArtifactDoc>;

  constructor(db: Db) {
    this.runs = db.collection<RunDoc>('runs');
    this.batches = db.collection<RunBatchDoc>('run_batches');
    this.heads = db.collection<RunHeadDoc>('run_heads');
    this.artifacts = db.collection<ArtifactDoc>('artifacts');
  }

  forTenant(tenantId: string) {
    return new TenantScopedCollection(this.runs, tenantId);
  }

  async create(run: RunDoc): Promise<RunDoc> {
    await this.runs.insertOne(run);
    return run;
  }

  /** Sets settlement terms on a run that had none; returns the run as it is afterwards (first terms win). */
  async attachSettlement(tenantId: string, runId: string, terms: RunSettlementTerms): Promise<RunDoc> {
    await this.forTenant(tenantId).updateOne({ _id: runId, settlement: null }, { $set: { settlement: terms } });
    const run = await this.get(tenantId, runId);
    if (!run) throw errors.notFound('run');
    return run;
  }

  get(tenantId: string, runId: string): Promise<RunDoc | null> {
    return this.forTenant(tenantId).findOne({ _id: runId });
  }

  getAny(runId: string): Promise<RunDoc | null> {
    return this.runs.findOne({ _id: runId });
  }

  /** The head, and whether the run is sealed, as far as the cache knows (see repairHead for the truth). */
  async head(runId: string): Promise<{ head: ChainHead; sealed: boolean }> {
    const doc = await this.heads.findOne({ _id: runId });
    return doc ? { head: { seq: doc.seq, chainHash: doc.chainHash }, sealed: doc.sealed } : { head: { seq: 0, chainHash: null }, sealed: false };
  }

  /** Walks the stored batches forward from the cached head: the true head, and whether a seal ends the chain. */
  async repairHead(runId: string): Promise<{ head: ChainHead; sealed: boolean }> {
    const cached = await this.head(runId);
    let { head, sealed } = cached;
    while (!sealed) {
      const next = await this.batches.findOne({ _id: positionId(runId, head.seq + 1) });
      if (!next) break;
      if (next.seal) sealed = true;
      else head = { seq: next.lastSeq, chainHash: next.events.at(-1)!.chainHash };
    }
    if (head.seq !== cached.head.seq || sealed !== cached.sealed) await this.cacheHead(runId, head, sealed);
    return { head, sealed };
  }

  private async cacheHead(runId: string, head: ChainHead, sealed: boolean): Promise<void> {
    // Best effort: a lost or stale cache write only means the next reader walks a little further.
    await this.heads.updateOne({ _id: runId }, { $set: { seq: head.seq, chainHash: head.chainHash, sealed } }, { upsert: true }).catch((err) => {
      if (!isDuplicateKey(err)) throw err;
    });
  }

  /** Stored events of the run with these ids (to recognise a resent event). */
  async findByEventIds(runId: string, ids: string[]): Promise<EventEnvelope[]> {
    const wanted = new Set(ids);
    const docs = await this.batches.find({ runId, 'events.id': { $in: ids } }).toArray();
    return docs.flatMap((d) => d.events.filter((e) => wanted.has(e.id)).map(toEnvelope));
  }

  /** Events 1..upToSeq in order. */
  async listEvents(runId: string, upToSeq: number): Promise<EventEnvelope[]> {
    const docs = await this.batches.find({ runId }).toArray();
    return docs
      .filter((d) => !d.seal && d.firstSeq <= upToSeq)
      .sort((a, b) => a.firstSeq - b.firstSeq)
      .flatMap((d) => d.events.filter((e) => e.seq <= upToSeq).map(toEnvelope));
  }

  /**
   * Stores verified events that follow `expectedHead`, as one document: all of them or none. Exactly one writer
   * wins a position; the loser gets CHAIN_CONFLICT with the true head, or TRANSITION_ILLEGAL once the run is sealed.
   */
  async append(run: RunDoc, expectedHead: ChainHead, events: EventEnvelope[], now = new Date()): Promise<ChainHead> {
    const first = events[0]!;
    const last = events.at(-1)!;
    const stored = await insertFirst(this.batches, {
      _id: positionId(run._id, first.seq),
      tenantId: run.tenantId,
      runId: run._id,
      firstSeq: first.seq,
      lastSeq: last.seq,
      events: events.map(toStored),
      receivedAt: now,
    });
    if (!stored) {
      const { head, sealed } = await this.repairHead(run._id);
      if (sealed) throw errors.transitionIllegal('the run is being finalized', 'finalizing');
      const positionTaken = (await this.batches.findOne({ _id: positionId(run._id, first.seq) })) !== null;
      throw errors.conflict(
        'CHAIN_CONFLICT',
        positionTaken ? 'prevChainHash is not the run head; another event took this position' : 'an event id of this batch is already used in the run',
        { head },
      );
    }
    const newHead: ChainHead = { seq: last.seq, chainHash: last.chainHash };
    if (expectedHead.seq + 1 === first.seq) await this.cacheHead(run._id, newHead, false);
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
      if (await insertFirst(this.batches, { _id: positionId(runId, head.seq + 1), tenantId, runId, firstSeq: head.seq + 1, lastSeq: head.seq, events: [], seal, receivedAt: now })) {
        await this.cacheHead(runId, head, true);
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
    const seal = await this.seal(tenantId, runId, now);
    await this.runs.updateOne({ _id: runId, status: 'in_progress' }, { $set: { status: 'finalizing', finalizeRequestedAt: seal.sealedAt, finalHead: seal.finalHead } });
    return (await this.get(tenantId, runId))!;
  }

  /** Stores the artifact once; its id is its content hash, so a rebuilt artifact is the same record. */
  async saveArtifact(tenantId: string, artifact: RunArtifact, now = new Date()): Promise<void> {
    const { items: _items, ...eventsHeader } = artifact.events;
    const header = { ...artifact, events: eventsHeader };
    const stored = await insertFirst(this.artifacts, {
      _id: artifact.artifactId,
      tenantId,
      runId: artifact.runId,
      agentId: artifact.agentId,
      artifactHash: artifact.artifactHash,
      headerJson: canonicalize(header),
      eventCount: artifact.events.count,
      createdAt: now,
    });
    if (!stored) {
      const existing = await this.artifacts.findOne({ runId: artifact.runId });
      if (existing?._id !== artifact.artifactId) throw new Error(`run ${artifact.runId} already has artifact ${existing?._id}`);
    }
  }

  async markFinalized(runId: string, artifactId: string, verdict: Verdict, now = new Date()): Promise<void> {
    await this.runs.updateOne({ _id: runId, status: 'finalizing' }, { $set: { status: 'finalized', artifactId, verdict, finalizedAt: now } });
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
    const header = this.artifactHeader(doc);
    const items = await this.listEvents(doc.runId, doc.eventCount);
    return { ...header, events: { ...header.events, items } } as RunArtifact;
  }

  /** Runs stuck in finalizing since before `olderThan`: candidates for the sweeper. */
  staleFinalizing(olderThan: Date, limit: number): Promise<RunDoc[]> {
    return this.runs.find({ status: 'finalizing', finalizeRequestedAt: { $lt: olderThan } }).limit(limit).toArray();
  }
}
