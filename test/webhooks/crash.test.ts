import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { emitEvent } from '../../src/services/events.ts';
import { deliveryIdFor } from '../../src/store/webhook-deliveries.ts';
import { deliverJobId, takeoverJobId } from '../../src/webhooks/jobs.ts';
import { createWebhookDispatchProcessor } from '../../src/workers/webhook-dispatch.ts';
import {
  DELIVERY_OVERRIDES,
  signatureHeaders,
  startHarness,
  startReceiver,
  waitUntil,
  type Harness,
  type Receiver,
} from './harness.ts';

const fixture = fileURLToPath(new URL('../fixtures/webhook-worker.ts', import.meta.url));

describe('a worker killed mid-delivery', () => {
  let h: Harness;
  let r: Receiver;
  beforeAll(async () => {
    // 1.5 s HTTP timeout: an attempt's lease (2 x timeout + 1 s) lapses 4 s after its worker died.
    h = await startHarness({
      overrides: { ...DELIVERY_OVERRIDES, WEBHOOK_TIMEOUT_MS: '1500', SWEEP_INTERVAL_MS: '300' },
    });
    r = await startReceiver((req) => (req.n === 1 ? 'hold' : 204));
  });
  afterAll(async () => {
    await r.close();
    await h.close();
  });

  it('loses no delivery: another worker delivers it, with the same event id', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const ep = await h.createEndpoint(auth, r.url);
    const child = spawn(process.execPath, ['--import', 'tsx', fixture], {
      env: { ...process.env, ...h.env.vars, LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    const exited = new Promise<NodeJS.Signals | null>((resolve) =>
      child.once('exit', (_code, signal) => resolve(signal)),
    );

    const event = await emitEvent(h.runtime, tenantId, 'run.finalized', { runId: 'run_killed' }, 'killed:1');
    // The child worker has sent the delivery and the receiver holds the request open: kill the worker right there.
    await waitUntil(() => r.received.length === 1, 20_000, `the child worker's request (stderr: ${stderr})`, 10);
    child.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');
    for (const res of r.held) res.destroy();

    const deliveries = h.runtime.db.collection('webhook_deliveries');
    const id = deliveryIdFor(event._id, ep.id);
    expect(await deliveries.findOne({ _id: id as never })).toMatchObject({ status: 'pending', attemptCount: 0 });

    // A second worker (this process) takes over once the dead attempt's lease has lapsed.
    h.startWorkers();
    await waitUntil(() => r.received.length === 2, 20_000, 'the second delivery', 20);
    const [first, second] = r.received;
    expect(second!.headers['webhook-id']).toBe(event._id);
    expect(second!.body).toBe(first!.body);
    expect(new Webhook(ep.secret).verify(second!.body, signatureHeaders(second!))).toMatchObject({
      id: event._id,
      data: { runId: 'run_killed' },
    });
    await waitUntil(
      async () => (await deliveries.findOne({ _id: id as never }))?.status === 'succeeded',
      5_000,
      'delivery recorded',
    );

    // It was a takeover: the dead worker's job is still `active` in BullMQ, which would only notice much later.
    expect(await h.runtime.producers.queues['webhook-dispatch'].getJob(takeoverJobId(id, 0))).toBeDefined();
    const list = (await h.app.inject({ method: 'GET', url: `/v1/webhooks/${ep.id}/deliveries`, headers: auth })).json();
    expect(list.items).toHaveLength(1);
    expect(list.items[0].attempts).toEqual([expect.objectContaining({ statusCode: 204, succeeded: true })]);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(r.received).toHaveLength(2);
  }, 45_000);

  it('sweeps up an event whose fan-out job was lost and a due delivery whose job was lost, once, even when sweeps overlap', async () => {
    const { tenantId, auth } = await h.tenantWithKey();
    const seen: string[] = [];
    const receiver = await startReceiver((req) => {
      seen.push(String(req.headers['webhook-id']));
      // The first try of the second event asks for a retry in 2000 s (2 s at this test's scale).
      return req.body.includes('lost-job') && seen.filter((id) => id === req.headers['webhook-id']).length === 1
        ? { status: 503, headers: { 'retry-after': '2000' } }
        : 204;
    });
    try {
      const ep = await h.createEndpoint(auth, receiver.url);
      // Recorded in the outbox but never enqueued, as if the emitting process died right after the write.
      const orphan = await h.runtime.stores.outbox.record(tenantId, 'run.finalized', { runId: 'orphan' }, 'orphan:1', {
        test: false,
        fanOut: true,
        createdAt: new Date(),
      });
      await waitUntil(() => seen.includes(orphan._id), 10_000, 'the orphaned event');

      const event = await emitEvent(
        h.runtime,
        tenantId,
        'settlement.completed',
        { runId: 'lost-job', amount: 1 },
        'lost-job:1',
      );
      const id = deliveryIdFor(event._id, ep.id);
      const deliveries = h.runtime.db.collection('webhook_deliveries');
      await waitUntil(
        async () => (await deliveries.findOne({ _id: id as never }))?.attemptCount === 1,
        5_000,
        'the first attempt',
      );
      const pending = await deliveries.findOne({ _id: id as never });
      const queue = h.runtime.producers.queues['webhook-dispatch'];
      await waitUntil(
        async () => (await (await queue.getJob(deliverJobId(id, pending!.rev)))?.getState()) === 'delayed',
        2_000,
        'the retry job',
      );
      await (await queue.getJob(deliverJobId(id, pending!.rev)))!.remove(); // the retry's job is lost
      // Overdue by more than SWEEP_STALE_AFTER_MS: the sweeper leaves work that just fell due to its job.
      await waitUntil(
        () => Date.now() >= pending!.nextAttemptAt.getTime() + Number(DELIVERY_OVERRIDES.SWEEP_STALE_AFTER_MS),
        6_000,
        'the retry to be overdue',
      );
      const processor = createWebhookDispatchProcessor(h.runtime);
      await Promise.all([processor.sweep!(), processor.sweep!(), processor.sweep!()]);
      await waitUntil(() => seen.filter((x) => x === event._id).length === 2, 5_000, 'the swept retry');
      await waitUntil(
        async () => (await deliveries.findOne({ _id: id as never }))?.status === 'succeeded',
        5_000,
        'delivery recorded',
      );
      await new Promise((resolve) => setTimeout(resolve, 1_000)); // more sweeps pass: nothing is sent again
      expect(seen.filter((x) => x === event._id)).toHaveLength(2);
      expect(seen.filter((x) => x === orphan._id)).toHaveLength(1);
    } finally {
      await receiver.close();
    }
  });
});
