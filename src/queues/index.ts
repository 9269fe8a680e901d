import { Queue, type JobsOptions, type ConnectionOptions } from 'bullmq';
import { Type, type Static, type TSchema } from 'typebox';
import { Value } from 'typebox/value';
import { errors, ServiceError } from '../domain/errors.ts';

/** `webhook-dispatch` job that fans an outbox event out into one delivery per subscribed endpoint. */
export const WebhookFanOutPayload = Type.Object({ tenantId: Type.String(), eventId: Type.String() });
/** `webhook-dispatch` job (name `recover`) that sends an endpoint's failed deliveries since a time again. */
export const WebhookRecoverPayload = Type.Object({
  kind: Type.Literal('recover'),
  tenantId: Type.String(),
  recoveryId: Type.String(),
});
/** `webhook-dispatch` job (name `deliver`) for one attempt of one delivery; `rev` is the delivery revision it acts on. */
export const WebhookDeliverPayload = Type.Object({
  kind: Type.Literal('deliver'),
  tenantId: Type.String(),
  deliveryId: Type.String(),
  rev: Type.Integer({ minimum: 0 }),
});

// One queue per concern. Payloads carry ids: the worker reads current state from MongoDB, so a retried or
// duplicated job always acts on the truth, never on a stale copy. The one copy a payload may carry is of a fact that
// never changes once recorded: the x402-verify job's `report`, the gate's verification as its request recorded it
// (EJSON), which spares the job reading it back.
export const QueuePayloads = {
  finalize: Type.Object({ tenantId: Type.String(), runId: Type.String() }),
  settle: Type.Object({ tenantId: Type.String(), runId: Type.String(), settlementId: Type.String() }),
  'x402-verify': Type.Object({ tenantId: Type.String(), gateId: Type.String(), report: Type.Optional(Type.String()) }),
  'webhook-dispatch': Type.Union([WebhookFanOutPayload, WebhookDeliverPayload, WebhookRecoverPayload]),
  'smoke-test': Type.Object({ tenantId: Type.String(), smokeTestId: Type.String() }),
} satisfies Record<string, TSchema>;

export type QueueName = keyof typeof QueuePayloads;
export type QueuePayload<Q extends QueueName> = Static<(typeof QueuePayloads)[Q]>;
export const QUEUE_NAMES = Object.keys(QueuePayloads) as QueueName[];

export function isQueueName(name: string): name is QueueName {
  return Object.hasOwn(QueuePayloads, name);
}

/** Retries with exponential backoff; finished jobs are kept long enough to inspect in Bull Board, then trimmed. */
export const DEFAULT_JOB_OPTIONS: JobsOptions = {
  attempts: 8,
  backoff: { type: 'exponential', delay: 1_000 },
  removeOnComplete: { age: 24 * 3600, count: 5_000 },
  removeOnFail: { age: 7 * 24 * 3600, count: 20_000 },
};

/**
 * BullMQ's key prefix. On a Redis Cluster it is a hash tag (`{as:bull}`), so every key of the queues lives in one
 * slot and BullMQ's multi-key scripts can run; on one server the key names stay as they always were (`as:bull`).
 */
export function bullPrefix(redisPrefix: string, cluster = false): string {
  return cluster ? `{${redisPrefix}:bull}` : `${redisPrefix}:bull`;
}

/** BullMQ job ids may not contain ':'; derived ids make a duplicate enqueue of the same work a no-op. */
export function jobIdFor(queue: QueueName, ...parts: string[]): string {
  return [queue, ...parts].join('__');
}

const ENQUEUE_TIMEOUT_MS = 1_000;

export class Producers {
  readonly queues: Record<QueueName, Queue>;

  constructor(
    connection: ConnectionOptions,
    redisPrefix: string,
    cluster = false,
    /** Told why an enqueue answered 503: the caller only sees "unavailable", the operator needs the cause. */
    private readonly onUnavailable: (cause: string) => void = () => undefined,
  ) {
    const prefix = bullPrefix(redisPrefix, cluster);
    this.queues = Object.fromEntries(
      QUEUE_NAMES.map((name) => [
        name,
        new Queue(name, { connection, prefix, defaultJobOptions: DEFAULT_JOB_OPTIONS }),
      ]),
    ) as Record<QueueName, Queue>;
  }

  /**
   * Enqueues a job, or throws 503 UNAVAILABLE within a second when Redis cannot take it: a request must never hang
   * on a queue, and the caller retries with the same idempotency key. `name` defaults to the queue's own name (the
   * webhook queue also carries `deliver` jobs).
   */
  async enqueue<Q extends QueueName>(
    queue: Q,
    payload: QueuePayload<Q>,
    jobId: string,
    options: JobsOptions & { name?: string } = {},
  ): Promise<void> {
    if (!Value.Check(QueuePayloads[queue], payload)) {
      throw new Error(`invalid ${queue} job payload`);
    }
    const { name = queue, ...jobOptions } = options;
    await this.withDeadline(this.queues[queue].add(name, payload, { ...jobOptions, jobId }));
  }

  /** Enqueues a job to run after `delayMs` (the same deadline applies). */
  schedule<Q extends QueueName>(
    queue: Q,
    payload: QueuePayload<Q>,
    jobId: string,
    delayMs: number,
    name?: string,
  ): Promise<void> {
    return this.enqueue(queue, payload, jobId, { delay: Math.max(0, Math.round(delayMs)), ...(name ? { name } : {}) });
  }

  /**
   * Makes sure a job with this id will run: enqueues it, retries it if it failed for good, or enqueues it again if
   * it completed while the work it stands for is still pending (what the sweepers use to repair state). Safe from
   * several sweepers at once: one id is only ever one job.
   *
   * A job waiting out a retry backoff (delayed after an attempt) is run now: the caller has found its work overdue,
   * and after an outage that used up the first attempts the backoff alone would leave it for a minute or more. The
   * sweepers' interval still bounds how often that happens. A job delayed before its first attempt (a holdback timer,
   * a webhook's scheduled attempt) keeps its time.
   */
  async ensure<Q extends QueueName>(
    queue: Q,
    payload: QueuePayload<Q>,
    jobId: string,
    name?: string,
  ): Promise<'enqueued' | 'retried' | 'promoted' | 'live'> {
    const existing = await this.withDeadline(this.queues[queue].getJob(jobId));
    if (existing) {
      const state = await this.withDeadline(existing.getState());
      if (state === 'failed') {
        await this.withDeadline(existing.retry('failed'));
        return 'retried';
      }
      if (state === 'delayed' && existing.attemptsMade > 0) {
        // It may have left the delayed set since getState (its backoff ran out): then it is running anyway.
        const promoted = await this.withDeadline(
          existing.promote().then(
            () => true,
            () => false,
          ),
        );
        return promoted ? 'promoted' : 'live';
      }
      if (state !== 'completed' && state !== 'unknown') return 'live';
      await this.withDeadline(existing.remove()).catch(() => undefined);
    }
    await this.enqueue(queue, payload, jobId, name ? { name } : {});
    return 'enqueued';
  }

  private async withDeadline<T>(work: Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([
        work,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(errors.unavailable('the job queue is unavailable; retry shortly')),
            ENQUEUE_TIMEOUT_MS,
          );
        }),
      ]);
    } catch (err) {
      this.onUnavailable(
        err instanceof ServiceError
          ? `no answer within ${ENQUEUE_TIMEOUT_MS} ms`
          : err instanceof Error
            ? err.message
            : String(err),
      );
      throw err instanceof ServiceError ? err : errors.unavailable('the job queue is unavailable; retry shortly');
    } finally {
      clearTimeout(timer);
    }
  }

  async depths(): Promise<Record<QueueName, Record<string, number>>> {
    const entries = await Promise.all(
      QUEUE_NAMES.map(
        async (name) =>
          [
            name,
            await this.queues[name].getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed', 'prioritized'),
          ] as const,
      ),
    );
    return Object.fromEntries(entries) as Record<QueueName, Record<string, number>>;
  }

  async close(): Promise<void> {
    await Promise.all(QUEUE_NAMES.map((name) => this.queues[name].close()));
  }
}
