import type { Collection, Db } from 'mongodb';
import type { RedisClient } from '../redis.ts';
import { sha256Hex } from '../domain/crypto.ts';
import type { EventType } from '../domain/events.ts';
import { insertFirst } from './mongo.ts';
import type { WebhookDueIndex } from './webhook-due.ts';

/**
 * An event the service emitted, recorded durably before anything is delivered. Its id is derived from what caused
 * it (e.g. `run.finalized:<runId>`), so a retried job records the same event once and the id never changes.
 */
export interface OutboxEventDoc {
  _id: string;
  tenantId: string;
  type: EventType;
  createdAt: Date;
  data: Record<string, unknown>;
  /** Test traffic (onboarding's first paid call): delivered only to endpoints that include test events. Absent on old records. */
  test?: boolean;
  /** Set by the webhook dispatcher once it has created a delivery for every subscribed endpoint. */
  fannedOutAt: Date | null;
}

export function eventIdFor(cause: string): string {
  return `evt_${sha256Hex(cause).slice(0, 32)}`;
}

export class OutboxStore {
  readonly events: Collection<OutboxEventDoc>;

  constructor(
    db: Db,
    private readonly due: WebhookDueIndex,
    private readonly redis: RedisClient,
    private readonly redisPrefix: string,
  ) {
    this.events = db.collection<OutboxEventDoc>('outbox_events');
  }

  /**
   * Records the event once: a repeat with the same cause returns the first record unchanged. Its fan-out is entered
   * in the due index first, so an event whose fan-out job is never enqueued (the emitter died) is still found. An
   * event with nobody to fan out to (`fanOut` false: its tenant has no webhook endpoint) is born fanned out, with no
   * due entry; `createdAt` is when the emitter started to look for endpoints (see emitEvent).
   */
  async record(
    tenantId: string,
    type: EventType,
    data: Record<string, unknown>,
    cause: string,
    options: { test: boolean; fanOut: boolean; createdAt: Date },
  ): Promise<OutboxEventDoc> {
    const _id = eventIdFor(cause);
    const { test, fanOut, createdAt } = options;
    const event: OutboxEventDoc = {
      _id,
      tenantId,
      type,
      data,
      test,
      createdAt,
      fannedOutAt: fanOut ? null : createdAt,
    };
    if (fanOut) await this.due.add({ kind: 'fan-out', tenantId, eventId: _id, dueAt: event.createdAt });
    // The run's events, for its deliveries (a Redis sorted set by time, read by the run's id alone); entered before
    // the record, so an id without a record is an event that was never made and is skipped.
    if (typeof data.runId === 'string')
      await this.redis.zadd(this.runEventsKey(data.runId), event.createdAt.getTime(), _id);
    // A repeat loses to the first record, which stands; the id is all callers need (the dispatcher reads the record).
    await insertFirst(this.events, event);
    return event;
  }

  private runEventsKey(runId: string): string {
    return `${this.redisPrefix}:run-events:${runId}`;
  }

  /** The ids of the events that name this run, oldest first (at most `limit`). */
  eventIdsOfRun(runId: string, limit: number): Promise<string[]> {
    return this.redis.zrange(this.runEventsKey(runId), 0, limit - 1);
  }

  /**
   * Records an event meant for one endpoint (a test event): born fanned out, so no fan-out ever sends it to the
   * tenant's other endpoints; its one delivery is created by the caller. A repeat returns the first record.
   */
  async recordForOneEndpoint(
    tenantId: string,
    type: EventType,
    data: Record<string, unknown>,
    cause: string,
  ): Promise<OutboxEventDoc> {
    const _id = eventIdFor(cause);
    const now = new Date();
    const event: OutboxEventDoc = { _id, tenantId, type, data, createdAt: now, fannedOutAt: now };
    if (await insertFirst(this.events, event)) return event;
    return (await this.get(_id)) ?? event;
  }

  get(eventId: string): Promise<OutboxEventDoc | null> {
    return this.events.findOne({ _id: eventId });
  }

  /** By `_id` alone; only the fan-out writes this field, and a repeat only moves the timestamp. */
  async markFannedOut(eventId: string, at: Date): Promise<void> {
    await this.events.updateOne({ _id: eventId }, { $set: { fannedOutAt: at } });
  }
}
