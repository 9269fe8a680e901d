import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebhookDeliveryDoc } from '../../src/store/webhook-deliveries.ts';
import { startHarness, type Harness } from './harness.ts';

// GET /v1/webhooks/{endpointId}/deliveries in the shape of every list (services/lists.ts): limit, an opaque cursor,
// status and creation-time filters, and the same 422s for a query that makes no sense.

describe('webhook deliveries list', () => {
  let h: Harness;
  let auth: Record<string, string>;
  let endpointId: string;
  const made: WebhookDeliveryDoc[] = [];
  beforeAll(async () => {
    h = await startHarness();
    ({ auth } = await h.tenantWithKey());
    endpointId = (await h.createEndpoint(auth, 'https://hooks.example.com/listed', ['run.finalized'])).id;
    const endpoint = (await h.runtime.stores.webhookEndpoints.get(endpointId))!;
    const deliveries = h.runtime.stores.webhookDeliveries;
    for (let i = 0; i < 5; i++) {
      const d = await deliveries.ensure({
        eventId: `evt_${randomUUID().replace(/-/g, '')}`,
        eventType: 'run.finalized',
        endpoint,
        now: new Date(),
      });
      // Every other one failed (an attempt answered 500); the rest stay pending.
      const failed =
        i % 2 === 0
          ? await deliveries.transition(
              d,
              { status: 'failed', nextAttemptAt: null, lastError: 'receiver answered HTTP 500' },
              {
                startedAt: new Date(),
                durationMs: 2,
                statusCode: 500,
                error: 'receiver answered HTTP 500',
                succeeded: false,
              },
            )
          : d;
      made.push(failed!);
      await new Promise((resolve) => setTimeout(resolve, 5)); // distinct creation times
    }
  });
  afterAll(() => h.close());

  const get = (query: string) =>
    h.app.inject({ method: 'GET', url: `/v1/webhooks/${endpointId}/deliveries?${query}`, headers: auth });
  const ids = (body: { items: Array<{ id: string }> }) => body.items.map((d) => d.id);

  it('pages newest first with a cursor and keeps every field it had (attempts included)', async () => {
    const first = (await get('limit=2')).json();
    expect(ids(first)).toEqual([made[4]!._id, made[3]!._id]);
    expect(first.items[0]).toMatchObject({
      eventId: made[4]!.eventId,
      eventType: 'run.finalized',
      status: 'failed',
      attemptCount: 1,
      attempts: [{ attempt: 1, statusCode: 500, succeeded: false }],
    });
    const second = (await get(`limit=2&cursor=${first.nextCursor}`)).json();
    const third = (await get(`limit=2&cursor=${second.nextCursor}`)).json();
    expect([...ids(second), ...ids(third)]).toEqual([made[2]!._id, made[1]!._id, made[0]!._id]);
    expect(third.nextCursor).toBeNull();
  });

  it('filters by status and creation time', async () => {
    expect(ids((await get('status=failed')).json())).toEqual([made[4]!._id, made[2]!._id, made[0]!._id]);
    expect(ids((await get('status=pending')).json())).toEqual([made[3]!._id, made[1]!._id]);
    const at = (d: WebhookDeliveryDoc) => encodeURIComponent(d.createdAt.toISOString());
    expect(ids((await get(`createdAfter=${at(made[2]!)}`)).json())).toEqual([made[4]!._id, made[3]!._id]);
    expect(ids((await get(`createdBefore=${at(made[2]!)}`)).json())).toEqual([made[1]!._id, made[0]!._id]);
    expect(
      ids((await get(`createdAfter=${at(made[0]!)}&createdBefore=${at(made[4]!)}&status=pending`)).json()),
    ).toEqual([made[3]!._id, made[1]!._id]);
  });

  it('answers a query that makes no sense as every list does', async () => {
    const cursor = await get(`cursor=${Buffer.from('nonsense').toString('base64url')}`);
    expect(cursor.statusCode).toBe(422);
    expect(cursor.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'querystring.cursor' }] },
    });
    const range = await get('createdAfter=2026-01-02T00:00:00Z&createdBefore=2026-01-01T00:00:00Z');
    expect(range.statusCode).toBe(422);
    expect(range.json().details.errors[0].path).toBe('querystring.createdAfter');
    for (const limit of [0, 201]) expect((await get(`limit=${limit}`)).json().code).toBe('VALIDATION_FAILED');
    expect((await get('status=done')).statusCode).toBe(400);
    expect((await get('limit=200')).statusCode).toBe(200);
  });
});
