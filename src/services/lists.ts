// The lists: runs, agents, settlements, disputes, gates, escalations and sessions, newest first, a page at a time.
// A page reads the list index (store/list-index.ts: a Redis sorted set per kind and tenant, kind and agent, kind)
// and then each object by `_id`, through the same reads the single-object routes use, so its cost follows the
// page, never what is stored. Status changes (a run finalizing, an escalation decided) are not indexed: a status
// filter is applied while materializing, reading at most SCAN_BUDGET entries per page; a page that ran out of
// budget returns fewer items and a cursor to go on from.
import { errors, ServiceError } from '../domain/errors.ts';
import type { Runtime } from '../runtime.ts';
import type { AgentDoc } from '../store/agents.ts';
import { LIST_ENTRY_REPAIR_AFTER_MS, type IndexedRow, type ListKind, type ListScope } from '../store/list-index.ts';
import { decodeCursor, encodeCursor } from '../store/paging.ts';
import { readSettlement, type SettlementState } from '../store/settlements.ts';
import { getAgent } from './agents.ts';
import { getRun, type RunWithHead } from './runs.ts';
import { escalationStatus, type EscalationState } from './x402/escalations.ts';
import type { GateState } from './x402/gates.ts';
import type { SessionState } from './x402/sessions.ts';
import type { X402Service } from './x402/service.ts';

export const DEFAULT_LIMIT = 50;
export const MAX_LIMIT = 200;
/** Index entries one page may read past (filtered out, another tenant's, dangling) before it hands back a cursor. */
export const SCAN_BUDGET = 1_000;

export interface DisputeState {
  disputeId: string;
  settlement: SettlementState;
}

/** What each kind's list holds. */
export interface ListStates {
  runs: RunWithHead;
  agents: AgentDoc;
  settlements: SettlementState;
  disputes: DisputeState;
  gates: GateState;
  escalations: EscalationState;
  sessions: SessionState;
}

export interface ListQuery {
  /** The caller's tenant; null for the operator (every tenant, or `tenantId` if given). */
  tenantId: string | null;
  agentId?: string;
  status?: string;
  createdAfter?: string;
  createdBefore?: string;
  limit?: number;
  cursor?: string;
}

export interface ListPage<T> {
  items: T[];
  nextCursor: string | null;
}

interface Loaded<T> {
  state: T;
  createdAt: Date;
  status: string;
}

type Loader<K extends ListKind> = (
  runtime: Runtime,
  x402: X402Service,
  tenantId: string,
  id: string,
) => Promise<Loaded<ListStates[K]> | null>;

/** null for "not there" (another tenant's reads alike): an index entry without its object is skipped. */
async function orNull<T>(read: Promise<T>): Promise<T | null> {
  try {
    return await read;
  } catch (err) {
    if (err instanceof ServiceError && err.status === 404) return null;
    throw err;
  }
}

async function loadSettlement(runtime: Runtime, tenantId: string, id: string): Promise<SettlementState | null> {
  const doc = await runtime.stores.settlements.get(id);
  return doc && doc.tenantId === tenantId
    ? readSettlement(runtime.stores.settlements, runtime.stores.ledger, doc)
    : null;
}

const loaders: { [K in ListKind]: Loader<K> } = {
  async runs(runtime, _x, tenantId, id) {
    const r = await orNull(getRun(runtime, tenantId, id));
    return r && { state: r, createdAt: r.run.createdAt, status: r.run.status };
  },
  async agents(runtime, _x, tenantId, id) {
    const a = await orNull(getAgent(runtime, tenantId, id));
    return a && { state: a, createdAt: a.createdAt, status: a.status };
  },
  async settlements(runtime, _x, tenantId, id) {
    const s = await loadSettlement(runtime, tenantId, id);
    return s && { state: s, createdAt: s.doc.createdAt, status: s.view.status };
  },
  async disputes(runtime, _x, tenantId, id) {
    const ref = await runtime.stores.settlements.disputeRef(id);
    const s = ref && (await loadSettlement(runtime, tenantId, ref.settlementId));
    const hb = s?.facts.holdback;
    // A dispute exists once it holds the settlement's holdback; a ref whose claim lost is no dispute.
    if (!s || hb?.fate !== 'dispute' || hb.disputeId !== id) return null;
    const status = !s.facts.ruling ? 'open' : s.view.holdbackState === 'resolving' ? 'resolving' : 'resolved';
    return { state: { disputeId: id, settlement: s }, createdAt: ref!.createdAt ?? new Date(hb.at), status };
  },
  async gates(_rt, x402, tenantId, id) {
    const g = await orNull(x402.gates.getGate(tenantId, id));
    return g && { state: g, createdAt: g.gate.createdAt, status: g.status };
  },
  async escalations(_rt, x402, tenantId, id) {
    const e = await orNull(x402.escalations.getEscalation(tenantId, id));
    return e && { state: e, createdAt: e.escalation.createdAt, status: escalationStatus(e) };
  },
  async sessions(_rt, x402, tenantId, id) {
    const s = await orNull(x402.sessions.get(tenantId, id));
    return s && { state: s, createdAt: s.session.createdAt, status: s.status };
  },
};

export function invalid(path: string, message: string) {
  return errors.unprocessable(`${path.replace('querystring.', '')} ${message}`, { errors: [{ path, message }] });
}

function parseTime(value: string | undefined, path: string): Date | undefined {
  if (value === undefined) return undefined;
  const at = new Date(value);
  if (Number.isNaN(at.getTime())) throw invalid(path, 'is not an RFC 3339 time');
  return at;
}

/** Checks the query's rules no schema states; throws 422 in the contract's shape (other paged lists use it too). */
export function checkListQuery(q: Pick<ListQuery, 'limit' | 'createdAfter' | 'createdBefore' | 'cursor'>) {
  const limit = q.limit ?? DEFAULT_LIMIT;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT)
    throw invalid('querystring.limit', `must be an integer from 1 to ${MAX_LIMIT}`);
  const createdAfter = parseTime(q.createdAfter, 'querystring.createdAfter');
  const createdBefore = parseTime(q.createdBefore, 'querystring.createdBefore');
  if (createdAfter && createdBefore && createdAfter.getTime() >= createdBefore.getTime()) {
    throw invalid('querystring.createdAfter', 'must be earlier than createdBefore');
  }
  const before = q.cursor === undefined ? undefined : decodeCursor(q.cursor);
  if (before === null) throw invalid('querystring.cursor', 'is not a cursor this API returned');
  return { limit, createdAfter, createdBefore, before };
}

/**
 * One page of a list, newest first. The cursor is the last row handed out (a time and an id), so items created
 * while a client pages appear before its first page, never as duplicates or gaps inside the pages it reads.
 */
export async function listPage<K extends ListKind>(
  runtime: Runtime,
  x402: X402Service,
  kind: K,
  q: ListQuery,
): Promise<ListPage<ListStates[K]>> {
  const { limit, createdAfter, createdBefore, before } = checkListQuery(q);
  const index = runtime.stores.lists;
  let scope: ListScope = q.tenantId === null ? 'all' : { tenantId: q.tenantId };
  if (q.agentId !== undefined) {
    // An agent of another tenant has nothing in this tenant's lists (and saying so would reveal it exists).
    if (q.tenantId !== null && !(await runtime.stores.agents.belongsTo(q.tenantId, q.agentId)))
      return { items: [], nextCursor: null };
    scope = { agentId: q.agentId };
  }
  const load = loaders[kind] as Loader<K>;
  const items: Array<ListStates[K]> = [];
  let position = before;
  let scanned = 0;
  let exhausted = false;
  while (items.length < limit && scanned < SCAN_BUDGET) {
    const want = Math.min(q.status ? Math.max(limit - items.length, 50) : limit - items.length, SCAN_BUDGET - scanned);
    const rows = await index.page(kind, scope, { before: position, createdAfter, createdBefore }, want);
    const loaded = await Promise.all(
      rows.map((row) =>
        q.tenantId !== null && row.tenantId !== q.tenantId ? null : load(runtime, x402, row.tenantId, row.id),
      ),
    );
    let consumed = 0;
    for (const [i, row] of rows.entries()) {
      scanned++;
      consumed++;
      position = { at: row.at, id: row.id };
      const found = loaded[i];
      if (!found || found.createdAt.getTime() !== row.at.getTime()) {
        if (q.tenantId === null || row.tenantId === q.tenantId) await repairIfDead(runtime, kind, scope, row);
        continue;
      }
      if (q.status && found.status !== q.status) continue;
      items.push(found.state);
      if (items.length === limit) break;
    }
    if (rows.length < want) {
      exhausted = consumed === rows.length; // the range ended inside this batch, and every row of it was read
      break;
    }
  }
  // A full page says whether anything follows, so the last page's cursor is null rather than one more empty page.
  if (
    !exhausted &&
    position &&
    (await index.page(kind, scope, { before: position, createdAfter, createdBefore }, 1)).length === 0
  )
    exhausted = true;
  return { items, nextCursor: exhausted || !position ? null : encodeCursor(position) };
}

/** An entry whose object is missing (or of another creation) once no writer can still be on its way is removed. */
async function repairIfDead(runtime: Runtime, kind: ListKind, scope: ListScope, row: IndexedRow): Promise<void> {
  if (Date.now() - row.at.getTime() < LIST_ENTRY_REPAIR_AFTER_MS) return;
  await runtime.stores.lists.removeFrom(kind, scope, row.member);
}
