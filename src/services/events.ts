import type { EventType } from '../domain/events.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { OutboxEventDoc } from '../store/outbox.ts';

/**
 * Emits a service event (`test`: test traffic, see OutboxEventDoc.test): records it in the outbox, then enqueues its fan-out to webhook endpoints. Both steps are
 * idempotent by the event's cause (the event id derives from it), so a retried job emits once; an event whose
 * enqueue failed is found by the webhook sweeper.
 */
export async function emitEvent(rt: Runtime, tenantId: string, type: EventType, data: Record<string, unknown>, cause: string, options: { test?: boolean } = {}): Promise<OutboxEventDoc> {
  const event = await rt.stores.outbox.record(tenantId, type, data, cause, options.test === true);
  await rt.producers.enqueue('webhook-dispatch', { tenantId, eventId: event._id }, jobIdFor('webhook-dispatch', event._id));
  return event;
}
