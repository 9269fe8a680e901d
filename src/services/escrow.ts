import { errors } from '../domain/errors.ts';
import type { Runtime } from '../runtime.ts';
import { bucketMove, type LedgerEntryDoc, type Leg } from '../store/ledger.ts';
import type { RunSettlementTerms } from '../store/runs.ts';

/** Settlement terms as a client sends them; `settlementTerms` fills the contract's defaults. */
export interface SettlementTermsInput {
  payerAgentId: string;
  amount: number;
  currency: string;
  holdbackBps?: number;
  disputeWindowSeconds?: number;
}

export function settlementTerms(input: SettlementTermsInput): RunSettlementTerms {
  return {
    payerAgentId: input.payerAgentId,
    amount: input.amount,
    currency: input.currency,
    holdbackBps: input.holdbackBps ?? 0,
    disputeWindowSeconds: input.disputeWindowSeconds ?? 86_400,
  };
}

/** One escrow lock per run: its ledger entry id derives from the run. */
export const escrowEntryIds = {
  lock: (runId: string) => `escrow:${runId}:lock`,
  unlock: (runId: string) => `escrow:${runId}:unlock`,
};

/**
 * Locks the run's amount in the payer's escrow, then records the terms on the run (`attach`), then marks the lock as
 * belonging to a run. Escrow goes first so that a 402 leaves nothing behind; a crash after the lock but before the
 * terms are stored leaves a lock the settle sweeper returns (see `returnOrphanedLock`). The payer must be an agent of
 * the caller's tenant: one tenant can never commit another's money.
 */
export async function withRunEscrow<T>(rt: Runtime, tenantId: string, runId: string, payeeAgentId: string, terms: RunSettlementTerms, attach: () => Promise<T>): Promise<T> {
  const { agents, ledger } = rt.stores;
  if (terms.payerAgentId === payeeAgentId) {
    throw errors.unprocessable('the payer must be another agent than the one doing the work', { errors: [{ path: 'body.settlement.payerAgentId', message: 'equals the run agent' }] });
  }
  const payer = await agents.get(tenantId, terms.payerAgentId);
  if (!payer) throw errors.notFound('payer agent');
  await ledger.ensureWallet(payer._id, tenantId, 'agent');
  const lock = await ledger.apply({
    _id: escrowEntryIds.lock(runId),
    tenantId,
    kind: 'escrow_lock',
    currency: terms.currency,
    legs: bucketMove(payer._id, 'available', 'escrow', terms.amount),
    ref: { runId },
  });
  // One lock per run: a lock already made under other terms is not this one.
  if (lock.currency !== terms.currency || lock.legs[1]!.walletId !== payer._id || lock.legs[1]!.delta !== terms.amount) {
    throw errors.conflict('TRANSITION_ILLEGAL', 'escrow for this run is already locked under other terms', { status: 'locked' });
  }
  const attached = await attach();
  await ledger.markReconciled(lock.entryId); // the lock has its run: nothing for the sweeper to return
  return attached;
}

/** Returns a lock whose run never came to hold its terms (its creation died between lock and insert). */
export async function returnOrphanedLock(rt: Runtime, lock: LedgerEntryDoc): Promise<boolean> {
  const runId = lock.ref.runId!;
  const run = await rt.stores.runs.getAny(runId);
  let returned = false;
  if (!run || !run.settlement) {
    const [fromAvailable, toEscrow] = lock.legs as [Leg, Leg];
    await rt.stores.ledger.apply({
      _id: escrowEntryIds.unlock(runId),
      tenantId: lock.tenantId,
      kind: 'escrow_unlock',
      currency: lock.currency,
      legs: [{ ...toEscrow, delta: -toEscrow.delta }, { ...fromAvailable, delta: -fromAvailable.delta }],
      ref: { runId },
    });
    returned = true;
  }
  await rt.stores.ledger.markReconciled(lock.entryId);
  return returned;
}
