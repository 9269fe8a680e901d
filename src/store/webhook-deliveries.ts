import type { RedisClient } from '../redis.ts';
import type { Collection, Db } from 'mongodb';
import { sha256Hex } from '../domain/crypto.ts';
import type { EventType } from '../domain/events.ts';
import { insertFirst } from './mongo.ts';
import { RevisionLog } from './revisions.ts';
import { Sequence, type SequenceEntry } from './sequence.ts';
import type { WebhookDueIndex } from './webhook-due.ts';
import type { WebhookEndpointDoc } from './webhook-endpoints.ts';
import type { WebhookRetentionIndex } from './webhook-retention.ts';

// Webhook deliveries: one per event x endpoint, with every attempt. Every lookup is by exact `_id`:
// - a delivery is `webhook_deliveries/<deliveryId>` (deterministic id), a cache of its latest revision
//   (RevisionLog): each change of scheduling state is an inserted revision, and a job carries the revision it was
//   scheduled for, so a duplicated or stale job can never record a result;
// - its attempts are `webhook_attempts/<deliveryId>#<n>` (n = 1, 2, … over its whole life);
// - an endpoint's deliveries are `webhook_index/deliveries:<endpointId>#<n>` in creation order (listing pages
//   through them newest first), and the failed or abandoned ones also `webhook_index/parked:<endpointId>#<n>`
//   (what enabling the endpoint replays);
// - a pending delivery has an entry in the due index (webhook-due.ts) for the sweeper;
// - a delivery and each index entry are entered in the retention index (webhook-retention.ts), which says when
//   they expire (re-scored at each change of the delivery: retention counts from its last attempt).
// Each index entry is written before the delivery write it stands for: a crash in between leaves an entry that
// readers check against the delivery and skip.

/** `stored`: a delivery of a pull endpoint, never sent, read through the endpoint's feed. */
export type DeliveryStatus = 'pending' | 'succeeded' | 'failed' | 'abandoned' | 'cancelled' | 'stored';

export interface WebhookDeliveryDoc {
  _id: string;
  tenantId: string;
  endpointId: string;
  eventId: string;
  eventType: EventType;
  /** Position in the endpoint's delivery index. */
  seq: number;
  rev: number;
  /**
   * pending: an attempt is due at nextAttemptAt (or running: its worker holds the delivery's lease in Redis);
   * succeeded; failed: every scheduled attempt failed; abandoned: the endpoint is disabled (replayed when it is
   * re-enabled); cancelled: the endpoint was deleted.
   */
  status: DeliveryStatus;
  /** Attempts made in the current round (a replay starts a new round); indexes the retry schedule. */
  roundAttempts: number;
  /** Attempts recorded over the delivery's life. */
  attemptCount: number;
  lastStatusCode: number | null;
  nextAttemptAt: Date | null;
  lastError: string | null;
  createdAt: Date;
  updatedAt: Date;
  succeededAt: Date | null;
  /** When a person last asked for an attempt now (retry-now, a recovery); absent on records that never were. */
  retriedAt?: Date | null;
}

/** One attempt of one delivery, recorded by insert as it happened. */
export interface WebhookAttemptDoc {
  _id: string;
  tenantId: string;
  deliveryId: string;
  endpointId: string;
  /** 1-based over the delivery's life (replays continue the count). */
  attempt: number;
  startedAt: Date;
  durationMs: number;
  statusCode: number | null;
  error: string | null;
  succeeded: boolean;
  /** Where it was sent (an endpoint's URL can change between attempts); absent on records from before it was kept. */
  url?: string;
}

/** A recovery of an endpoint's failed deliveries since a time (a background job; its progress is read back). */
export interface WebhookRecoveryDoc {
  _id: string;
  tenantId: string;
  endpointId: string;
  since: Date;
  createdAt: Date;
  /** The endpoint's last delivery position when it was asked for: the job walks down from here. */
  fromPosition: number;
  /** Progress cache: the lowest position the job has looked at, and whether it has finished (written as it goes). */
  scannedDownTo: number;
  finishedAt: Date | null;
  /** Pending deliveries are made due now as well (absent on older records: only failed and abandoned ones). */
  includePending?: boolean;
}

/** One delivery a recovery sent again: `<recoveryId>#<position>`, inserted before the delivery is made due again. */
export interface WebhookRecoveryItemDoc {
  _id: string;
  deliveryId: string;
  /** The revision it was recovered from: the delivery moved past it means this recovery's resend is done. */
  fromRev: number;
  at: Date;
}

export type AttemptResult = Pick<
  WebhookAttemptDoc,
  'startedAt' | 'durationMs' | 'statusCode' | 'error' | 'succeeded' | 'url'
>;

/** Deterministic: the same event and endpoint always give the same delivery, so a repeated fan-out adds none. */
export function deliveryIdFor(eventId: string, endpointId: string): string {
  return `whd_${sha256Hex(`${eventId}\n${endpointId}`).slice(0, 32)}`;
}

export class WebhookDeliveryStore {
  readonly log: RevisionLog<WebhookDeliveryDoc>;
  readonly attempts: Collection<WebhookAttemptDoc>;
  /** Entries carry `indexedAt`, the date their retention (TTL, see store/indexes.ts) counts from. */
  readonly byEndpoint: Sequence<{ deliveryId: string; indexedAt?: Date }>;
  readonly parked: Sequence<{ deliveryId: string; indexedAt?: Date }>;
  readonly recoveries: Collection<WebhookRecoveryDoc>;
  readonly recoveryItems: Collection<WebhookRecoveryItemDoc>;

  constructor(
    db: Db,
    redis: RedisClient,
    counterPrefix: string,
    private readonly due: WebhookDueIndex,
    readonly retention: WebhookRetentionIndex,
  ) {
    this.log = new RevisionLog<WebhookDeliveryDoc>(db, 'webhook_deliveries', 'webhook_delivery_revisions');
    this.attempts = db.collection<WebhookAttemptDoc>('webhook_attempts');
    this.byEndpoint = new Sequence<{ deliveryId: string; indexedAt?: Date }>(db, 'webhook_index', redis, counterPrefix);
    this.parked = new Sequence<{ deliveryId: string; indexedAt?: Date }>(db, 'webhook_index', redis, counterPrefix);
    this.recoveries = db.collection<WebhookRecoveryDoc>('webhook_recoveries');
    this.recoveryItems = db.collection<WebhookRecoveryItemDoc>('webhook_recovery_items');
  }

  get(id: string): Promise<WebhookDeliveryDoc | null> {
    return this.log.get(id);
  }

  /** The delivery if it is still at revision `rev` (what a job scheduled for that revision acts on), else null. */
  getAt(id: string, rev: number): Promise<WebhookDeliveryDoc | null> {
    return this.log.getAt(id, rev);
  }

  /**
   * The delivery of this event to this endpoint, created once. A delivery to a disabled endpoint is created
   * `abandoned` (and parked), so re-enabling the endpoint replays it.
   */
  async ensure(input: {
    eventId: string;
    eventType: EventType;
    endpoint: WebhookEndpointDoc;
    now: Date;
  }): Promise<WebhookDeliveryDoc> {
    const _id = deliveryIdFor(input.eventId, input.endpoint._id);
    const existing = await this.get(_id);
    if (existing) return existing;
    const { endpoint, now } = input;
    const disabled = endpoint.status !== 'active';
    const pulled = endpoint.delivery === 'pull';
    const seq = await this.byEndpoint.append(
      deliveriesOwner(endpoint._id),
      { deliveryId: _id, indexedAt: now },
      (slot) => this.retention.noteEntry(slot, now),
    );
    const doc: WebhookDeliveryDoc = {
      _id,
      tenantId: endpoint.tenantId,
      endpointId: endpoint._id,
      eventId: input.eventId,
      eventType: input.eventType,
      seq,
      rev: 0,
      status: pulled ? 'stored' : disabled ? 'abandoned' : 'pending',
      roundAttempts: 0,
      attemptCount: 0,
      lastStatusCode: null,
      nextAttemptAt: pulled || disabled ? null : now,
      lastError: !pulled && disabled ? `endpoint disabled: ${endpoint.disabledReason ?? 'no reason given'}` : null,
      createdAt: now,
      updatedAt: now,
      succeededAt: null,
    };
    await this.index(doc);
    if (await this.log.create(doc)) return doc;
    // A concurrent fan-out created it first; this call's index entries name a position the delivery does not hold.
    const winner = await this.get(_id);
    if (!winner) throw new Error(`delivery ${_id} vanished after a duplicate insert`);
    return winner;
  }

  /**
   * Moves the delivery from exactly `current.rev` to its next revision, counting `attempt` if one was just made.
   * The attempt record and the new state's index entries are written first (side by side: neither needs the
   * other). Returns the new state, or null when something else (a replay, another worker) moved it first; the
   * attempt stays recorded either way, as it happened.
   */
  async transition(
    current: WebhookDeliveryDoc,
    changes: Pick<WebhookDeliveryDoc, 'status' | 'nextAttemptAt' | 'lastError'> & Partial<WebhookDeliveryDoc>,
    attempt?: AttemptResult,
  ): Promise<WebhookDeliveryDoc | null> {
    const now = new Date();
    const next = {
      ...current,
      ...changes,
      updatedAt: now,
      ...(changes.status === 'succeeded' ? { succeededAt: now } : {}),
    };
    const [n] = await Promise.all([attempt ? this.recordAttempt(current, attempt) : null, this.index(next)]);
    const counted =
      n === null
        ? {}
        : { attemptCount: n, roundAttempts: current.roundAttempts + 1, lastStatusCode: attempt!.statusCode };
    return this.log.commit(current, { ...next, ...counted });
  }

  /** The index entries a delivery in this state needs, written before the state itself (see the header). */
  private async index(d: WebhookDeliveryDoc): Promise<void> {
    const retained = this.retention.noteDelivery(d._id, d.updatedAt);
    if (d.status === 'pending' && d.nextAttemptAt) {
      await this.due.add({ kind: 'deliver', tenantId: d.tenantId, deliveryId: d._id, dueAt: d.nextAttemptAt });
    } else if (d.status === 'failed' || d.status === 'abandoned') {
      await this.parked.append(parkedOwner(d.endpointId), { deliveryId: d._id, indexedAt: d.updatedAt }, (slot) =>
        this.retention.noteEntry(slot, d.updatedAt),
      );
    }
    await retained;
  }

  /**
   * Records an attempt as it happened (before the delivery's state moves on, so an attempt whose worker dies right
   * after it is still listed). Returns its number: the first free one after those the delivery knows of.
   */
  private async recordAttempt(current: WebhookDeliveryDoc, result: AttemptResult): Promise<number> {
    for (let n = current.attemptCount + 1; ; n++) {
      const doc = {
        _id: `${current._id}#${n}`,
        tenantId: current.tenantId,
        deliveryId: current._id,
        endpointId: current.endpointId,
        attempt: n,
        ...result,
      };
      if (await insertFirst(this.attempts, doc)) return n;
    }
  }

  /** Every attempt of the delivery, oldest first. */
  async attemptsOf(delivery: WebhookDeliveryDoc): Promise<WebhookAttemptDoc[]> {
    const known = await Promise.all(
      Array.from({ length: delivery.attemptCount }, (_, i) =>
        this.attempts.findOne({ _id: `${delivery._id}#${i + 1}` }),
      ),
    );
    const attempts = known.filter((a): a is WebhookAttemptDoc => a !== null);
    // Attempts recorded by a worker that died before updating the delivery follow the known ones.
    for (let n = delivery.attemptCount + 1; ; n++) {
      const next = await this.attempts.findOne({ _id: `${delivery._id}#${n}` });
      if (!next) return attempts;
      attempts.push(next);
    }
  }

  /** Last position in the endpoint's delivery index. */
  lastPosition(endpointId: string): Promise<number> {
    return this.byEndpoint.head(deliveriesOwner(endpointId));
  }

  /** The delivery at this position of the endpoint's index, if the position is really its own. */
  async atPosition(endpointId: string, n: number): Promise<WebhookDeliveryDoc | null> {
    const entry = await this.byEndpoint.get(deliveriesOwner(endpointId), n);
    const delivery = entry ? await this.get(entry.deliveryId) : null;
    return delivery && delivery.endpointId === endpointId && delivery.seq === n ? delivery : null;
  }

  /** The entry at this position of the endpoint's delivery index and its delivery (null each when missing). */
  async slotAt(
    endpointId: string,
    n: number,
  ): Promise<{ entry: IndexEntry | null; delivery: WebhookDeliveryDoc | null }> {
    const entry = await this.byEndpoint.get(deliveriesOwner(endpointId), n);
    return { entry, delivery: entry ? await this.get(entry.deliveryId) : null };
  }

  /** An index or parked entry by its `_id` (what the retention index names). */
  indexEntry(slotId: string): Promise<IndexEntry | null> {
    return this.byEndpoint.collection.findOne({ _id: slotId });
  }

  /** Removes an index or parked entry; returns the endpoint whose delivery index it belonged to, if it did. */
  async removeIndexEntry(entry: IndexEntry): Promise<string | null> {
    await this.byEndpoint.collection.deleteOne({ _id: entry._id });
    return entry.owner.startsWith('deliveries:') ? entry.owner.slice('deliveries:'.length) : null;
  }

  /**
   * Removes the delivery with its attempts and revisions, by `_id` only (its index and parked entries expire on
   * their own, as soon as it is gone). Attempts and revisions go newest first, one at a time, and the delivery's own
   * document last: a sweep that dies halfway leaves a prefix of each behind and the document that names them, so
   * the next sweep removes the rest.
   */
  async expire(d: WebhookDeliveryDoc): Promise<void> {
    let lastAttempt = d.attemptCount;
    while (await this.attempts.findOne({ _id: `${d._id}#${lastAttempt + 1}` })) lastAttempt++;
    for (let n = lastAttempt; n >= 1; n--) await this.attempts.deleteOne({ _id: `${d._id}#${n}` });
    for (let r = d.rev; r >= 1; r--) await this.log.revisions.deleteOne({ _id: `${d._id}#${r}` });
    await this.log.docs.deleteOne({ _id: d._id });
  }

  /** A recovery asked for (its id is new: random, or derived from the request's idempotency key). */
  async recordRecovery(recovery: WebhookRecoveryDoc): Promise<WebhookRecoveryDoc> {
    if (await insertFirst(this.recoveries, recovery)) return recovery;
    return (await this.recoveryOf(recovery._id))!;
  }

  recoveryOf(recoveryId: string): Promise<WebhookRecoveryDoc | null> {
    return this.recoveries.findOne({ _id: recoveryId });
  }

  /** A cache of how far the job got (a lost write only makes a progress read look at more positions). */
  async noteRecoveryProgress(recoveryId: string, scannedDownTo: number, finishedAt: Date | null): Promise<void> {
    await this.recoveries.updateOne({ _id: recoveryId }, { $set: { scannedDownTo, finishedAt } });
  }

  /** The recovery's claim on the delivery at `position` (first writer wins): the claim that stands, this one or an earlier. */
  async claimRecoveryItem(
    recoveryId: string,
    position: number,
    delivery: WebhookDeliveryDoc,
  ): Promise<WebhookRecoveryItemDoc> {
    const item: WebhookRecoveryItemDoc = {
      _id: recoveryItemId(recoveryId, position),
      deliveryId: delivery._id,
      fromRev: delivery.rev,
      at: new Date(),
    };
    if (await insertFirst(this.recoveryItems, item)) return item;
    return (await this.recoveryItems.findOne({ _id: item._id }))!;
  }

  recoveryItemAt(recoveryId: string, position: number): Promise<WebhookRecoveryItemDoc | null> {
    return this.recoveryItems.findOne({ _id: recoveryItemId(recoveryId, position) });
  }

  lastParked(endpointId: string): Promise<number> {
    return this.parked.head(parkedOwner(endpointId));
  }

  async parkedAt(endpointId: string, n: number): Promise<WebhookDeliveryDoc | null> {
    const entry = await this.parked.get(parkedOwner(endpointId), n);
    return entry ? this.get(entry.deliveryId) : null;
  }
}

export type IndexEntry = SequenceEntry<{ deliveryId: string; indexedAt?: Date }>;

export function recoveryItemId(recoveryId: string, position: number): string {
  return `${recoveryId}#${position}`;
}

function deliveriesOwner(endpointId: string): string {
  return `deliveries:${endpointId}`;
}

function parkedOwner(endpointId: string): string {
  return `parked:${endpointId}`;
}
