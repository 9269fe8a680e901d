// What Redis may have lost, found again from MongoDB (the record). Redis keeps due-work indexes, the ledger's due
// markers and session budgets; a failover to a replica that lagged, or an append-only file cut short, loses its last
// writes without a word. Each process looks, at every sweep, at which Redis processes hold the keys (their run ids,
// store/redis-lineage.ts); when they changed, every due index is audited against its records at its next sweep (their
// hours-long audit claims may have outlived what they vouched for) and every open session's budget is put right
// against its recorded charges. The lineage and its reconciliation are recorded in MongoDB once each; a process that
// dies half-way leaves the reconciliation to the next look (every step of it can run twice).
import type { Runtime } from '../runtime.ts';

/** What puts open sessions' budgets right (X402Sessions). */
export interface SessionBudgetRepair {
  repairOpenBudgets(limit: number): Promise<{ looked: number; repaired: number; failed: number }>;
}

/** Open sessions looked at, at most, after a loss. */
const SESSION_LIMIT = 200_000;

export class RedisLossWatch {
  /** The lineage this process last saw reconciled. */
  private seen: string | null = null;

  constructor(
    private readonly runtime: Runtime,
    private readonly sessions: SessionBudgetRepair,
  ) {}

  /** One look: cheap (one INFO per master) unless the masters changed since this process last looked. */
  async look(): Promise<{ lineage: string; reconciled: boolean }> {
    const store = this.runtime.stores.redisLineage;
    const { id, runIds } = await store.current();
    if (id === this.seen) return { lineage: id, reconciled: false };
    if (await store.reconciled(id)) {
      this.seen = id;
      return { lineage: id, reconciled: false };
    }
    await store.record(id, runIds, false);
    const summary = await this.reconcile();
    await store.record(id, runIds, true);
    this.seen = id;
    this.runtime.logger.warn(
      { lineage: id, masters: runIds.length, ...summary },
      'Redis masters changed (restart or failover): due indexes audited and session budgets checked against MongoDB',
    );
    return { lineage: id, reconciled: true };
  }

  private async reconcile() {
    const { settlements, runs, x402, x402Sessions, ledger } = this.runtime.stores;
    await Promise.all(
      [settlements.due, runs.finalizeDue, x402.due, x402.escalationsDue, x402Sessions.due].map((due) =>
        due.forgetAuditClaim(),
      ),
    );
    await ledger.forgetDueAuditClaim();
    const sessions = await this.sessions.repairOpenBudgets(SESSION_LIMIT);
    return { sessions };
  }
}
