import { Type, type Static, type TSchema } from 'typebox';
import type { ListKind } from '../../store/list-index.ts';
import { MAX_LIMIT, DEFAULT_LIMIT, type DisputeState, type ListStates } from '../../services/lists.ts';
import { agentView, Agent } from './agents.ts';
import { AgentId, Cursor, TenantId } from './common.ts';
import { RunView, runView } from './runs.ts';
import { Dispute, Settlement, settlementView } from './settlements.ts';
import { Escalation, escalationView, Gate, gateView } from './x402.ts';
import { Session, sessionView } from './x402-sessions.ts';

// The lists' query and page shapes: one query (filters, limit, cursor) and one page (`{items, nextCursor}`) for
// every kind, as every other paged list of this API answers.

const literals = (values: readonly string[]) => Type.Union(values.map((v) => Type.Literal(v)));

/** Filters every list takes; `status` is the kind's own. */
export function listQuery(statuses: readonly string[], withTenant: boolean) {
  return Type.Object({
    ...(withTenant ? { tenantId: Type.Optional(TenantId) } : {}),
    status: Type.Optional(literals(statuses)),
    agentId: Type.Optional(AgentId),
    createdAfter: Type.Optional(
      Type.String({ format: 'date-time', description: 'only objects created after this time (exclusive)' }),
    ),
    createdBefore: Type.Optional(
      Type.String({
        format: 'date-time',
        description: 'only objects created before this time (exclusive); must be later than createdAfter',
      }),
    ),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIMIT, default: DEFAULT_LIMIT })),
    cursor: Type.Optional(Cursor(400)),
  });
}

export interface ListQueryParams {
  tenantId?: string;
  status?: string;
  agentId?: string;
  createdAfter?: string;
  createdBefore?: string;
  limit?: number;
  cursor?: string;
}

export const DisputeListItem = Type.Intersect([
  Dispute,
  Type.Object({
    settlementId: Type.String(),
    runId: Type.String(),
    currency: Type.String(),
    payerWalletId: Type.String(),
    payeeWalletId: Type.String(),
  }),
]);

export function disputeListView({ settlement }: DisputeState): Static<typeof DisputeListItem> {
  const s = settlementView(settlement);
  return {
    ...s.dispute!,
    settlementId: s.settlementId,
    runId: s.runId,
    currency: s.currency,
    payerWalletId: s.payerWalletId,
    payeeWalletId: s.payeeWalletId,
  };
}

export interface ListShape<K extends ListKind> {
  /** Path segment: `/v1/<path>` for a tenant key, `/ops/<path>` for the operator. */
  path: string;
  noun: string;
  item: TSchema;
  statuses: readonly string[];
  view: (state: ListStates[K]) => unknown;
}

export const LIST_SHAPES: { [K in ListKind]: ListShape<K> } = {
  runs: {
    path: 'runs',
    noun: 'Runs',
    item: RunView,
    statuses: ['in_progress', 'finalizing', 'finalized'],
    view: (r) => runView(r.run, r.head),
  },
  agents: {
    path: 'agents',
    noun: 'Agents',
    item: Agent,
    statuses: ['active', 'wound_down', 'frozen'],
    view: agentView,
  },
  settlements: {
    path: 'settlements',
    noun: 'Settlements (of runs, gates and session payees)',
    item: Settlement,
    statuses: ['pending', 'completed', 'held', 'refunded', 'disputed', 'partially_refunded'],
    view: settlementView,
  },
  disputes: {
    path: 'disputes',
    noun: 'Disputes',
    item: DisputeListItem,
    statuses: ['open', 'resolving', 'resolved'],
    view: disputeListView,
  },
  gates: {
    path: 'gates',
    noun: 'x402 gates',
    item: Gate,
    statuses: ['unfunded', 'held', 'authorized', 'settling', 'released', 'refunded', 'cancelled', 'expired'],
    view: (g) => gateView(g),
  },
  escalations: {
    path: 'escalations',
    noun: 'x402 escalations',
    item: Escalation,
    statuses: ['pending', 'approved', 'denied'],
    view: escalationView,
  },
  sessions: {
    path: 'sessions',
    noun: 'x402 payment sessions',
    item: Session,
    statuses: ['open', 'closing', 'closed', 'expired', 'wound_down', 'unfunded'],
    view: sessionView,
  },
};

export const listPageSchema = (item: TSchema) =>
  Type.Object({ items: Type.Array(item), nextCursor: Type.Union([Type.String(), Type.Null()]) });
