import type { Logger } from 'pino';
import { Counter, Gauge } from 'prom-client';
import { processMetrics } from '../metrics.ts';
import type { Runtime } from '../runtime.ts';
import type { DueWorkStore } from '../store/due-work.ts';
import type { SweepParkedIndex } from '../store/sweep-parked.ts';

const itemFailures = new Counter({
  name: 'sweep_item_failures_total',
  help: 'Items a sweeper failed to finish, by sweeper (each backs off alone; the sweep goes on)',
  labelNames: ['sweeper'] as const,
  registers: [processMetrics],
});

const itemsParked = new Gauge({
  name: 'sweep_items_parked',
  help: 'Items that failed PARK_AFTER looks in a row and are now looked at hourly, by sweeper (an alert: a person should look)',
  labelNames: ['sweeper'] as const,
  registers: [processMetrics],
});

/** Looks in a row after which an item is parked: looked at hourly, logged at error level, counted in the gauge. */
export const PARK_AFTER = 8;
const FIRST_BACKOFF_MS = 5_000;
const MAX_BACKOFF_MS = 15 * 60_000;
const PARKED_RECHECK_MS = 60 * 60_000;
/** Failing items remembered at most (one finished elsewhere is never seen again; its memory must not pile up). */
const MAX_REMEMBERED = 10_000;

interface Failing {
  attempts: number;
  message: string;
}

/**
 * What a sweeper remembers about items that fail: each backs off on its own (exponentially, then parked), is logged
 * when its failure starts or changes (not on every look) and counted in /metrics, and the sweep goes on with the
 * rest. Kept in the process: a restarted worker starts each item's backoff again, which only costs a few early looks.
 */
export class SweepItems {
  private readonly failing = new Map<string, Failing>();

  constructor(
    readonly sweeper: string,
    private readonly logger: Logger,
    /** Where parked items are shown to every process (the ledger audit reads it); best effort. */
    private readonly parkedIndex?: SweepParkedIndex,
  ) {}

  /**
   * Runs `work` for one item; a throw is recorded and answered with when to look again (never thrown on). Answers
   * `{ ok: true, value }` or `{ ok: false, retryAt }`.
   */
  async run<T>(id: string, work: () => Promise<T>): Promise<{ ok: true; value: T } | { ok: false; retryAt: Date }> {
    try {
      const value = await work();
      this.succeeded(id);
      return { ok: true, value };
    } catch (err) {
      return { ok: false, retryAt: this.failed(id, err) };
    }
  }

  private succeeded(id: string): void {
    const was = this.failing.get(id);
    if (!was) return;
    this.failing.delete(id);
    if (was.attempts >= PARK_AFTER) {
      itemsParked.dec({ sweeper: this.sweeper });
      this.parkedIndex?.unpark(this.sweeper, id).catch(() => undefined);
    }
    this.logger.info({ sweeper: this.sweeper, item: id, attempts: was.attempts }, 'sweep item recovered');
  }

  private failed(id: string, err: unknown): Date {
    const message = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    const was = this.failing.get(id);
    const attempts = (was?.attempts ?? 0) + 1;
    if (!was && this.failing.size >= MAX_REMEMBERED) this.failing.delete(this.failing.keys().next().value!); // oldest
    this.failing.set(id, { attempts, message });
    itemFailures.inc({ sweeper: this.sweeper });
    const parked = attempts >= PARK_AFTER;
    if (attempts === PARK_AFTER) {
      itemsParked.inc({ sweeper: this.sweeper });
      this.parkedIndex?.park(this.sweeper, id).catch(() => undefined);
      this.logger.error(
        { sweeper: this.sweeper, item: id, attempts, err: message },
        'sweep item parked: it keeps failing and needs a look',
      );
    } else if (!was || was.message !== message) {
      this.logger.warn(
        { sweeper: this.sweeper, item: id, attempts, err: message },
        'sweep item failed; it backs off alone',
      );
    }
    const backoff = parked ? PARKED_RECHECK_MS : Math.min(MAX_BACKOFF_MS, FIRST_BACKOFF_MS * 2 ** (attempts - 1));
    return new Date(Date.now() + backoff);
  }

  /** How many items are failing now (for the sweep's summary). */
  get failingCount(): number {
    return this.failing.size;
  }
}

/** One SweepItems per sweeper and runtime. */
const registry = new WeakMap<Runtime, Map<string, SweepItems>>();
export function sweepItems(runtime: Runtime, sweeper: string): SweepItems {
  let byName = registry.get(runtime);
  if (!byName) registry.set(runtime, (byName = new Map()));
  let items = byName.get(sweeper);
  if (!items) byName.set(sweeper, (items = new SweepItems(sweeper, runtime.logger, runtime.stores.sweepParked)));
  return items;
}

/** What a look at one due record decided: finished (its record goes), look again at a time, or it moved the record itself. */
export type DueLook = 'done' | { lookAgainAt: Date } | 'handled';

const DUE_BATCH = 200;

/**
 * The one loop of the sweepers over a due index (store/due-work.ts): batch after batch while records fall due,
 * within `maxMs`. Each record is looked at through SweepItems, so one failing item backs off alone (its record moved
 * to its retry time) and is counted while the sweep goes on; a look moves or removes every record it reads, so the
 * next batch is new work.
 *
 * `partition` is the share of the index this sweep reads: the sweep job of queue partition p sweeps partition p
 * (workers/runner.ts), so a slow or failing partition holds up no other. Without one (a call outside a sweep job:
 * tests, a script) every partition is swept in turn. A partition above K (K was lowered) is first moved to its
 * records' home partitions, then swept like the others.
 */
export async function sweepDue(
  runtime: Runtime,
  sweeper: string,
  due: DueWorkStore,
  maxMs: number,
  look: (id: string, now: Date) => Promise<DueLook>,
  partition?: number,
): Promise<{ looked: number; failed: number }> {
  const items = sweepItems(runtime, sweeper);
  const counts = { looked: 0, failed: 0 };
  const started = Date.now();
  for await (const p of sweptPartitions(runtime, sweeper, due, partition)) {
    for (;;) {
      const now = new Date();
      const batch = await due.due(now, DUE_BATCH, p);
      for (const record of batch) {
        counts.looked++;
        const outcome = await items.run(record._id, () => look(record._id, now));
        if (!outcome.ok) {
          counts.failed++;
          await due.mark(record._id, record.tenantId, outcome.retryAt, record.owner).catch(() => undefined);
        } else if (outcome.value === 'done') {
          await due.done(record._id);
        } else if (outcome.value !== 'handled') {
          await due.mark(record._id, record.tenantId, outcome.value.lookAgainAt, record.owner);
        }
      }
      if (batch.length < DUE_BATCH || Date.now() - started > maxMs) break;
    }
  }
  return counts;
}

/**
 * The partitions of a due index one sweep reads, in order, after the index's audit (when one is owed): `partition`
 * alone in a sweep job (a slow one holds up no other), every partition otherwise. A partition above K (K was
 * lowered) is first moved to its records' home partitions, then read like the others.
 */
export async function* sweptPartitions(
  runtime: Runtime,
  sweeper: string,
  due: DueWorkStore,
  partition?: number,
): AsyncGenerator<number> {
  const audit = await due.audit();
  if (audit) runtime.logger.info(audit, `${sweeper} due index audited against its records`);
  for (const p of partition === undefined ? due.readPartitionList() : [partition]) {
    if (due.isDraining(p)) await drainPartition(runtime, sweeper, due, p);
    yield p;
  }
}

const DRAIN_BATCH = 1_000;

/**
 * Moves a partition above K to its records' home partitions, a batch per sweep, and says once when it is empty:
 * what the operator waits for before unsetting QUEUE_PARTITIONS_DRAIN (docs/queues.md).
 */
async function drainPartition(
  runtime: Runtime,
  sweeper: string,
  due: DueWorkStore,
  partition: number,
): Promise<{ moved: number; left: number }> {
  const drained = await due.drain(partition, DRAIN_BATCH);
  if (drained.moved > 0)
    runtime.logger.info(
      { sweeper, partition, ...drained },
      drained.left === 0
        ? 'due index partition above QUEUE_PARTITIONS drained: its records moved to their partitions'
        : "moving a due index partition above QUEUE_PARTITIONS to its records' partitions",
    );
  return drained;
}
