import { errors, ServiceError } from '../domain/errors.ts';
import { settlementSubject } from '../domain/events.ts';
import { failpoint } from '../domain/failpoints.ts';
import { MoneyInvariantError, recorded } from '../domain/money.ts';
import type { Runtime } from '../runtime.ts';
import { bucketMove, RUN_GRACE_MS, type LedgerEntryDoc, type Leg } from '../store/ledger.ts';
import type { RunSettlementTerms } from '../store/runs.ts';
import { emitEvent } from './events.ts';

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

/**
 * A run's escrow reserve is its lock entry. A run normally has one; a reserve returned while its run still wanted
 * it (its request died, the sweeper gave the money back, the client then retried) is followed by a new generation.
 * Run ids never contain ':', so these ids cannot collide.
 */
export const escrowEntryIds = {
  lock: (runId: string, generation = 1) =>
    generation === 1 ? `escrow:${runId}:lock` : `escrow:${runId}:lock:${generation}`,
  unlock: (runId: string, generation = 1) =>
    generation === 1 ? `escrow:${runId}:unlock` : `escrow:${runId}:unlock:${generation}`,
};

/** More generations than this means something returns reserves as fast as they are made: stop loudly. */
const MAX_RESERVE_GENERATIONS = 20;

/** When a run reserve not captured by then goes back to the payer. */
function deadlineOf(runtime: Runtime, lock: LedgerEntryDoc): number {
  return lock.createdAt.getTime() + runtime.config.reserves.runDeadlineSeconds * 1000;
}

/**
 * Has the settle sweeper look at a run reserve again at `at`. The sweeper reads the ledger's lock index as far
 * behind as it lets a fresh lock's request store its run (staleness, at least RUN_GRACE_MS), so the score is `at`
 * less that lag.
 */
export function lookAtReserveAgain(runtime: Runtime, lockEntryId: string, at: Date): Promise<void> {
  const lag = Math.max(runtime.config.sweeper.staleAfterMs, RUN_GRACE_MS);
  return runtime.stores.ledger.checkLockAt(lockEntryId, new Date(at.getTime() - lag));
}

function lookAgainAtDeadline(runtime: Runtime, lock: LedgerEntryDoc): Promise<void> {
  return lookAtReserveAgain(runtime, lock.entryId, new Date(deadlineOf(runtime, lock)));
}

function generationOf(lock: LedgerEntryDoc): number {
  return Number(lock.ref.generation ?? 1);
}

function runLockEntry(
  tenantId: string,
  runId: string,
  payerWalletId: string,
  terms: Pick<RunSettlementTerms, 'amount' | 'currency'>,
  generation: number,
) {
  return {
    _id: escrowEntryIds.lock(runId, generation),
    tenantId,
    kind: 'escrow_lock',
    currency: terms.currency,
    legs: bucketMove(payerWalletId, 'available', 'escrow', terms.amount),
    ref: { runId, generation: String(generation) },
  };
}

function lockHolds(lock: LedgerEntryDoc, payerWalletId: string, amount: number, currency: string): boolean {
  return lock.currency === currency && lock.legs[1]!.walletId === payerWalletId && lock.legs[1]!.delta === amount;
}

/**
 * Locks the run's amount in the payer's escrow, then records the terms on the run (`attach`), then gives the reserve
 * its deadline. Escrow goes first so that a 402 leaves nothing behind; a crash after the lock but before the terms
 * are stored leaves a reserve without an owner, which the settle sweeper returns (see `reconcileRunReserve`); the
 * client's retry then locks a new one. The payer must be an agent of the caller's tenant: one tenant can never
 * commit another's money.
 */
export async function withRunEscrow<T>(
  runtime: Runtime,
  tenantId: string,
  runId: string,
  payeeAgentId: string,
  terms: RunSettlementTerms,
  attach: () => Promise<T>,
): Promise<T> {
  const { agents, ledger, reserves } = runtime.stores;
  if (terms.payerAgentId === payeeAgentId) {
    throw errors.unprocessable('the payer must be another agent than the one doing the work', {
      errors: [{ path: 'body.settlement.payerAgentId', message: 'equals the run agent' }],
    });
  }
  const payer = await agents.get(tenantId, terms.payerAgentId);
  if (!payer) throw errors.notFound('payer agent');
  await ledger.ensureWallet(payer._id, tenantId, 'agent');
  const started = Date.now();
  let lock: LedgerEntryDoc | null = null;
  for (let generation = 1; !lock; generation++) {
    if (generation > MAX_RESERVE_GENERATIONS) throw new Error(`run ${runId}: every escrow reserve was returned`);
    const lockId = escrowEntryIds.lock(runId, generation);
    let candidate: LedgerEntryDoc;
    try {
      candidate = await ledger.apply(runLockEntry(tenantId, runId, payer._id, terms, generation));
    } catch (err) {
      if (!(err instanceof ServiceError && err.code === 'TRANSITION_ILLEGAL')) throw err;
      // One reserve per run: a lock made under other terms is not this one, unless it was returned meanwhile.
      if ((await reserves.fateOf(lockId))?.fate === 'returned') continue;
      throw errors.conflict('TRANSITION_ILLEGAL', 'escrow for this run is already locked under other terms', {
        status: 'locked',
      });
    }
    // A lock recorded before this call (a retry) may have been returned meanwhile: then lock under the next one.
    if (candidate.createdAt.getTime() < started && (await reserves.fateOf(lockId))?.fate === 'returned') continue;
    lock = candidate;
  }
  failpoint('run.escrow.locked');
  const attached = await attach();
  failpoint('run.escrow.attached');
  // Owned now: the sweeper looks at it again at its deadline (returned then unless its settlement captured it).
  await lookAgainAtDeadline(runtime, lock);
  return attached;
}

/**
 * The reserve a run's settlement pays from, captured for it: the fate claim is raced against the sweeper's return,
 * and a reserve returned first is replaced by a new lock from the payer's available funds (a shortfall is a
 * loud 402 that leaves the settlement pending, never a payment out of someone else's escrow). Answers the lock id.
 */
export async function captureRunReserve(
  runtime: Runtime,
  s: { _id: string; tenantId: string; runId: string; payerWalletId: string; amount: number; currency: string },
): Promise<string> {
  const { ledger, reserves } = runtime.stores;
  for (let generation = 1; generation <= MAX_RESERVE_GENERATIONS; generation++) {
    const lockId = escrowEntryIds.lock(s.runId, generation);
    const [fate, existing] = await Promise.all([reserves.claim(lockId, 'captured', s._id), ledger.getEntry(lockId)]);
    if (fate.fate === 'returned') continue;
    if (fate.by !== s._id) throw new Error(`reserve ${lockId} was captured by ${fate.by}, not by ${s._id}`);
    // Ours. Normally locked long ago; if its lock never finished (or never began), it is ours alone to make.
    const lock =
      existing?.state === 'applied'
        ? existing
        : await ledger.apply(runLockEntry(s.tenantId, s.runId, s.payerWalletId, s, generation));
    if (!lockHolds(lock, s.payerWalletId, s.amount, s.currency)) {
      throw new MoneyInvariantError(
        `reserve ${lockId} holds ${lock.legs[1]!.delta} ${lock.currency} of ${lock.legs[1]!.walletId}, not the settlement's ${s.amount} ${s.currency}`,
      );
    }
    await ledger.lockSettled(lockId); // nothing left for the reserve sweeper to decide
    return lockId;
  }
  throw new Error(`run ${s.runId}: every escrow reserve was returned`);
}

/**
 * The settle sweeper's look at a run reserve that is due: one whose run never came to hold its terms (its creation
 * died between lock and terms), or one at its deadline. Returned unless its settlement captured it first; the
 * return is claimed before the money moves, so a crash after the claim is finished by the next sweep.
 * Answers whether this look returned it.
 */
export async function reconcileRunReserve(runtime: Runtime, lock: LedgerEntryDoc): Promise<boolean> {
  const { ledger, reserves, runs } = runtime.stores;
  const runId = recorded(lock.ref.runId, `the run of reserve ${lock.entryId}`);
  const [run, known] = await Promise.all([runs.getAny(runId), reserves.fateOf(lock.entryId)]);
  let fate = known;
  if (!fate) {
    if (run?.settlement && Date.now() < deadlineOf(runtime, lock)) {
      await lookAgainAtDeadline(runtime, lock); // owned and in time
      return false;
    }
    fate = await reserves.claim(lock.entryId, 'returned', run?.settlement ? 'deadline' : 'orphaned');
    failpoint('run.reserve.return-claimed');
  }
  let returned = false;
  if (fate.fate === 'returned') {
    const [fromAvailable, toEscrow] = lock.legs as [Leg, Leg];
    const generation = generationOf(lock);
    const unlock = await ledger.apply({
      _id: escrowEntryIds.unlock(runId, generation),
      tenantId: lock.tenantId,
      kind: 'escrow_unlock',
      currency: lock.currency,
      legs: [
        { ...toEscrow, delta: -toEscrow.delta },
        { ...fromAvailable, delta: -fromAvailable.delta },
      ],
      ref: { runId, generation: String(generation) },
    });
    failpoint('run.reserve.returned');
    await emitEvent(
      runtime,
      lock.tenantId,
      'escrow.returned',
      {
        ...settlementSubject({ runId }),
        payerWalletId: fromAvailable.walletId,
        amount: toEscrow.delta,
        currency: lock.currency,
        reason: fate.by,
        entryId: unlock.entryId,
      },
      `escrow.returned:${lock.entryId}`,
    );
    returned = true;
  }
  await ledger.markReconciled(lock.entryId);
  return returned;
}
