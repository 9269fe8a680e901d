import type { Runtime } from '../runtime.ts';
import { lookAtReserveAgain, reconcileRunReserve } from '../services/escrow.ts';
import { periodicLedgerAudit } from '../services/ledger-audit.ts';
import { advanceSettlement, sweepSettlements } from '../services/settlement.ts';
import { sweepItems } from '../services/sweep-items.ts';
import type { QueueProcessor } from './runner.ts';

const SWEEP_BATCH = 200;

/** The `settle` queue: moves a settlement through its due steps (services/settlement.ts advanceSettlement). */
export function createSettleProcessor(runtime: Runtime): QueueProcessor<'settle'> {
  const { ledger } = runtime.stores;
  return {
    async process({ settlementId, ledgerHeads }) {
      // Where the API left the payer's chains when it asked for this settlement (its locks post on the escrow chain
      // the release debits): hints, each a posting that exists, so the release need not read past them.
      ledger.learnReportedHeads(ledgerHeads);
      const state = await advanceSettlement(runtime, settlementId);
      return state
        ? { status: state.view.status, holdbackState: state.view.holdbackState }
        : { skipped: 'no such settlement' };
    },

    /**
     * Finishes whatever a crash or a lost job left behind: ledger entries still pending, settlements with a step
     * due, and escrow locked for a run whose creation died before the run was stored. The settlements' due index is
     * split like the queue: each partition's sweep job sweeps its share. The ledger's part (its due index is split
     * too, but the ledger reads every partition of it at once; store/ledger-due.ts) is partition 0's sweep's, as is
     * the periodic ledger audit.
     */
    sweepsPerPartition: true,
    async sweep(partition) {
      if (partition !== undefined && partition !== 0) {
        const settlements = await sweepSettlements(runtime, SWEEP_BATCH, partition);
        return { settlements: settlements.looked, settlementsFailed: settlements.failed };
      }
      const staleBefore = new Date(Date.now() - runtime.config.sweeper.staleAfterMs);
      const audit = await ledger.auditDueIndex();
      if (audit) runtime.logger.info(audit, 'ledger due index audited against the entries');
      const { looked: entries, failed } = await ledger.finishStalledEntries(staleBefore, SWEEP_BATCH);
      if (failed > 0) runtime.logger.warn({ failed }, 'ledger entries could not be finished; retrying later');
      const settlements = await sweepSettlements(runtime, SWEEP_BATCH, partition);
      const reserves = sweepItems(runtime, 'run-reserves');
      let unlocked = 0;
      let reservesFailed = 0;
      const locks = await ledger.locksToReconcile(staleBefore, SWEEP_BATCH);
      for (const lock of locks) {
        const outcome = await reserves.run(lock.entryId, () => reconcileRunReserve(runtime, lock));
        if (outcome.ok && outcome.value) unlocked++;
        if (!outcome.ok) {
          reservesFailed++;
          await lookAtReserveAgain(runtime, lock.entryId, outcome.retryAt).catch(() => undefined);
        }
      }

      // The money invariant audit: at most every 10 minutes across all processes; it logs what it finds.
      await periodicLedgerAudit(runtime);
      return {
        entries,
        entriesFailed: failed,
        settlements: settlements.looked,
        settlementsFailed: settlements.failed,
        locksChecked: locks.length,
        unlocked,
        reservesFailed,
      };
    },
  };
}
