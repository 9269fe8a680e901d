import { emitEvent } from '../../src/services/events.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DELIVERY_OVERRIDES,
  freePort,
  startHarness,
  startReceiver,
  waitUntil,
  type Harness,
  type Receiver,
} from './harness.ts';

// A receiver that is down while a burst of events is emitted gets every one of them once it is back. The schedule
// runs at 1/1000 speed (5 min -> 300 ms, 2 h -> 7.2 s; the 8 attempts span about 100 s, far longer than the outage).
// Its own file (own database), so it runs beside the other delivery tests.
describe('webhook delivery backlog', () => {
  let h: Harness;
  let r: Receiver | null = null;
  beforeAll(async () => {
    h = await startHarness({ overrides: DELIVERY_OVERRIDES, workers: true });
  });
  afterAll(async () => {
    await r?.close();
    await h.close();
  });

  it('delivers all 200 events emitted while the receiver was down, once it is back', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const port = await freePort();
    const ep = await h.createEndpoint(auth, `http://127.0.0.1:${port}/hook`, ['dispute.opened']);
    const emitted: string[] = [];
    for (let batch = 0; batch < 10; batch++) {
      const events = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          emitEvent(h.runtime, tenantId, 'dispute.opened', { disputeId: `dsp_${batch}_${i}` }, `down:${batch}:${i}`),
        ),
      );
      emitted.push(...events.map((e) => e._id));
    }
    const deliveries = h.runtime.db.collection('webhook_deliveries');
    // Down until every delivery has been tried and refused at least once (connection refused).
    await waitUntil(
      async () => (await deliveries.countDocuments({ endpointId: ep.id, attemptCount: { $gte: 1 } })) === 200,
      40_000,
      'a failed attempt each',
      300,
    );
    expect(await deliveries.countDocuments({ endpointId: ep.id, status: 'pending' })).toBe(200);
    const refused = await h.runtime.db.collection('webhook_attempts').findOne({ endpointId: ep.id });
    expect(refused).toMatchObject({ succeeded: false, statusCode: null, error: expect.stringMatching(/ECONNREFUSED/) });

    r = await startReceiver(() => 204, port);
    await waitUntil(
      () => new Set(r!.received.map((q) => q.headers['webhook-id'])).size === 200,
      40_000,
      'all 200 events',
      200,
    );
    expect(new Set(r.received.map((q) => String(q.headers['webhook-id'])))).toEqual(new Set(emitted));
    await waitUntil(
      async () => (await deliveries.countDocuments({ endpointId: ep.id, status: 'succeeded' })) === 200,
      10_000,
      'all recorded',
      300,
    );
  }, 90_000);
});
