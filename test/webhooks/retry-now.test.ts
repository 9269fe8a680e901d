import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints } from '../../src/domain/failpoints.ts';
import { emitEvent } from '../../src/services/events.ts';
import { deliverJobId } from '../../src/webhooks/jobs.ts';
import { DELIVERY_OVERRIDES, startHarness, startReceiver, waitUntil, type Harness, type Receiver } from './harness.ts';

// Retry now (POST …/deliveries/{id}/resend) on a pending delivery whose next attempt is an hour away, and on failed
// ones: one attempt now whoever asks how often, the schedule restarting from it, the attempt in flight or the
// scheduled one never doubled, a crash between recording the retry and enqueueing its job repaired by the sweeper;
// and recover with `includePending`. Real receivers on 127.0.0.1, real Redis and FerretDB, in-process workers.

describe('webhook retry now', () => {
  let h: Harness;
  const receivers: Receiver[] = [];
  beforeAll(async () => {
    // The real schedule (scale 1): a receiver's `Retry-After: 3600` puts the next attempt an hour away.
    h = await startHarness({ overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_RETRY_SCALE: '1' }, workers: true });
  });
  afterEach(() => disarmFailpoints());
  afterAll(async () => {
    for (const r of receivers) await r.close();
    await h.close();
  });

  async function receiver(respond?: Parameters<typeof startReceiver>[0]) {
    const r = await startReceiver(respond);
    receivers.push(r);
    return r;
  }
  const post = (url: string, auth: Record<string, string>, payload?: unknown) =>
    h.app.inject({ method: 'POST', url, headers: auth, ...(payload ? { payload } : {}) });
  const delivery = (id: string) => h.runtime.stores.webhookDeliveries.get(id);
  const attempts = async (id: string) => h.runtime.stores.webhookDeliveries.attemptsOf((await delivery(id))!);

  /** An endpoint whose first attempt fails with Retry-After: 3600, so its delivery waits an hour; answers `later` after. */
  async function deliveryWaitingAnHour(later: Parameters<typeof startReceiver>[0] = () => 204) {
    const { tenantId, auth } = await h.tenantWithKey();
    let first = true;
    const r = await receiver((req) => {
      if (first) {
        first = false;
        return { status: 503, headers: { 'retry-after': '3600' } };
      }
      return later!(req);
    });
    const ep = await h.createEndpoint(auth, r.url, ['run.finalized']);
    const event = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: `run_${ep.id}` }, `rn:${ep.id}`);
    await r.waitFor(1);
    const deliveryId = (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}/deliveries`, headers: auth }))
      .json()
      .items.at(0).id as string;
    await waitUntil(async () => (await delivery(deliveryId))?.attemptCount === 1, 15_000, 'the first attempt recorded');
    const waiting = (await delivery(deliveryId))!;
    expect(waiting.status).toBe('pending');
    expect(waiting.nextAttemptAt!.getTime()).toBeGreaterThan(Date.now() + 3_000_000);
    return {
      tenantId,
      auth,
      r,
      ep,
      event,
      deliveryId,
      waiting,
      url: `/v1/webhooks/${ep.id}/deliveries/${deliveryId}/resend`,
    };
  }

  it('a pending delivery an hour from its next attempt gets it now; a second click is the same retry; the schedule restarts from it', async () => {
    const { auth, r, deliveryId, waiting, url } = await deliveryWaitingAnHour(() => 500);
    const first = await post(url, auth);
    expect(first.statusCode, first.body).toBe(202);
    expect(first.json()).toMatchObject({ id: deliveryId, status: 'pending', retried: true });
    const second = await post(url, auth);
    expect(second.statusCode, second.body).toBe(202);
    expect(second.json()).toMatchObject({ id: deliveryId, retried: false });

    await r.waitFor(2);
    await waitUntil(async () => (await delivery(deliveryId))!.attemptCount === 2, 15_000, 'the retry recorded');
    const after = (await delivery(deliveryId))!;
    // The retry failed (500): its schedule restarted, so the next attempt is the schedule's second step (5 s,
    // jittered), not the hour the receiver asked for before.
    expect(after.status).toBe('pending');
    expect(after.roundAttempts).toBe(1);
    expect(after.nextAttemptAt!.getTime()).toBeLessThan(waiting.nextAttemptAt!.getTime() - 3_000_000);
    expect(r.received[1]!.headers['webhook-id']).toBe(r.received[0]!.headers['webhook-id']);
    expect(r.received[1]!.body).toBe(r.received[0]!.body);
    r.respond = () => 204; // the restarted schedule's next step delivers it
    await waitUntil(async () => (await delivery(deliveryId))!.status === 'succeeded', 30_000, 'delivered');

    // The job of the hour-away attempt still sits in the queue; run it now: it finds its revision stale.
    const queue = h.runtime.producers.queues['webhook-dispatch'];
    const stale = await queue.getJob(deliverJobId(deliveryId, waiting.rev));
    expect(stale, 'the scheduled attempt is still queued').toBeTruthy();
    await stale!.promote();
    await waitUntil(async () => (await stale!.getState()) === 'completed', 15_000, 'the stale job ran');
    expect((await queue.getJob(stale!.id!))!.returnvalue).toEqual({ skipped: 'stale revision' });
    // Every request the receiver saw is a recorded attempt: the retry, then the restarted schedule's next step.
    expect(await attempts(deliveryId)).toHaveLength(3);
    expect(r.received).toHaveLength(3);
  });

  it('five concurrent retries of one pending delivery make one attempt', async () => {
    const { auth, r, deliveryId, url } = await deliveryWaitingAnHour();
    const answers = await Promise.all(Array.from({ length: 5 }, () => post(url, auth)));
    expect(answers.map((a) => a.statusCode)).toEqual([202, 202, 202, 202, 202]);
    expect(answers.filter((a) => a.json().retried === true)).toHaveLength(1);
    await waitUntil(async () => (await delivery(deliveryId))!.status === 'succeeded', 15_000, 'the retry delivered');
    expect(await attempts(deliveryId)).toHaveLength(2);
    expect(r.received).toHaveLength(2);
  });

  it('a retry asked for while an attempt is in flight is that attempt: one request reaches the receiver', async () => {
    // The hour-away attempt started early (an operator promoted its job in Bull Board) and is held by the receiver:
    // its worker holds the delivery's lease while the record still says "next attempt in an hour".
    const { auth, r, deliveryId, waiting, url } = await deliveryWaitingAnHour(() => 'hold');
    const job = await h.runtime.producers.queues['webhook-dispatch'].getJob(deliverJobId(deliveryId, waiting.rev));
    await job!.promote();
    await r.waitFor(2);
    const retry = await post(url, auth);
    expect(retry.statusCode, retry.body).toBe(202);
    expect(retry.json()).toMatchObject({ retried: false, status: 'pending' });
    r.held.shift()!.writeHead(204).end();
    await waitUntil(async () => (await delivery(deliveryId))!.status === 'succeeded', 15_000, 'the attempt recorded');
    expect(await attempts(deliveryId)).toHaveLength(2);
    expect(r.received).toHaveLength(2);
  });

  it('a failed delivery clicked twice is sent once; asked again later, once more', async () => {
    const { auth, r, deliveryId, url } = await deliveryWaitingAnHour(() => 500);
    // Move it to failed the way the last scheduled attempt would.
    const d = (await delivery(deliveryId))!;
    await h.runtime.stores.webhookDeliveries.transition(d, { status: 'failed', nextAttemptAt: null, lastError: 'x' });
    r.respond = () => 204;
    const [a, b] = [await post(url, auth), await post(url, auth)];
    expect([a.json().retried, b.json().retried]).toEqual([true, false]);
    await waitUntil(async () => (await delivery(deliveryId))!.status === 'succeeded', 15_000, 'the retry delivered');
    expect(r.received).toHaveLength(2);
    // Still the same retry moments later: nothing new.
    expect((await post(url, auth)).json()).toMatchObject({ retried: false, status: 'succeeded' });
    expect(r.received).toHaveLength(2);
    // Asked again once the coalescing window has passed, it is a new retry (the window is read from the record).
    const now = (await delivery(deliveryId))!;
    await h.runtime.stores.webhookDeliveries.transition(now, {
      status: 'succeeded',
      nextAttemptAt: null,
      lastError: null,
      retriedAt: new Date(Date.now() - 60_000),
    });
    expect((await post(url, auth)).json()).toMatchObject({ retried: true });
    await r.waitFor(3);
    await waitUntil(async () => (await delivery(deliveryId))!.attemptCount === 3, 15_000, 'the third attempt');
  });

  it('a crash between recording the retry and enqueueing its attempt: the sweeper sends it, once', async () => {
    const { auth, r, deliveryId, url } = await deliveryWaitingAnHour();
    armFailpoint('webhook.retry.recorded');
    const crashed = await post(url, auth);
    expect(crashed.statusCode).toBe(500);
    const recorded = (await delivery(deliveryId))!;
    expect(recorded.status).toBe('pending');
    expect(recorded.nextAttemptAt!.getTime()).toBeLessThanOrEqual(Date.now());
    // The person clicks again: the retry is recorded, so this is the same one (no second attempt).
    expect((await post(url, auth)).json()).toMatchObject({ retried: false });
    // No job was enqueued for it; the sweeper (every 2 s here) finds its due entry and enqueues one.
    await waitUntil(async () => (await delivery(deliveryId))!.status === 'succeeded', 30_000, 'the sweeper sent it');
    expect(r.received).toHaveLength(2);
    expect(await attempts(deliveryId)).toHaveLength(2);
  });

  it('recover sends pending deliveries too when asked to (includePending), each once', async () => {
    const { auth, r, ep, deliveryId } = await deliveryWaitingAnHour();
    const since = new Date(Date.now() - 600_000).toISOString();
    const recover = async (body: object) => {
      const asked = await post(`/v1/webhooks/${ep.id}/recoveries`, auth, body);
      expect(asked.statusCode, asked.body).toBe(202);
      const at = `/v1/webhooks/${ep.id}/recoveries/${asked.json().id}`;
      await waitUntil(
        async () => (await h.app.inject({ method: 'GET', url: at, headers: auth })).json().status === 'finished',
        20_000,
        'the recovery finished',
      );
      return at;
    };
    // Without the option a pending delivery is left to its schedule.
    const plain = await recover({ since });
    expect((await h.app.inject({ method: 'GET', url: plain, headers: auth })).json()).toMatchObject({
      includePending: false,
      counts: { queued: 0 },
    });
    expect((await delivery(deliveryId))!.attemptCount).toBe(1);

    const withPending = await recover({ since, includePending: true });
    await waitUntil(
      async () => (await h.app.inject({ method: 'GET', url: withPending, headers: auth })).json().counts.sent === 1,
      20_000,
      'the pending delivery sent by the recovery',
    );
    expect((await h.app.inject({ method: 'GET', url: withPending, headers: auth })).json()).toMatchObject({
      includePending: true,
      counts: { queued: 1, sent: 1, failed: 0, pending: 0 },
    });
    expect(r.received).toHaveLength(2);
    const bad = await post(`/v1/webhooks/${ep.id}/recoveries`, auth, { since, includePending: 'yes' });
    expect(bad.statusCode).toBe(400);
  });

  it('refuses another tenant, a delivery of another endpoint, and a key without webhooks:write', async () => {
    const { auth, ep, deliveryId, url } = await deliveryWaitingAnHour();
    const other = await h.tenantWithKey();
    expect((await post(url, other.auth)).statusCode).toBe(404);
    const reader = await h.tenantWithKey(['webhooks:read']);
    expect((await post(url, reader.auth)).statusCode).toBe(403);
    const otherEndpoint = await h.createEndpoint(auth, 'http://127.0.0.1:9/elsewhere', ['run.finalized']);
    expect((await post(`/v1/webhooks/${otherEndpoint.id}/deliveries/${deliveryId}/resend`, auth)).statusCode).toBe(404);
    expect((await delivery(deliveryId))!.attemptCount).toBe(1);
    expect(ep.id).not.toBe(otherEndpoint.id);
  });
});
