/**
 * Which event ids a run's stored batches hold, kept by this process for the runs it appends to: what lets an append
 * refuse an id the run already used (contract: an id names one event of the run) without a claim document per
 * event, which cost FerretDB twice the batch's own insert. The batches are the facts and this is derived from them:
 * an entry covers positions 1..upTo and is extended by reading the batches after upTo by their position ids (a new
 * process, or batches another process appended), so it can never miss an id below the head an append verified.
 *
 * An id is kept as a 32-bit hash pointing at the first position of the batch that holds it: about 30 bytes an id
 * instead of the id's string. A hit is a candidate, confirmed by reading that batch; a collision costs one read and
 * never a wrong answer.
 */

interface RunEventIds {
  /** Positions 1..upTo are indexed. */
  upTo: number;
  /** Hash of an event id -> first position of its batch (several, on a collision). */
  batchOf: Map<number, number | number[]>;
  ids: number;
}

/** Ids kept across all runs; the least recently used runs are dropped beyond it (their next append reads again). */
const MAX_INDEXED_IDS = 200_000;

/** FNV-1a over the id's UTF-16 code units: cheap, and a collision only costs a read (see above). */
export function eventIdHash(id: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

export class EventIdIndex {
  /** In least recently used order (a touched run is re-inserted last). */
  private readonly runs = new Map<string, RunEventIds>();
  private ids = 0;

  constructor(private readonly maxIds = MAX_INDEXED_IDS) {}

  /** The last position indexed for the run (0: none yet). */
  coveredUpTo(runId: string): number {
    return this.runs.get(runId)?.upTo ?? 0;
  }

  /**
   * Adds the ids of the batch starting at `firstSeq`, when it is the next one the run's entry lacks (a batch
   * already indexed, or one past a gap, is ignored: the entry stays exact for 1..upTo).
   */
  add(runId: string, firstSeq: number, lastSeq: number, ids: readonly string[]): void {
    let entry = this.runs.get(runId);
    if ((entry?.upTo ?? 0) !== firstSeq - 1) return;
    if (!entry) entry = { upTo: 0, batchOf: new Map(), ids: 0 };
    this.runs.delete(runId);
    this.runs.set(runId, entry);
    for (const id of ids) {
      const h = eventIdHash(id);
      const had = entry.batchOf.get(h);
      entry.batchOf.set(h, had === undefined ? firstSeq : Array.isArray(had) ? [...had, firstSeq] : [had, firstSeq]);
    }
    entry.upTo = lastSeq;
    entry.ids += ids.length;
    this.ids += ids.length;
    this.evict(runId);
  }

  /** First positions of the batches that may hold this id (to be confirmed by reading them). */
  candidates(runId: string, id: string): number[] {
    const found = this.runs.get(runId)?.batchOf.get(eventIdHash(id));
    return found === undefined ? [] : Array.isArray(found) ? found : [found];
  }

  /** Forgets the run (sealed: nothing more is appended to it). */
  drop(runId: string): void {
    const entry = this.runs.get(runId);
    if (!entry) return;
    this.ids -= entry.ids;
    this.runs.delete(runId);
  }

  /** Drops least recently used runs beyond the cap, never the one just used (a run larger than the cap is kept). */
  private evict(current: string): void {
    for (const [runId] of this.runs) {
      if (this.ids <= this.maxIds || runId === current) return;
      this.drop(runId);
    }
  }
}
