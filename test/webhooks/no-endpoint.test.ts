import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobIdFor } from '../../src/queues/index.ts';
import { emitEvent } from '../../src/services/events.ts';
import { sweepWebhookWork } from '../../src/services/webhook-delivery.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, waitUntil, type Harness, type Receiver } from './harness.ts';

// A tenant with no webhook endpoint has nobody to send its events to: they are recorded (the outbox keeps every
// event) but fan out to nobody, with no job and no due entry for the sweeper. From the moment an endpoint is
// registered, every event reaches it; an endpoint that is deleted again keeps the tenant on the fan-out path.
describe('events of a tenant without webhook endpoints', () => {
  let h: Harness;
  let r: Receiver;
  beforeAll(async () => {
    h = await startHarness({ overrides: DELIVERY_OVERRIDES, workers: true });
    r = await startReceiver(() => 204);
  });
  afterAll(async () => {
    await r.close();
    await h.close();
  });

  const dispatchJob = (eventId: string) =>
    h.runtime.producers.queues['webhook-dispatch'].getJob(jobIdFor('webhook-dispatch', eventId));

  it('are recorded fanned out, with no fan-out job; once an endpoint exists, the next event reaches it', async () => {
    const { tenantId, auth } = await h.tenantWithKey(['webhooks:write', 'webhooks:read']);
    const quiet = await emitEvent(
      h.runtime,
      tenantId,
      'run.finalized',
      { runId: 'run_quiet' },
      `no-endpoint:${tenantId}:1`,
    );
    const stored = await h.runtime.stores.outbox.get(quiet._id);
    expect(stored).toMatchObject({ _id: quiet._id, type: 'run.finalized', data: { runId: 'run_quiet' } });
    expect(stored!.fannedOutAt?.getTime()).toBe(stored!.createdAt.getTime());
    expect(await dispatchJob(quiet._id)).toBeUndefined();
    // A second event of the same tenant answers from the counter left behind, the same way.
    const quietAgain = await emitEvent(
      h.runtime,
      tenantId,
      'run.finalized',
      { runId: 'run_quiet2' },
      `no-endpoint:${tenantId}:2`,
    );
    expect((await h.runtime.stores.outbox.get(quietAgain._id))!.fannedOutAt).not.toBeNull();
    expect(await dispatchJob(quietAgain._id)).toBeUndefined();
    // Nothing is left for the sweeper to find.
    expect(await sweepWebhookWork(h.runtime, { batch: 100, now: Date.now() + 60_000 })).toMatchObject({ events: 0 });

    const endpoint = await h.createEndpoint(auth, r.url, ['run.finalized']);
    const heard = await emitEvent(
      h.runtime,
      tenantId,
      'run.finalized',
      { runId: 'run_heard' },
      `no-endpoint:${tenantId}:3`,
    );
    await waitUntil(
      () => r.received.some((req) => req.headers['webhook-id'] === heard._id),
      10_000,
      'the event after the endpoint was registered',
    );
    expect(r.received.map((req) => req.headers['webhook-id'])).toEqual([heard._id]);
    expect((await h.runtime.stores.outbox.get(heard._id))!.fannedOutAt).not.toBeNull();

    // Deleted, the endpoint is not sent to, but the tenant's events still take the fan-out path (which decides that).
    expect(
      (await h.app.inject({ method: 'DELETE', url: `/v1/webhooks/${endpoint.id}`, headers: auth })).statusCode,
    ).toBeLessThan(300);
    const afterDelete = await emitEvent(
      h.runtime,
      tenantId,
      'run.finalized',
      { runId: 'run_after' },
      `no-endpoint:${tenantId}:4`,
    );
    expect(await dispatchJob(afterDelete._id)).toBeDefined();
  });

  it('another tenant with an endpoint is not affected by one without', async () => {
    const withHook = await h.tenantWithKey(['webhooks:write']);
    const without = await h.tenantWithKey(['webhooks:write']);
    await h.createEndpoint(withHook.auth, r.url, ['settlement.completed']);
    const sent = await emitEvent(
      h.runtime,
      withHook.tenantId,
      'settlement.completed',
      { settlementId: 'stl_x' },
      `no-endpoint:${withHook.tenantId}`,
    );
    const unsent = await emitEvent(
      h.runtime,
      without.tenantId,
      'settlement.completed',
      { settlementId: 'stl_y' },
      `no-endpoint:${without.tenantId}`,
    );
    await waitUntil(
      () => r.received.some((req) => req.headers['webhook-id'] === sent._id),
      10_000,
      "the subscribed tenant's event",
    );
    expect(r.received.some((req) => req.headers['webhook-id'] === unsent._id)).toBe(false);
    expect(await dispatchJob(unsent._id)).toBeUndefined();
  });
});
