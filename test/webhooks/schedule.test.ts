import { emitEvent } from '../../src/services/events.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RETRY_SCHEDULE_MS } from '../../src/domain/webhook-signing.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, waitUntil, type Harness, type Receiver } from './harness.ts';

// The whole schedule at 1/50000 speed: 8 attempts within about 2 s, and "failing for 5 days" = 8.6 s.
const SCALE = 0.00002;

describe('retry schedule limits', () => {
  let h: Harness;
  let r: Receiver;
  beforeAll(async () => {
    h = await startHarness({ overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_RETRY_SCALE: String(SCALE) }, workers: true });
    r = await startReceiver(() => 500);
  });
  afterAll(async () => {
    await r.close();
    await h.close();
  });

  it('gives up after 8 attempts, disables an endpoint whose deliveries all failed for 5 days, and replays them on enable', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const ep = await h.createEndpoint(auth, r.url);
    const deliveries = async (query = '') =>
      (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}/deliveries${query}`, headers: auth })).json();

    const first = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_f1' }, 'failing:1');
    await waitUntil(
      async () => (await deliveries()).items[0]?.status === 'failed',
      15_000,
      'the delivery to fail for good',
      200,
    );
    const failed = (await deliveries()).items[0];
    expect(failed).toMatchObject({
      eventId: first._id,
      attemptCount: 8,
      nextAttemptAt: null,
      lastError: 'receiver answered HTTP 500',
    });
    expect(failed.attempts.map((a: { attempt: number }) => a.attempt)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(r.received.filter((q) => q.headers['webhook-id'] === first._id)).toHaveLength(8);
    const endpoint = (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}`, headers: auth })).json();
    expect(endpoint).toMatchObject({ status: 'active', failingSince: expect.any(String) });

    // Still failing once 5 days (scaled) have passed since the first failure: the next failure disables it.
    const fiveDays = 5 * 86_400_000 * SCALE;
    await waitUntil(
      () => Date.now() > Date.parse(endpoint.failingSince) + fiveDays + 100,
      15_000,
      'five scaled days',
      200,
    );
    const second = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_f2' }, 'failing:2');
    await waitUntil(
      async () =>
        (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}`, headers: auth })).json().status ===
        'disabled',
      5_000,
      'endpoint disabled',
      200,
    );
    const disabled = (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}`, headers: auth })).json();
    expect(disabled.disabledReason).toBe(`every delivery failed since ${endpoint.failingSince}`);
    await waitUntil(
      async () => (await deliveries('?status=abandoned')).items.length === 1,
      5_000,
      'second delivery abandoned',
      200,
    );
    expect(RETRY_SCHEDULE_MS.reduce((a, b) => a + b, 0) * SCALE).toBeLessThan(fiveDays); // it was the 5-day rule, not exhaustion

    r.respond = () => 204;
    const enabled = (await h.app.inject({ method: 'POST', url: `/v1/webhooks/${ep.id}/enable`, headers: auth })).json();
    expect(enabled).toMatchObject({ status: 'active', failingSince: null, replayed: 2 });
    await waitUntil(
      async () => (await deliveries('?status=succeeded')).items.length === 2,
      5_000,
      'both replayed',
      200,
    );
    const replayedFirst = (await deliveries()).items.find((d: { eventId: string }) => d.eventId === first._id);
    expect(replayedFirst.attempts.at(-1)).toMatchObject({ attempt: 9, statusCode: 204, succeeded: true });
    expect(r.received.filter((q) => q.headers['webhook-id'] === second._id).at(-1)!.body).toContain('run_f2');
  }, 40_000);
});
