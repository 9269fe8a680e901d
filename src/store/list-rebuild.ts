import type { Collection, Document } from 'mongodb';
import type { AgentStore } from './agents.ts';
import type { ListEntry, ListIndex, ListKind } from './list-index.ts';
import { runListEntry, type RunStore } from './runs.ts';
import { settlementListEntry, type SettlementStore } from './settlements.ts';
import type { X402SessionStore } from './x402-sessions.ts';
import type { X402Store } from './x402.ts';

// Rebuilds the list index from MongoDB: for objects stored before the lists existed, or after Redis lost its data.
// The one place that reads whole collections, so it runs as an operator's command (`main.ts rebuild-lists`), never
// on a request. Adding an entry that exists is a no-op, so it can run at any time beside live traffic and twice.

const BATCH = 2_000;

async function each<T extends Document>(
  collection: Collection<T>,
  toEntry: (doc: T) => Promise<ListEntry | null> | ListEntry | null,
  index: ListIndex,
): Promise<number> {
  let batch: ListEntry[] = [];
  let count = 0;
  for await (const doc of collection.find({})) {
    const entry = await toEntry(doc as T);
    if (!entry) continue;
    batch.push(entry);
    count++;
    if (batch.length >= BATCH) {
      await index.addMany(batch);
      batch = [];
    }
  }
  await index.addMany(batch);
  return count;
}

export async function rebuildListIndex(
  index: ListIndex,
  stores: {
    runs: RunStore;
    agents: AgentStore;
    settlements: SettlementStore;
    x402: X402Store;
    x402Sessions: X402SessionStore;
  },
): Promise<Record<ListKind, number>> {
  const { runs, agents, settlements, x402, x402Sessions } = stores;
  return {
    runs: await each(runs.runs, runListEntry, index),
    agents: await each(
      agents.agents,
      (a) => ({ kind: 'agents', id: a._id, tenantId: a.tenantId, at: a.createdAt, agentIds: [a._id] }),
      index,
    ),
    settlements: await each(settlements.settlements, settlementListEntry, index),
    disputes: await each(
      settlements.disputeRefs,
      async (ref) => {
        // Refs from before the lists carry no time: the dispute's own record (its holdback claim) does.
        const s = await settlements.get(ref.settlementId);
        const hb = s && (await settlements.factsOf(s._id)).holdback;
        if (!s || hb?.fate !== 'dispute' || hb.disputeId !== ref._id) return null;
        return { ...settlementListEntry(s), kind: 'disputes', id: ref._id, at: ref.createdAt ?? new Date(hb.at) };
      },
      index,
    ),
    gates: await each(
      x402.gates,
      (g) => ({
        kind: 'gates',
        id: g._id,
        tenantId: g.tenantId,
        at: g.createdAt,
        agentIds: [g.payerAgentId, g.payeeAgentId],
      }),
      index,
    ),
    escalations: await each(
      x402.escalations,
      (e) => ({
        kind: 'escalations',
        id: e._id,
        tenantId: e.tenantId,
        at: e.createdAt,
        agentIds: [e.payerAgentId, e.payeeAgentId],
      }),
      index,
    ),
    sessions: await each(
      x402Sessions.sessions,
      (s) => ({
        kind: 'sessions',
        id: s._id,
        tenantId: s.tenantId,
        at: s.createdAt,
        agentIds: [s.payerAgentId, ...s.payeeAgentIds],
      }),
      index,
    ),
  };
}
