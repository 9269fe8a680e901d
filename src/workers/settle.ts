import type { Runtime } from '../runtime.ts';
import { returnOrphanedLock } from '../services/escrow.ts';
import { advanceSettlement, sweepSettlements } from '../services/settlement.ts';
import type { QueueProcessor } from './runner.ts';

const SWEEP_BATCH = 200;

/** The `settle` queue: moves a settlement through its due steps (services/settlement.ts advanceSettlement). */
export function createSettleProcessor(runtime: Runtime): QueueProcessor<'settle'> {
  const { ledger } = runtime.stores;
  return {
    async process({ settlementId }) {
      const state = await advanceSettlement(runtime, settlementId);
      return state ? { status: state.view.status, holdbackState: state.view.holdbackState } : { skipped: 'no such settlement' };
    },

    /**
     * Finishes whatever a crash or a lost job left behind: ledger entries still pending, settlements with a step
     * due, and escrow locked for a run whose creation died before the run was stored.
     */
    async sweep() {
      const staleBefore = new Date(Date.now() - runtime.config.sweeper.staleAfterMs);
      let entries = 0;
      for (const entry of await ledger.pendingEntries(staleBefore, SWEEP_BATCH)) {
        await ledger.resume(entry._id).catch(() => undefined); // a debit that cannot be covered is recorded as rejected
        entries++;
      }
      const settlements = await sweepSettlements(runtime, SWEEP_BATCH);
      let unlocked = 0;
      const locks = await ledger.unreconciledLocks(staleBefore, SWEEP_BATCH);
      for (const lock of locks) if (await returnOrphanedLock(runtime, lock)) unlocked++;
      return { entries, settlements, locksChecked: locks.length, unlocked };
    },
  };
}
