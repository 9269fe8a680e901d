import type { EventType } from '../domain/events.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { OutboxEventDoc } from '../store/outbox.ts';

/**
 * Emits a service event (`test`: test traffic, see OutboxEventDoc.test): records it in the outbox, then enqueues its
 * fan-out to webhook endpoints. Both steps are idempotent by the event's cause (the event id derives from it), so a
 * retried job emits once; an event whose enqueue failed is found by the webhook sweeper.
 *
 * A tenant that has never registered a webhook endpoint has nobody to fan out to: its event is recorded already
 * fanned out, with no due entry and no job (a fan-out job with no endpoint cost more than the gate's verify job).
 * The fan-out sends an event only to endpoints created no later than the event, and an endpoint takes its creation
 * time after its index position (WebhookEndpointStore.create): so an endpoint this look misses took its creation time
 * after the look began, and would not have been sent the event anyway (unless in the very same millisecond).
 */
export async function emitEvent(
  runtime: Runtime,
  tenantId: string,
  type: EventType,
  data: Record<string, unknown>,
  cause: string,
  options: { test?: boolean } = {},
): Promise<OutboxEventDoc> {
  const createdAt = new Date();
  const fanOut = await runtime.stores.webhookEndpoints.anyRegistered(tenantId);
  const event = await runtime.stores.outbox.record(tenantId, type, data, cause, {
    test: options.test === true,
    fanOut,
    createdAt,
  });
  if (fanOut)
    await runtime.producers.enqueue(
      'webhook-dispatch',
      { tenantId, eventId: event._id },
      jobIdFor('webhook-dispatch', event._id),
    );
  return event;
}
