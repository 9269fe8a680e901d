import { Queue, UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Logger } from 'pino';
import { Value } from 'typebox/value';
import type { Config } from '../config.ts';
import { jobsFailedForGood } from '../metrics.ts';
import { DependencyOutages, watchRedis } from '../outages.ts';
import { createRedisClient, isClusterUrl } from '../redis.ts';
import { bullPrefix, QueueLayout, QueuePayloads, type QueueName, type QueuePayload } from '../queues/index.ts';

export interface QueueProcessor<Q extends QueueName = QueueName> {
  process(payload: QueuePayload<Q>, job: Job): Promise<unknown>;
  /**
   * Periodic repair for this queue (re-enqueue work left behind by a crash). A BullMQ job scheduler runs it once per
   * SWEEP_INTERVAL_MS across all worker processes; it must be safe to run concurrently and repeatedly. `partition`
   * is the queue partition whose sweep job runs it (its share of the due indexes); none: every partition.
   */
  sweep?(partition?: number): Promise<unknown>;
  /**
   * The sweep reads a share per partition (due indexes split like the queue): scheduled on every partition, each
   * on its own queue partition, so a slow or failing one holds up no other. Otherwise once, on partition 0.
   */
  sweepsPerPartition?: boolean;
}
export type ProcessorMap = { [Q in QueueName]?: QueueProcessor<Q> };

/** How often each worker checks that it is not idle while its queue has waiting jobs. */
const WATCHDOG_INTERVAL_MS = 5_000;

/**
 * How often each worker upserts its sweep schedules again. A schedule is a chain of delayed jobs, each added as
 * the one before it runs; a master failover that loses the write of the next one (its replica lagging) ends the
 * chain, and that partition's sweeps with it. An upsert adds the missing iteration (and leaves a present one where
 * it is), so a broken schedule runs again within this time.
 */
const SCHEDULE_REFRESH_MS = 30_000;

/** Job name of scheduled sweeps; every other job on a queue is that queue's own work. */
export const SWEEP_JOB = 'sweep';

/**
 * The partitions of `queue` a worker process consumes: its WORKER_PARTITIONS of the K that jobs are routed to (all
 * of them when unset), and every partition above K that is still read (QUEUE_PARTITIONS_DRAIN, after K was lowered).
 */
export function consumedPartitions(config: Config, layout: QueueLayout, queue: QueueName): number[] {
  const routed = layout.count(queue);
  if (routed === 1 && layout.readCount(queue) === 1) return [0];
  const chosen = config.queues.workerPartitions ?? Array.from({ length: routed }, (_, p) => p);
  const draining = Array.from({ length: layout.readCount(queue) - routed }, (_, i) => routed + i);
  return [...chosen.filter((p) => p < routed), ...draining];
}

export interface RunningWorkers {
  queues: QueueName[];
  /** Stops taking jobs, lets active ones finish (bounded by the shutdown timeout), then disconnects. */
  close(): Promise<void>;
}

/**
 * Runs one BullMQ worker per queue with the processor that handles it. Any number of processes may run the same
 * queues: BullMQ hands each job to one worker at a time, and processors are written so a repeat is harmless.
 */
export function startWorkers(
  config: Config,
  logger: Logger,
  processors: ProcessorMap,
  queues: QueueName[],
  /** The process's outage log (the runtime's), so that a process writes one line per outage whatever notices it. */
  outages: DependencyOutages = new DependencyOutages(logger),
): RunningWorkers {
  // Not lazy: a BullMQ queue or worker handed a client that has not started connecting calls `connect()` itself, and
  // if Redis is down then, that queue (or the blocking connection a worker duplicates from this client, which
  // inherits its options) stays broken for the life of the process. A client already (re)connecting is waited for.
  const connection = createRedisClient(config.redisUrl, { maxRetriesPerRequest: null });
  const cluster = isClusterUrl(config.redisUrl);
  const layout = new QueueLayout(config.redisPrefix, cluster, config.queues.partitions, config.queues.readPartitions);
  // BullMQ reconnects by itself. Its queues and workers re-emit their connections' errors (this one's, and the
  // blocking connections each worker duplicates from it): counted into the outage, not a line each.
  watchRedis(connection, outages);
  const onBullError = (log: Logger, what: string) => (err: Error) => {
    if (!outages.absorb(err)) log.error({ err: err.message }, `${what} error`);
  };
  const schedulerQueues: Queue[] = [];
  const watchdogs: NodeJS.Timeout[] = [];
  let closing = false;
  type Slot = ReturnType<typeof startSlot>;
  const slots: Slot[] = [];
  for (const queue of queues) {
    const processor = processors[queue] as QueueProcessor | undefined;
    if (!processor) throw new Error(`no processor for queue ${queue}`);
    // Sweep schedules: one per partition this process consumes when the queue's sweep reads a share per partition
    // (its due indexes are split the same way), each on that partition's queue, so a slow or failing sweep of one
    // partition never holds up another; else one, on partition 0 (the queue's own name). A failover of a master
    // delays the sweeps of its partitions for its length, nothing else.
    const consumed = consumedPartitions(config, layout, queue);
    for (const partition of processor.sweep ? (processor.sweepsPerPartition ? consumed : [0]) : []) {
      const scheduler = new Queue(layout.name(queue, partition), {
        connection,
        prefix: layout.prefix(queue, partition),
      });
      scheduler.on('error', onBullError(logger.child({ queue, partition }), 'scheduler queue'));
      schedulerQueues.push(scheduler);
      // Upserting the same scheduler id from every worker process keeps exactly one schedule per partition.
      const upsert = () =>
        scheduler
          .upsertJobScheduler(
            `${queue}-sweeper`,
            { every: config.sweeper.intervalMs },
            {
              name: SWEEP_JOB,
              data: {},
              opts: { attempts: 1, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
            },
          )
          .catch((err) => {
            if (!outages.absorb(err))
              logger.error({ queue, partition, err: (err as Error).message }, 'could not schedule sweeper');
          });
      void upsert();
      watchdogs.push(setInterval(() => void upsert(), SCHEDULE_REFRESH_MS));
    }
    for (const partition of consumed) {
      slots.push(
        startSlot(queue, processor, layout.name(queue, partition), layout.prefix(queue, partition), partition),
      );
    }
  }
  if (cluster) void drainPreviousClusterLayout();

  /**
   * The layout before partitions gave every queue on a Redis Cluster one shared hash tag (`{as:bull}`). Its sweep
   * schedules are removed (the sweeps run on the new queues), and a queue of it that still holds jobs (waiting,
   * delayed, running when its worker stopped) gets a worker of this process until the process ends, so an upgrade
   * loses none (docs/queues.md: restart the API processes first, then the workers).
   */
  async function drainPreviousClusterLayout(): Promise<void> {
    for (const queue of queues) {
      if (closing) return;
      const processor = processors[queue] as QueueProcessor;
      const old = new Queue(queue, { connection, prefix: bullPrefix(config.redisPrefix, true) });
      old.on('error', onBullError(logger.child({ queue, layout: 'previous' }), 'queue'));
      schedulerQueues.push(old);
      // Looked at until it answers once (Redis may be away at start), at the sweepers' pace.
      for (;;) {
        try {
          await old.removeJobScheduler(`${queue}-sweeper`);
          const counts = await old.getJobCounts('wait', 'active', 'delayed', 'prioritized', 'waiting-children');
          if (Object.values(counts).some((n) => n > 0) && !closing) {
            logger.info({ queue, counts }, 'draining the jobs of the queue layout before partitions');
            slots.push(startSlot(queue, processor, queue, bullPrefix(config.redisPrefix, true), 'previous'));
          }
          break;
        } catch (err) {
          if (!outages.absorb(err))
            logger.error({ queue, err: (err as Error).message }, 'could not look at the previous queue layout');
          await new Promise((resolve) => setTimeout(resolve, config.sweeper.intervalMs));
          if (closing) return;
        }
      }
    }
  }

  function startSlot(
    queue: QueueName,
    processor: QueueProcessor,
    name: string,
    prefix: string,
    partition: number | 'previous',
  ) {
    const watchQueue = new Queue(name, { connection, prefix });
    const log = logger.child({ queue, ...(partition === 0 ? {} : { partition }) });
    watchQueue.on('error', onBullError(log, 'queue'));
    schedulerQueues.push(watchQueue);
    const startWorker = () => {
      // Jobs this worker's processor is running now, counted around the processor itself: BullMQ's own events are
      // no count of them, as a job whose completion a failover kept from being recorded ends in neither
      // `completed` nor `failed` (only `error`), and a count kept from those events stayed above 0 for good.
      let running = 0;
      const worker = new Worker(
        name,
        async (job: Job) => {
          running++;
          try {
            // A sweep job sweeps its own partition (one left in the layout before partitions: partition 0).
            if (job.name === SWEEP_JOB) return await processor.sweep?.(partition === 'previous' ? 0 : partition);
            // A payload that does not match its schema will never succeed; fail it without retries.
            if (!Value.Check(QueuePayloads[queue], job.data)) {
              throw new UnrecoverableError(`invalid ${queue} payload`);
            }
            return await processor.process(job.data as QueuePayload<typeof queue>, job);
          } finally {
            running--;
          }
        },
        { connection, prefix, concurrency: config.workerConcurrency, autorun: true },
      );
      worker.on('failed', (job, err) => {
        const final = job !== undefined && job.attemptsMade >= (job.opts.attempts ?? 1);
        if (final && job.name !== SWEEP_JOB) {
          // Out of retries: the sweepers will try again, but a person should look (logs and the metric below).
          jobsFailedForGood.inc({ queue });
          log.error(
            { alert: 'job_failed_for_good', jobId: job.id, attempts: job.attemptsMade, err: err.message },
            'job failed after its last retry',
          );
        } else if (!outages.absorb(err)) {
          // A job that failed because Redis or MongoDB is away is one more failure of the outage, not a line.
          log.warn({ jobId: job?.id, attempt: job?.attemptsMade, err: err.message }, 'job failed');
        }
      });
      worker.on('error', onBullError(log, 'worker'));
      return { worker, running: () => running };
    };
    const slot = {
      current: startWorker(),
      idleChecks: 0,
      /** A fresh worker, given two fresh checks before it can be found stuck in turn. */
      replace(why: string, waiting?: number) {
        log.warn({ waiting }, why);
        slot.idleChecks = 0;
        const stuck = slot.current.worker;
        slot.current = startWorker();
        void stuck.close(true).catch(() => undefined);
      },
    };
    // BullMQ's worker can stay blocked on a connection that a failover or restart left behind, idle while jobs
    // wait (taskforcesh/bullmq#3088, #2964); its maintainers advise replacing it. One that runs nothing for two
    // checks in a row while its queue has waiting jobs is replaced (it holds no job: it was running none).
    // Every worker of this process shares the connection that left it behind, and after a failover they all
    // stayed blocked, each found only once jobs had waited on its own queue for two checks (the cluster fault
    // test: 10 s a queue, one after another, as the flow reached each). So the others that run nothing are
    // replaced with it.
    watchdogs.push(
      setInterval(() => {
        void watchQueue.getJobCounts('wait', 'prioritized').then(
          (counts) => {
            const waiting = (counts.wait ?? 0) + (counts.prioritized ?? 0);
            slot.idleChecks = waiting > 0 && slot.current.running() === 0 ? slot.idleChecks + 1 : 0;
            if (slot.idleChecks < 2 || closing) return;
            slot.replace('worker idle while jobs wait; replacing it', waiting);
            for (const other of slots) {
              if (other !== slot && other.current.running() === 0)
                other.replace('worker of the same process replaced with it (a connection left behind blocks them all)');
            }
          },
          () => undefined,
        );
      }, WATCHDOG_INTERVAL_MS),
    );
    return slot;
  }
  logger.info({ queues }, 'workers started');

  return {
    queues,
    async close() {
      closing = true;
      for (const w of watchdogs) clearInterval(w);
      const workers = slots.map((slot) => slot.current.worker);
      let timer: NodeJS.Timeout | undefined;
      const bounded = new Promise<void>((resolve) => {
        timer = setTimeout(() => {
          logger.warn(
            { timeoutMs: config.shutdownTimeoutMs },
            'jobs still active at shutdown timeout; they will be retried',
          );
          resolve();
        }, config.shutdownTimeoutMs);
      });
      await Promise.race([Promise.all(workers.map((w) => w.close())).then(() => undefined), bounded]);
      clearTimeout(timer);
      if (workers.some((w) => w.isRunning())) await Promise.all(workers.map((w) => w.close(true)));
      await Promise.all(schedulerQueues.map((q) => q.close()));
      connection.disconnect();
    },
  };
}
