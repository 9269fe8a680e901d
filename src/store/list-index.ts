import { partitionOf } from '../queues/index.ts';
import type { RedisClient } from '../redis.ts';

// The list index: what every "newest first" list pages through without asking MongoDB for anything but exact `_id`
// lookups (on FerretDB any other filter or sort scans the whole collection). One Redis sorted set per kind and
// scope, every member at score 0 and ordered by its text `<createdAt ms, 15 digits>|<id>|<tenantId>`, so a page is
// one ZREVRANGEBYLEX (O(log n + page)) whatever the set holds, and the cursor (a time and an id) names an exact
// place in it. Scopes: every tenant (`all`, what the operator lists), one tenant (`t:<tenantId>`), one agent
// (`a:<agentId>`: an agent id belongs to one tenant, so it needs no tenant in its key).
//
// Where the sets live: on one Redis server (and on a cluster while QUEUE_PARTITIONS is 1) under one hash tag,
// `{lists}`, so one script writes an entry into all its sets, as it always did. On a cluster with the hot queues
// split (K > 1), each set has a hash tag of its own (`{<prefix>:lists:runs:t:<tenantId>}`), so the cluster spreads
// the tenants' and agents' sets over its masters, and a list read by tenant or agent is still one key, one
// ZREVRANGEBYLEX. The operator's `all` set, which every write touches, is split over ALL_SHARDS sets by the tenant's
// hash and merged on read (a page from each, the newest `count` of them). No set depends on K, so a change of K
// moves no list entry (docs/queues.md).
//
// An entry is written BEFORE the document it stands for. A crash in between leaves an entry whose `_id` lookup
// misses (or finds a document created at another time, by a retry): readers skip it, and remove it once it is old
// enough that no writer can still be on its way (LIST_ENTRY_REPAIR_AFTER_MS). So an object is listed from the
// moment its document exists and never lost; a dangling entry is never shown.

export const LIST_KINDS = ['runs', 'agents', 'settlements', 'disputes', 'gates', 'escalations', 'sessions'] as const;
export type ListKind = (typeof LIST_KINDS)[number];

/** A dangling entry (no document, or one of another creation) younger than this may still get its document. */
export const LIST_ENTRY_REPAIR_AFTER_MS = 10 * 60_000;

export interface ListEntry {
  kind: ListKind;
  id: string;
  tenantId: string;
  at: Date;
  /** Agents the object concerns (a run's agent, a payer and a payee…): each gets the entry in its own set. */
  agentIds: readonly string[];
}

/** Where a page starts and ends: a cursor position (exclusive) and creation bounds (both exclusive). */
export interface ListRange {
  before?: { at: Date; id: string };
  createdAfter?: Date;
  createdBefore?: Date;
}

export interface IndexedRow {
  id: string;
  tenantId: string;
  at: Date;
  member: string;
}

export type ListScope = { agentId: string } | { tenantId: string } | 'all';

/** How many sets the operator's `all` set of a kind is split over when the sets are spread (see the header). */
export const ALL_SHARDS = 16;

const MS_DIGITS = 15;
const pad = (ms: number) => String(ms).padStart(MS_DIGITS, '0');

export function memberOf(e: Pick<ListEntry, 'id' | 'tenantId' | 'at'>): string {
  return `${pad(e.at.getTime())}|${e.id}|${e.tenantId}`;
}

function parseMember(member: string): IndexedRow | null {
  const [ms, id, tenantId] = member.split('|');
  if (!ms || !id || !tenantId) return null;
  return { id, tenantId, at: new Date(Number(ms)), member };
}

// ARGV[1]: the member; ARGV[2]: the retention bound ('' when rows are kept for good). Each write trims its own sets,
// so what Redis holds follows the retention with no sweep over every set: members sort by their padded time, so
// those before the cutoff's are the ones past it.
const ADD_TO_SETS = `
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, 0, ARGV[1])
  if ARGV[2] ~= '' then redis.call('ZREMRANGEBYLEX', key, '-', ARGV[2]) end
end
return 1`;

export class ListIndex {
  constructor(
    private readonly redis: RedisClient,
    private readonly prefix: string,
    /** How long a row stays listed (LIST_RETENTION_DAYS); 0: for good. */
    private readonly retentionMs = 0,
    /** Each set under a hash tag of its own, `all` split over ALL_SHARDS (a cluster with K > 1; see the header). */
    readonly spread = false,
  ) {}

  /** The creation time (ms) before which a row is past retention; null when rows are kept for good. */
  private cutoff(): number | null {
    return this.retentionMs > 0 ? Date.now() - this.retentionMs : null;
  }

  private trimBound(): string {
    const cutoff = this.cutoff();
    return cutoff === null ? '' : `(${pad(cutoff)}`;
  }

  /**
   * The set of a scope. One slot for all of them (`{lists}`) unless spread; spread, the `all` set named by
   * `shard` (the shard of an entry's tenant, see allShard).
   */
  key(kind: ListKind, scope: ListScope, shard = 0): string {
    const part = scope === 'all' ? 'all' : 'agentId' in scope ? `a:${scope.agentId}` : `t:${scope.tenantId}`;
    if (!this.spread) return `${this.prefix}:{lists}:${kind}:${part}`;
    return `{${this.prefix}:lists:${kind}:${part}${scope === 'all' ? `:s${shard}` : ''}}`;
  }

  /** The `all` shard an entry of this tenant goes to (spread only). */
  private allShard(tenantId: string): number {
    return partitionOf(tenantId, ALL_SHARDS);
  }

  private allKeys(kind: ListKind): string[] {
    return this.spread
      ? Array.from({ length: ALL_SHARDS }, (_, s) => this.key(kind, 'all', s))
      : [this.key(kind, 'all')];
  }

  private keysOf(e: ListEntry): string[] {
    return [
      this.key(e.kind, 'all', this.spread ? this.allShard(e.tenantId) : 0),
      this.key(e.kind, { tenantId: e.tenantId }),
      ...[...new Set(e.agentIds)].map((agentId) => this.key(e.kind, { agentId })),
    ];
  }

  /**
   * Enters the object in every set it belongs to (harmless when repeated: a member is only there once). One script,
   * not a pipeline: an ioredis pipeline on the shared connection copies every script BullMQ defined on it, which
   * cost the API more than the writes themselves on every gate and settlement create. Spread, one script per set
   * (each in its own slot), all at once: the document is written after every one succeeded, as before.
   */
  async add(e: ListEntry): Promise<void> {
    const keys = this.keysOf(e);
    const member = memberOf(e);
    if (!this.spread) {
      await this.redis.eval(ADD_TO_SETS, keys.length, ...keys, member, this.trimBound());
      return;
    }
    await Promise.all(keys.map((key) => this.redis.eval(ADD_TO_SETS, 1, key, member, this.trimBound())));
  }

  /** Many entries at once (the rebuild, and seeding a benchmark), in pipelines of `chunk` commands. */
  async addMany(entries: readonly ListEntry[], chunk = 2_000): Promise<void> {
    const cutoff = this.cutoff();
    const retained = cutoff === null ? entries : entries.filter((e) => e.at.getTime() >= cutoff);
    for (let i = 0; i < retained.length; i += chunk) {
      const byKey = new Map<string, string[]>();
      for (const e of retained.slice(i, i + chunk)) {
        const member = memberOf(e);
        for (const key of this.keysOf(e)) byKey.set(key, [...(byKey.get(key) ?? []), member]);
      }
      if (this.spread) {
        // Spread, every set is in a slot of its own: one command each (a cluster pipeline keeps to one slot).
        await Promise.all([...byKey].map(([key, members]) => this.redis.zadd(key, ...members.flatMap((m) => [0, m]))));
        continue;
      }
      const pipeline = this.redis.pipeline();
      for (const [key, members] of byKey) pipeline.zadd(key, ...members.flatMap((m) => [0, m]));
      const results = await pipeline.exec();
      const failed = results?.find(([err]) => err);
      if (failed) throw failed[0];
    }
  }

  /**
   * Up to `count` rows of the scope's set, newest first, strictly inside `range`. Spread, the operator's `all` is
   * read from each of its shards and merged: the newest `count` of their pages are the newest `count` of the whole.
   */
  async page(kind: ListKind, scope: ListScope, range: ListRange, count: number): Promise<IndexedRow[]> {
    const maxes = ['+'];
    if (range.before) maxes.push(`(${pad(range.before.at.getTime())}|${range.before.id}`);
    if (range.createdBefore) maxes.push(`(${pad(range.createdBefore.getTime())}`);
    // The smallest bound wins ('+' is above every member; '(' and '[' prefixes compare alike).
    const max = maxes.reduce((a, b) => (a === '+' ? b : b === '+' ? a : a.slice(1) < b.slice(1) ? a : b));
    const min = range.createdAfter ? `[${pad(range.createdAfter.getTime() + 1)}` : '-';
    const keys = scope === 'all' ? this.allKeys(kind) : [this.key(kind, scope)];
    const pages = await Promise.all(keys.map((key) => this.redis.zrevrangebylex(key, max, min, 'LIMIT', 0, count)));
    const members = keys.length === 1 ? pages[0]! : pages.flat().sort(newestFirst).slice(0, count);
    return members.map(parseMember).filter((r): r is IndexedRow => r !== null);
  }

  /** Removes a dangling entry from the set it was found in (the repair; see the header). */
  async removeFrom(kind: ListKind, scope: ListScope, member: string): Promise<void> {
    const tenantId = parseMember(member)?.tenantId;
    const shard = scope === 'all' && this.spread && tenantId ? this.allShard(tenantId) : 0;
    await this.redis.zrem(this.key(kind, scope, shard), member);
  }

  /** How many entries the scope's set holds (what the rebuild reports). */
  async size(kind: ListKind, scope: ListScope): Promise<number> {
    const keys = scope === 'all' ? this.allKeys(kind) : [this.key(kind, scope)];
    return (await Promise.all(keys.map((key) => this.redis.zcard(key)))).reduce((a, b) => a + b, 0);
  }
}

/** Members compare as their text (padded time, then id), as ZREVRANGEBYLEX orders them: descending. */
function newestFirst(a: string, b: string): number {
  return a < b ? 1 : a > b ? -1 : 0;
}
