import type { Collection, Db, Filter } from 'mongodb';
import { newId, sha256Hex } from '../domain/crypto.ts';
import type { EventType } from '../domain/events.ts';
import { decryptAtRest, encryptAtRest } from '../domain/crypto.ts';
import { generateWebhookSecret } from '../domain/webhook-signing.ts';
import { insertFirst } from './mongo.ts';
import { TenantScopedCollection } from './tenant-scope.ts';

// Webhook endpoints (the registry) and deliveries (one record per event x endpoint, with every attempt).
// Multi-document transactions are not available: each step is a single-document conditional write, and the
// delivery's `rev` makes every job act on exactly the revision it was scheduled for.
// Cost note: on FerretDB (SQLite) reads by _id are cheap but every update scans its collection, so the delivery path
// keeps to one update per attempt (the attempt lease lives in Redis, see workers/webhook-dispatch.ts).

export type EndpointStatus = 'active' | 'disabled' | 'revoked';

export interface SealedSecret {
  /** AES-256-GCM, bound to the endpoint id; never the plaintext. */
  sealed: string;
  createdAt: Date;
  /** null for the current secret; when the previous one stops signing deliveries after a rotation. */
  expiresAt: Date | null;
}

export interface WebhookEndpointDoc {
  _id: string;
  tenantId: string;
  url: string;
  events: EventType[];
  description: string | null;
  status: EndpointStatus;
  disabledReason: string | null;
  disabledAt: Date | null;
  /** secrets[0] is the current secret; the others are previous ones still inside their grace period. */
  secrets: SealedSecret[];
  /** Bumped by every rotation, so two concurrent rotations cannot both win. */
  secretRev: number;
  /** First failed attempt since the last success; null while the endpoint is healthy. */
  failingSince: Date | null;
  lastSuccessAt: Date | null;
  createdAt: Date;
  updatedAt: Date;
  revokedAt: Date | null;
}

export type DeliveryStatus = 'pending' | 'succeeded' | 'failed' | 'abandoned' | 'cancelled';

/** One attempt of one delivery: insert-only records in their own collection (inserts are cheap on FerretDB). */
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
}

export interface WebhookDeliveryDoc {
  _id: string;
  tenantId: string;
  endpointId: string;
  eventId: string;
  eventType: EventType;
  /**
   * pending: an attempt is due at nextAttemptAt (or running: its worker holds the delivery's lease in Redis); succeeded;
   * failed: every scheduled attempt failed; abandoned: the endpoint is disabled (replayed when it is re-enabled);
   * cancelled: the endpoint was deleted.
   */
  status: DeliveryStatus;
  /** Incremented by every change of scheduling state; a job carries the rev it was scheduled for. */
  rev: number;
  /** Attempts made in the current round (a replay starts a new round); indexes the retry schedule. */
  roundAttempts: number;
  /** Attempts recorded over the delivery's life (each one is a WebhookAttemptDoc). */
  attemptCount: number;
  lastStatusCode: number | null;
  nextAttemptAt: Date | null;
  lastError: string | null;
  createdAt: Date;
  updatedAt: Date;
  succeededAt: Date | null;
}

/** Deterministic: the same event and endpoint always give the same delivery, so a repeated fan-out adds none. */
export function deliveryIdFor(eventId: string, endpointId: string): string {
  return `whd_${sha256Hex(`${eventId}\n${endpointId}`).slice(0, 32)}`;
}

/** Never more than this many secrets sign a delivery (the current one plus previous ones in their grace period). */
const MAX_SECRETS = 5;

export interface PageCursor {
  createdAt: Date;
  id: string;
}

export function encodeCursor(c: PageCursor): string {
  return Buffer.from(`${c.createdAt.getTime()}.${c.id}`, 'utf8').toString('base64url');
}

export function decodeCursor(cursor: string): PageCursor | null {
  const text = Buffer.from(cursor, 'base64url').toString('utf8');
  const dot = text.indexOf('.');
  if (dot <= 0) return null;
  const ms = Number(text.slice(0, dot));
  const id = text.slice(dot + 1);
  if (!Number.isSafeInteger(ms) || !/^[A-Za-z0-9_]{1,64}$/.test(id)) return null;
  return { createdAt: new Date(ms), id };
}

/** Newest first, strictly after the cursor. */
function afterCursor(cursor: PageCursor | null): Record<string, unknown> {
  if (!cursor) return {};
  return { $or: [{ createdAt: { $lt: cursor.createdAt } }, { createdAt: cursor.createdAt, _id: { $lt: cursor.id } }] };
}

/**
 * An endpoint's deletion, recorded by insert. The dispatcher updates endpoint documents (failure tracking) while a
 * DELETE may arrive, and on FerretDB one of two concurrent updates is lost, which could revive a deleted endpoint;
 * an inserted record cannot be lost. The status in the endpoint document is only a cache of it.
 */
interface EndpointDeletionDoc {
  _id: string;
  tenantId: string;
  deletedAt: Date;
}

export class WebhookEndpointStore {
  readonly endpoints: Collection<WebhookEndpointDoc>;
  readonly deletions: Collection<EndpointDeletionDoc>;

  constructor(
    db: Db,
    private readonly encryptionKey: Buffer,
  ) {
    this.endpoints = db.collection<WebhookEndpointDoc>('webhook_endpoints');
    this.deletions = db.collection<EndpointDeletionDoc>('webhook_endpoint_deletions');
  }

  /** The endpoints as their deletion records say (one id lookup each). */
  private async overlayDeletions(docs: WebhookEndpointDoc[]): Promise<WebhookEndpointDoc[]> {
    const records = await Promise.all(docs.map((d) => this.deletions.findOne({ _id: d._id })));
    return docs.map((d, i) => (records[i] ? { ...d, status: 'revoked' as const, revokedAt: d.revokedAt ?? records[i]!.deletedAt } : d));
  }

  private scoped(tenantId: string) {
    return new TenantScopedCollection(this.endpoints, tenantId);
  }

  /** Creates an endpoint; the plaintext secret is returned once and only its sealed form is stored. */
  async create(tenantId: string, input: { url: string; events: EventType[]; description?: string | null }) {
    const _id = newId('whe');
    const secret = generateWebhookSecret();
    const now = new Date();
    const doc: Omit<WebhookEndpointDoc, 'tenantId'> = {
      _id,
      url: input.url,
      events: input.events,
      description: input.description ?? null,
      status: 'active',
      disabledReason: null,
      disabledAt: null,
      secrets: [{ sealed: encryptAtRest(this.encryptionKey, secret, _id), createdAt: now, expiresAt: null }],
      secretRev: 0,
      failingSince: null,
      lastSuccessAt: null,
      createdAt: now,
      updatedAt: now,
      revokedAt: null,
    };
    await this.scoped(tenantId).insertOne(doc);
    return { endpoint: { ...doc, tenantId } as WebhookEndpointDoc, secret };
  }

  /** A live (not deleted) endpoint of this tenant; another tenant's id is simply not found. */
  async get(tenantId: string, id: string): Promise<WebhookEndpointDoc | null> {
    const doc = await this.getAny(tenantId, id);
    return doc && doc.status !== 'revoked' ? doc : null;
  }

  /** Including deleted ones (the worker needs to know an endpoint was deleted). */
  async getAny(tenantId: string, id: string): Promise<WebhookEndpointDoc | null> {
    const doc = await this.scoped(tenantId).findOne({ _id: id });
    return doc ? (await this.overlayDeletions([doc]))[0]! : null;
  }

  async list(tenantId: string, limit: number, cursor: PageCursor | null): Promise<WebhookEndpointDoc[]> {
    const docs = await this.scoped(tenantId)
      .find({ status: { $ne: 'revoked' }, ...afterCursor(cursor) } as Filter<WebhookEndpointDoc>)
      .sort({ createdAt: -1, _id: -1 })
      .limit(limit)
      .toArray();
    return (await this.overlayDeletions(docs)).filter((d) => d.status !== 'revoked');
  }

  /** Endpoints that receive this event: subscribed, not deleted, and registered before the event happened. */
  async subscribers(tenantId: string, type: EventType, eventCreatedAt: Date): Promise<WebhookEndpointDoc[]> {
    const docs = await this.endpoints
      .find({ tenantId, status: { $in: ['active', 'disabled'] }, events: type, createdAt: { $lte: eventCreatedAt } })
      .toArray();
    return (await this.overlayDeletions(docs)).filter((d) => d.status !== 'revoked');
  }

  /** Deletes an endpoint (recorded by insert; see EndpointDeletionDoc). Null when there is no live one. */
  async revoke(tenantId: string, id: string): Promise<WebhookEndpointDoc | null> {
    const live = await this.get(tenantId, id);
    if (!live) return null;
    const now = new Date();
    if (!(await insertFirst(this.deletions, { _id: id, tenantId, deletedAt: now }))) return null; // deleted concurrently
    await this.endpoints.updateOne({ _id: id }, { $set: { status: 'revoked', revokedAt: now, updatedAt: now } }); // cache
    return { ...live, status: 'revoked', revokedAt: now, updatedAt: now };
  }

  /**
   * New current secret; the old current one keeps signing until now + grace (dropped at once when grace is 0).
   * Optimistic on secretRev: a concurrent rotation makes this retry on the fresh document.
   */
  async rotate(tenantId: string, id: string, graceSeconds: number): Promise<{ endpoint: WebhookEndpointDoc; secret: string } | null> {
    for (let attempt = 0; attempt < 5; attempt++) {
      const current = await this.get(tenantId, id);
      if (!current) return null;
      const now = new Date();
      const secret = generateWebhookSecret();
      const [head, ...older] = current.secrets;
      const previous: SealedSecret[] = [];
      if (head && graceSeconds > 0) previous.push({ ...head, expiresAt: new Date(now.getTime() + graceSeconds * 1000) });
      for (const s of older) if (s.expiresAt && s.expiresAt.getTime() > now.getTime()) previous.push(s);
      const secrets = [
        { sealed: encryptAtRest(this.encryptionKey, secret, id), createdAt: now, expiresAt: null },
        ...previous.slice(0, MAX_SECRETS - 1),
      ];
      const updated = await this.scoped(tenantId).findOneAndUpdate(
        { _id: id, secretRev: current.secretRev, status: { $ne: 'revoked' } },
        { $set: { secrets, updatedAt: now }, $inc: { secretRev: 1 } },
      );
      if (updated) return { endpoint: updated, secret };
    }
    throw new Error(`could not rotate the secret of ${id}: too many concurrent rotations`);
  }

  /** Plaintext secrets that sign a delivery made now: the current one, then previous ones still in their grace. */
  signingSecrets(endpoint: WebhookEndpointDoc, now: Date = new Date()): string[] {
    const [current, ...previous] = endpoint.secrets;
    if (!current) throw new Error(`endpoint ${endpoint._id} has no secret`);
    const secrets = [decryptAtRest(this.encryptionKey, current.sealed, endpoint._id)];
    for (const s of previous) {
      if (s.expiresAt === null || s.expiresAt.getTime() <= now.getTime()) continue;
      try {
        secrets.push(decryptAtRest(this.encryptionKey, s.sealed, endpoint._id));
      } catch {
        // An unreadable previous secret only loses its extra signature; the current one still signs.
      }
    }
    return secrets;
  }

  /** Makes an endpoint active again (also harmless on an active one). */
  enable(tenantId: string, id: string): Promise<WebhookEndpointDoc | null> {
    return this.scoped(tenantId).findOneAndUpdate(
      { _id: id, status: { $in: ['active', 'disabled'] } },
      { $set: { status: 'active', disabledReason: null, disabledAt: null, failingSince: null, updatedAt: new Date() } },
    );
  }

  /** Disables an active endpoint; false when it was not active (already disabled or deleted). */
  async disable(id: string, reason: string): Promise<boolean> {
    const now = new Date();
    const res = await this.endpoints.updateOne(
      { _id: id, status: 'active' },
      { $set: { status: 'disabled', disabledReason: reason, disabledAt: now, updatedAt: now } },
    );
    return res.modifiedCount === 1;
  }

  async markSuccess(id: string, at: Date): Promise<void> {
    await this.endpoints.updateOne({ _id: id }, { $set: { lastSuccessAt: at, failingSince: null } });
  }

  /** Records a failure; returns since when the endpoint has been failing without a success in between. */
  async markFailure(id: string, at: Date): Promise<Date> {
    await this.endpoints.updateOne({ _id: id, failingSince: null }, { $set: { failingSince: at } });
    const doc = await this.endpoints.findOne({ _id: id }, { projection: { failingSince: 1 } });
    return doc?.failingSince ?? at;
  }
}

export class WebhookDeliveryStore {
  readonly deliveries: Collection<WebhookDeliveryDoc>;

  readonly attempts: Collection<WebhookAttemptDoc>;

  constructor(db: Db) {
    this.deliveries = db.collection<WebhookDeliveryDoc>('webhook_deliveries');
    this.attempts = db.collection<WebhookAttemptDoc>('webhook_attempts');
  }

  /**
   * The delivery of this event to this endpoint, created once (upsert on the deterministic id). A delivery to a
   * disabled endpoint is created `abandoned`, so re-enabling the endpoint replays it.
   */
  async ensure(input: { tenantId: string; eventId: string; eventType: EventType; endpoint: WebhookEndpointDoc; now: Date }): Promise<WebhookDeliveryDoc> {
    const _id = deliveryIdFor(input.eventId, input.endpoint._id);
    const disabled = input.endpoint.status !== 'active';
    const doc: WebhookDeliveryDoc = {
      _id,
      tenantId: input.tenantId,
      endpointId: input.endpoint._id,
      eventId: input.eventId,
      eventType: input.eventType,
      status: disabled ? 'abandoned' : 'pending',
      rev: 0,
      roundAttempts: 0,
      attemptCount: 0,
      lastStatusCode: null,
      nextAttemptAt: disabled ? null : input.now,
      lastError: disabled ? `endpoint disabled: ${input.endpoint.disabledReason ?? 'no reason given'}` : null,
      createdAt: input.now,
      updatedAt: input.now,
      succeededAt: null,
    };
    // insertOne, not an upsert with $setOnInsert: FerretDB drops null and [] values from $setOnInsert documents.
    if (await insertFirst(this.deliveries, doc)) return doc;
    const existing = await this.deliveries.findOne({ _id });
    if (!existing) throw new Error(`delivery ${_id} vanished after a duplicate insert`);
    return existing;
  }

  get(id: string): Promise<WebhookDeliveryDoc | null> {
    return this.deliveries.findOne({ _id: id });
  }

  /**
   * Records an attempt as it happened (before the delivery's state moves on, so an attempt whose worker dies right
   * after it is still listed). Returns its number.
   */
  async recordAttempt(current: WebhookDeliveryDoc, attempt: Omit<WebhookAttemptDoc, '_id' | 'tenantId' | 'deliveryId' | 'endpointId' | 'attempt'>): Promise<number> {
    const n = (current.attemptCount ?? 0) + 1;
    await this.attempts.insertOne({
      _id: newId('wha'),
      tenantId: current.tenantId,
      deliveryId: current._id,
      endpointId: current.endpointId,
      attempt: n,
      ...attempt,
    });
    return n;
  }

  /** Attempts of these deliveries, oldest first, grouped by delivery. */
  async attemptsOf(tenantId: string, deliveryIds: string[]): Promise<Map<string, WebhookAttemptDoc[]>> {
    const byDelivery = new Map<string, WebhookAttemptDoc[]>();
    if (deliveryIds.length === 0) return byDelivery;
    const docs = await this.attempts.find({ tenantId, deliveryId: { $in: deliveryIds } }).sort({ startedAt: 1 }).toArray();
    for (const d of docs) {
      const list = byDelivery.get(d.deliveryId) ?? [];
      list.push(d);
      byDelivery.set(d.deliveryId, list);
    }
    return byDelivery;
  }

  /**
   * Moves the delivery from exactly `current.rev` to the next state, counting the attempt just made (if any).
   * Returns the new rev, or null when something else (a replay, a disable, another worker) moved it first.
   */
  async settle(
    current: WebhookDeliveryDoc,
    next: { status: DeliveryStatus; nextAttemptAt: Date | null; lastError: string | null; attempt?: { statusCode: number | null } },
  ): Promise<number | null> {
    const now = new Date();
    const res = await this.deliveries.updateOne(
      { _id: current._id, rev: current.rev },
      {
        $set: {
          status: next.status,
          nextAttemptAt: next.nextAttemptAt,
          lastError: next.lastError,
          updatedAt: now,
          ...(next.attempt
            ? { roundAttempts: current.roundAttempts + 1, attemptCount: (current.attemptCount ?? 0) + 1, lastStatusCode: next.attempt.statusCode }
            : {}),
          ...(next.status === 'succeeded' ? { succeededAt: now } : {}),
        },
        $inc: { rev: 1 },
      },
    );
    return res.modifiedCount === 1 ? current.rev + 1 : null;
  }

  /**
   * Stops every pending delivery of a disabled endpoint. An attempt running right now loses the race: its result is
   * not recorded, and the delivery is replayed with the others when the endpoint is re-enabled.
   */
  async abandonPending(endpointId: string, reason: string): Promise<number> {
    const now = new Date();
    const res = await this.deliveries.updateMany(
      { endpointId, status: 'pending' },
      { $set: { status: 'abandoned', nextAttemptAt: null, lastError: reason, updatedAt: now }, $inc: { rev: 1 } },
    );
    return res.modifiedCount;
  }

  /** Cancels what is still to be delivered to a deleted endpoint (an attempt running right now may still finish). */
  async cancelPending(tenantId: string, endpointId: string): Promise<number> {
    const now = new Date();
    const res = await this.deliveries.updateMany(
      { tenantId, endpointId, status: { $in: ['pending', 'failed', 'abandoned'] } },
      { $set: { status: 'cancelled', nextAttemptAt: null, lastError: 'endpoint deleted', updatedAt: now }, $inc: { rev: 1 } },
    );
    return res.modifiedCount;
  }

  /** Makes every failed or abandoned delivery of the endpoint due now, with a fresh retry schedule. */
  async replay(tenantId: string, endpointId: string): Promise<number> {
    const now = new Date();
    const res = await this.deliveries.updateMany(
      { tenantId, endpointId, status: { $in: ['failed', 'abandoned'] } },
      { $set: { status: 'pending', nextAttemptAt: now, roundAttempts: 0, updatedAt: now }, $inc: { rev: 1 } },
    );
    return res.modifiedCount;
  }

  /** Pending deliveries whose attempt is due (oldest due first). */
  due(now: Date, limit: number, filter: { tenantId?: string; endpointId?: string } = {}): Promise<WebhookDeliveryDoc[]> {
    return this.deliveries
      .find({ ...filter, status: 'pending', nextAttemptAt: { $lte: now } })
      .sort({ nextAttemptAt: 1 })
      .limit(limit)
      .toArray();
  }

  listForEndpoint(
    tenantId: string,
    endpointId: string,
    options: { limit: number; cursor: PageCursor | null; status?: DeliveryStatus },
  ): Promise<WebhookDeliveryDoc[]> {
    return new TenantScopedCollection(this.deliveries, tenantId)
      .find({ endpointId, ...(options.status ? { status: options.status } : {}), ...afterCursor(options.cursor) } as Filter<WebhookDeliveryDoc>)
      .sort({ createdAt: -1, _id: -1 })
      .limit(options.limit)
      .toArray();
  }
}
