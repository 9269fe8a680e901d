import type { AnyBulkWriteOperation, Collection, Db } from 'mongodb';
import { canonicalize } from '../domain/canonical-json.ts';
import type { RunArtifact } from '../domain/artifact.ts';
import type { ChainHead, EventEnvelope } from '../domain/event-chain.ts';
import { errors } from '../domain/errors.ts';
import type { Terms, Verdict } from '../domain/terms.ts';
import { isDuplicateKey } from './mongo.ts';
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
  /** The chain head; a cache of the highest stored event, repaired from the events if an appender crashed. */
  head: ChainHead;
  createdAt: Date;
  /** When finalize was first requested: it is the artifact's finalizedAt, so a retried build is identical. */
  finalizeRequestedAt: Date | null;
  /** The head frozen by finalize: the artifact covers exactly events 1..finalHead.seq. */
  finalHead: ChainHead | null;
  finalizedAt: Date | null;
}

/** A stored event: the envelope, with the payload kept as its canonical JSON so it round-trips exactly. */
export interface RunEventDoc extends Omit<EventEnvelope, 'payload'> {
  /** `${runId}:${seq}`: one document per position, so exactly one writer can win each seq. */
  _id: string;
  tenantId: string;
  payloadJson: string;
  receivedAt: Date;
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

export function eventDocId(runId: string, seq: number): string {
  return `${runId}:${seq}`;
}

export function toEnvelope(doc: RunEventDoc): EventEnvelope {
  return {
    v: doc.v,
    id: doc.id,
    runId: doc.runId,
    seq: doc.seq,
    type: doc.type,
    at: doc.at,
    payload: JSON.parse(doc.payloadJson),
    prevChainHash: doc.prevChainHash,
    payloadHash: doc.payloadHash,
    chainHash: doc.chainHash,
    signerKeyId: doc.signerKeyId,
    signature: doc.signature,
  };
}

export class RunStore {
  readonly runs: Collection<RunDoc>;
  readonly events: Collection<RunEventDoc>;
  readonly artifacts: Collection<ArtifactDoc>;

  constructor(db: Db) {
    this.runs = db.collection<RunDoc>('runs');
    this.events = db.collection<RunEventDoc>('run_events');
    this.artifacts = db.collection<ArtifactDoc>('artifacts');
  }

  forTenant(tenantId: string) {
    return new TenantScopedCollection(this.runs, tenantId);
  }

  async create(run: RunDoc): Promise<RunDoc> {
    await this.runs.insertOne(run);
    return run;
  }

  get(tenantId: string, runId: string): Promise<RunDoc | null> {
    return this.forTenant(tenantId).findOne({ _id: runId });
  }

  getAny(runId: string): Promise<RunDoc | null> {
    return this.runs.findOne({ _id: runId });
  }

  /** Stored events of the run with these ids (to recognise a resent event). */
  findByEventIds(runId: string, ids: string[]): Promise<RunEventDoc[]> {
    return this.events.find({ runId, id: { $in: ids } }).toArray();
  }

  /** Events 1..upToSeq in order. */
  async listEvents(runId: string, upToSeq: number): Promise<EventEnvelope[]> {
    const docs = await this.events.find({ runId, seq: { $lte: upToSeq } }).sort({ seq: 1 }).toArray();
    return docs.map(toEnvelope);
  }

  /**
   * Stores verified events after `expectedHead`. Exactly one writer wins each seq (the `runId:seq` id is unique);
   * the loser gets CHAIN_CONFLICT with the real head. The head moves only while the run is in progress, so events
   * that lose a race with finalize are removed again and the caller gets TRANSITION_ILLEGAL.
   */
  async append(run: RunDoc, expectedHead: ChainHead, events: EventEnvelope[], now = new Date()): Promise<ChainHead> {
    const docs: RunEventDoc[] = events.map((e) => {
      const { payload, ...rest } = e;
      return { ...rest, _id: eventDocId(run._id, e.seq), tenantId: run.tenantId, payloadJson: canonicalize(payload), receivedAt: now };
    });
    try {
      await this.events.insertMany(docs, { ordered: true });
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      await this.removeOwn(docs);
      const head = await this.repairHead(run._id);
      throw errors.conflict('CHAIN_CONFLICT', 'prevChainHash is not the run head; another event took this position', { head });
    }
    const last = events.at(-1)!;
    const newHead: ChainHead = { seq: last.seq, chainHash: last.chainHash };
    const moved = await this.runs.updateOne(
      { _id: run._id, status: 'in_progress', 'head.seq': expectedHead.seq },
      { $set: { head: newHead } },
    );
    if (moved.modifiedCount === 1) return newHead;

    // A head repair may already have moved the head over our events; or finalize froze the run first.
    const fresh = await this.runs.findOne({ _id: run._id });
    const covered = fresh?.status === 'in_progress' ? fresh.head : fresh?.finalHead;
    if (fresh && covered && covered.seq >= last.seq) return fresh.status === 'in_progress' ? fresh.head : newHead;
    await this.removeOwn(docs);
    throw errors.transitionIllegal('the run is no longer in progress', fresh?.status ?? 'unknown');
  }

  /** Deletes these exact events (by position and chain hash), leaving any other writer's events alone. */
  private async removeOwn(docs: RunEventDoc[]): Promise<void> {
    if (docs.length === 0) return;
    const ops: AnyBulkWriteOperation<RunEventDoc>[] = docs.map((d) => ({ deleteOne: { filter: { _id: d._id, chainHash: d.chainHash } } }));
    await this.events.bulkWrite(ops, { ordered: false });
  }

  /** Moves the cached head up to the highest stored event, if an appender stopped between insert and head update. */
  async repairHead(runId: string): Promise<ChainHead> {
    const [last] = await this.events.find({ runId }).sort({ seq: -1 }).limit(1).toArray();
    const run = await this.runs.findOne({ _id: runId });
    if (!run) throw errors.notFound('run');
    if (!last || run.status !== 'in_progress' || last.seq <= run.head.seq) return run.head;
    const head: ChainHead = { seq: last.seq, chainHash: last.chainHash };
    await this.runs.updateOne({ _id: runId, status: 'in_progress', 'head.seq': { $lt: last.seq } }, { $set: { head } });
    return (await this.runs.findOne({ _id: runId }))?.head ?? head;
  }

  /**
   * in_progress -> finalizing, freezing the head the artifact will cover. Returns the run after the change, or
   * as it is when it had already left in_progress (a repeat finalize is harmless).
   */
  async beginFinalize(tenantId: string, runId: string, now = new Date()): Promise<RunDoc> {
    for (;;) {
      const run = await this.get(tenantId, runId);
      if (!run) throw errors.notFound('run');
      if (run.status !== 'in_progress') return run;
      const head = await this.repairHead(runId);
      const frozen = await this.forTenant(tenantId).findOneAndUpdate(
        { _id: runId, status: 'in_progress', 'head.seq': head.seq },
        { $set: { status: 'finalizing', finalizeRequestedAt: now, finalHead: head } },
      );
      if (frozen) return frozen;
      // An append moved the head in between: read again and freeze the newer head.
    }
  }

  /** Drops events beyond the frozen head (left by appenders that lost the race with finalize and then died). */
  async dropEventsAfter(runId: string, seq: number): Promise<void> {
    await this.events.deleteMany({ runId, seq: { $gt: seq } });
  }

  /** Stores the artifact once; its id is its content hash, so a rebuilt artifact is the same record. */
  async saveArtifact(tenantId: string, artifact: RunArtifact, now = new Date()): Promise<void> {
    const { items: _items, ...eventsHeader } = artifact.events;
    const header = { ...artifact, events: eventsHeader };
    await this.artifacts.updateOne(
      { _id: artifact.artifactId },
      {
        $setOnInsert: {
          _id: artifact.artifactId,
          tenantId,
          runId: artifact.runId,
          agentId: artifact.agentId,
          artifactHash: artifact.artifactHash,
          headerJson: canonicalize(header),
          eventCount: artifact.events.count,
          createdAt: now,
        },
      },
      { upsert: true },
    );
  }

  async markFinalized(runId: string, artifactId: string, verdict: Verdict, now = new Date()): Promise<void> {
    await this.runs.updateOne(
      { _id: runId, status: 'finalizing' },
      { $set: { status: 'finalized', artifactId, verdict, finalizedAt: now } },
    );
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
