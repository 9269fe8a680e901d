import { createHash } from 'node:crypto';
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
  settle: Type.Object({
    tenantId: Type.String(),
    runId: Type.String(),
    settlementId: Type.String(),
    /** Where the enqueuing process left the payer's chains: hints (see LedgerStore.learnReportedHeads), never facts. */
    ledgerHeads: Type.Optional(
      Type.Array(Type.Object({ account: Type.String(), seq: Type.Integer({ minimum: 1 }), balance: Type.Integer() })),
    ),
  }),
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
 * BullMQ's key prefix of the layout every queue had before partitions: on a Redis Cluster one hash tag for all queues
 * (`{as:bull}`), on one server the plain `as:bull`. On one server it is still the prefix of every queue (see
 * QueueLayout); on a cluster only the queues left over from that layout are read with it (workers drain them).
 */
export function bullPrefix(redisPrefix: string, cluster = false): string {
  return cluster ? `{${redisPrefix}:bull}` : `${redisPrefix}:bull`;
}

/**
 * The queues that carry the money flows, each split over QUEUE_PARTITIONS partitions: one BullMQ queue never spans
 * more than one Redis Cluster node (its scripts touch several keys, so they share one hash tag), and these are the
 * ones whose traffic grows with the calls. The others stay one queue each.
 */
export const PARTITIONED_QUEUES = [
  'settle',
  'x402-verify',
  'webhook-dispatch',
  'finalize',
] as const satisfies readonly QueueName[];

export function isPartitioned(queue: QueueName): boolean {
  return (PARTITIONED_QUEUES as readonly QueueName[]).includes(queue);
}

/**
 * The id a job's partition is derived from: the thing the job works on, so every job of one run (or gate, event,
 * delivery) lands on one partition, and a job enqueued twice with its derived id finds itself there (a no-op).
 */
export function ownerOf<Q extends QueueName>(queue: Q, payload: QueuePayload<Q>): string {
  const p = payload as Record<string, unknown>;
  switch (queue) {
    case 'finalize':
    case 'settle':
      return `${String(p.tenantId)}/${String(p.runId)}`;
    case 'x402-verify':
      return String(p.gateId);
    case 'webhook-dispatch':
      return String(p.deliveryId ?? p.eventId ?? p.recoveryId);
    default:
      return String(p.tenantId);
  }
}

/**
 * Which of `count` partitions `owner` belongs to: the first four bytes of its SHA-256, so every process of every
 * version agrees (JavaScript's own string hashing is not stable across processes).
 */
export function partitionOf(owner: string, count: number): number {
  if (count <= 1) return 0;
  return createHash('sha256').update(owner).digest().readUInt32BE(0) % count;
}

/** BullMQ queue name of a partition: partition 0 keeps the queue's own name, so K=1 is the layout of old. */
export function partitionQueueName(queue: QueueName, partition: number): string {
  return partition === 0 ? queue : `${queue}-p${partition}`;
}

/**
 * Where each queue and partition lives. On one Redis server every queue keeps the prefix it always had (`as:bull`),
 * so with QUEUE_PARTITIONS=1 no key name changes. On a Redis Cluster each queue and each partition of a hot queue
 * has a hash tag of its own in its prefix (`{as:bull:settle-p3}`), so the cluster spreads them over its masters.
 *
 * `partitions` is where jobs go (K); `readPartitions` (at least K) is how many partitions workers consume and
 * sweepers read: above K after K was lowered, until the partitions above it are empty (docs/queues.md).
 */
export class QueueLayout {
  readonly readPartitions: number;

  constructor(
    readonly redisPrefix: string,
    readonly cluster = false,
    readonly partitions = 1,
    readPartitions = partitions,
  ) {
    if (!Number.isInteger(partitions) || partitions < 1) throw new Error('partitions must be a positive integer');
    this.readPartitions = Math.max(partitions, readPartitions);
  }

  /** How many partitions of `queue` jobs are routed to. */
  count(queue: QueueName): number {
    return isPartitioned(queue) ? this.partitions : 1;
  }

  /** How many partitions of `queue` are read (consumed, counted, shown). */
  readCount(queue: QueueName): number {
    return isPartitioned(queue) ? this.readPartitions : 1;
  }

  partitionFor<Q extends QueueName>(queue: Q, payload: QueuePayload<Q>): number {
    return partitionOf(ownerOf(queue, payload), this.count(queue));
  }

  name(queue: QueueName, partition: number): string {
    return partitionQueueName(queue, partition);
  }

  prefix(queue: QueueName, partition: number): string {
    return this.cluster ? `{${this.redisPrefix}:bull:${this.name(queue, partition)}}` : bullPrefix(this.redisPrefix);
  }
}

/** BullMQ job ids may not contain ':'; derived ids make a duplicate enqueue of the same work a no-op. */
export function jobIdFor(queue: QueueName, ...parts: string[]): string {
  return [queue, ...parts].join('__');
}

const ENQUEUE_TIMEOUT_MS = 1_000;

/** How long a partition's worker count is trusted before an enqueue to it looks again. */
const CONSUMER_CHECK_EVERY_MS = 30_000;

/**
 * Told about a hot queue's partition with no worker: `unconsumed` once when an enqueue finds it so, `routed` for every
 * job enqueued to it while it stays so, `consumed` once when it has a worker again.
 */
export type PartitionCoverageListener = (event: {
  kind: 'unconsumed' | 'routed' | 'consumed';
  queue: QueueName;
  partition: number;
  name: string;
}) => void;

export class Producers {
  /** Partition 0 of each queue: the whole queue while QUEUE_PARTITIONS is 1. */
  readonly queues: Record<QueueName, Queue>;
  /** Every partition read of each queue (see QueueLayout.readCount); a queue that is not split has one. */
  readonly partitions: Record<QueueName, Queue[]>;
  readonly layout: QueueLayout;
  private readonly consumers = new Map<string, { checkedAt: number; consumed: boolean; checking: boolean }>();
  private readonly onCoverage: PartitionCoverageListener;

  constructor(
    connection: ConnectionOptions,
    redisPrefix: string,
    cluster = false,
    /** Told why an enqueue answered 503: the caller only sees "unavailable", the operator needs the cause. */
    private readonly onUnavailable: (cause: string) => void = () => undefined,
    partitioning: { partitions?: number; readPartitions?: number; onCoverage?: PartitionCoverageListener } = {},
  ) {
    this.layout = new QueueLayout(redisPrefix, cluster, partitioning.partitions ?? 1, partitioning.readPartitions);
    this.onCoverage = partitioning.onCoverage ?? (() => undefined);
    this.partitions = Object.fromEntries(
      QUEUE_NAMES.map((name) => [
        name,
        Array.from(
          { length: this.layout.readCount(name) },
          (_, p) =>
            new Queue(this.layout.name(name, p), {
              connection,
              prefix: this.layout.prefix(name, p),
              defaultJobOptions: DEFAULT_JOB_OPTIONS,
            }),
        ),
      ]),
    ) as Record<QueueName, Queue[]>;
    this.queues = Object.fromEntries(QUEUE_NAMES.map((name) => [name, this.partitions[name][0]!])) as Record<
      QueueName,
      Queue
    >;
  }

  /** The partition a job of this payload belongs to (where its derived id is looked up too). */
  queueFor<Q extends QueueName>(queue: Q, payload: QueuePayload<Q>): Queue {
    return this.partitions[queue][this.layout.partitionFor(queue, payload)]!;
  }

  /** The job with this id in the partition its payload routes to (null when there is none). */
  async getJob<Q extends QueueName>(queue: Q, payload: QueuePayload<Q>, jobId: string) {
    return (await this.withDeadline(this.queueFor(queue, payload).getJob(jobId))) ?? null;
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
    const target = this.queueFor(queue, payload);
    await this.withDeadline(target.add(name, payload, { ...jobOptions, jobId }));
    if (this.layout.count(queue) > 1) this.watchConsumers(queue, this.partitions[queue].indexOf(target), target);
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
    const existing = await this.withDeadline(this.queueFor(queue, payload).getJob(jobId));
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

  /**
   * A hot queue's partition with no worker is reported (the listener logs it, a metric counts what is routed to
   * it) and its jobs wait there until one comes: nothing is lost, but nothing runs. Looked at, at most every
   * CONSUMER_CHECK_EVERY_MS per partition, after an enqueue to it: BullMQ names each worker's connection after its
   * queue, so the count is one CLIENT LIST per Redis node.
   */
  private watchConsumers(queue: QueueName, partition: number, target: Queue): void {
    const name = target.name;
    const known = this.consumers.get(name) ?? { checkedAt: 0, consumed: true, checking: false };
    this.consumers.set(name, known);
    if (!known.consumed) this.onCoverage({ kind: 'routed', queue, partition, name });
    if (known.checking || Date.now() - known.checkedAt < CONSUMER_CHECK_EVERY_MS) return;
    known.checking = true;
    void target
      .getWorkersCount()
      .then((count) => {
        const consumed = count > 0;
        if (consumed !== known.consumed) {
          this.onCoverage({ kind: consumed ? 'consumed' : 'unconsumed', queue, partition, name });
          if (!consumed) this.onCoverage({ kind: 'routed', queue, partition, name });
        }
        known.consumed = consumed;
        known.checkedAt = Date.now();
      })
      .catch(() => undefined)
      .finally(() => {
        known.checking = false;
      });
  }

  /** Job counts per queue, its partitions added up. */
  async depths(): Promise<Record<QueueName, Record<string, number>>> {
    const entries = await Promise.all(
      QUEUE_NAMES.map(async (name) => {
        const counts = await Promise.all(
          this.partitions[name].map((q) =>
            q.getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed', 'prioritized'),
          ),
        );
        const total: Record<string, number> = {};
        for (const c of counts) for (const [state, n] of Object.entries(c)) total[state] = (total[state] ?? 0) + n;
        return [name, total] as const;
      }),
    );
    return Object.fromEntries(entries) as Record<QueueName, Record<string, number>>;
  }

  async close(): Promise<void> {
    await Promise.all(QUEUE_NAMES.flatMap((name) => this.partitions[name].map((q) => q.close())));
  }
}
