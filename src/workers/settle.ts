import { holdbackOf } from '../domain/money.ts';
import { signReceipt } from '../domain/receipt.ts';
import { entryIds } from '../domain/settlement.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { Leg } from '../store/ledger.ts';
import { settlementState, type SettlementState } from '../store/settlements.ts';
import type { QueueProcessor } from './runner.ts';

/** Fault injection for tests: called after each step that moved money or state; throwing there simulates a crash. */
export type Failpoint = (step: string) => void;
const noFailpoint: Failpoint = () => undefined;
const SWEEP_BATCH = 200;

/**
 * Moves a settlement through every step that is due. Each decision is a fact recorded by unique insert (first
 * writer wins) and each movement of money a ledger entry with a derived id, so the worker, the sweeper and an ops
 * request may run this at once, or again after a crash anywhere, and every effect still happens exactly once.
 */
export async function advanceSettlement(runtime: Runtime, settlementId: string, failpoint: Failpoint = noFailpoint): Promise<SettlementState | null> {
  const { settlements, ledger, runs } = runtime.stores;
  const s = await settlements.get(settlementId);
  if (!s) return null;
  const facts = await settlements.factsOf(s._id);
  const ref = { settlementId: s._id, runId: s.runId };
  // What events name as the settled thing: the run, or the x402 gate.
  const subject = s.gateId ? { gateId: s.gateId } : { runId: s.runId };
  const fromEscrow = (amount: number): Leg => ({ walletId: s.payerWalletId, bucket: 'escrow', delta: -amount });
  const toAvailable = (walletId: string, amount: number): Leg => ({ walletId, bucket: 'available', delta: amount });
  // Every entry this pass applies; together with the facts it is the settlement's state (no re-read needed).
  const applied = new Set<string>();
  const move = async (id: string, kind: string, to: string, amount: number) => {
    await ledger.apply({ _id: id, tenantId: s.tenantId, kind, currency: s.currency, legs: [fromEscrow(amount), toAvailable(to, amount)], ref });
    applied.add(id);
  };

  // 1. Decide from the verdict, once: the decision (time and signed receipt included) is a fact.
  if (!facts.decision) {
    const run = await runs.get(s.tenantId, s.runId);
    if (!run || run.status !== 'finalized' || !run.verdict || !run.artifactId) throw new Error(`run ${s.runId} of ${s._id} is not finalized`);
    await ledger.ensureWallet(s.payeeWalletId, s.tenantId, 'agent');
    const pass = run.verdict === 'pass';
    const { holdback, releaseNow } = pass ? holdbackOf(s.amount, s.holdbackBps) : { holdback: 0, releaseNow: 0 };
    const decidedAt = new Date();
    const receipt = signReceipt(
      {
        schema: 'SettlementReceipt.v1',
        settlementId: s._id,
        runId: s.runId,
        payerWalletId: s.payerWalletId,
        payeeWalletId: s.payeeWalletId,
        amount: s.amount,
        releasedNow: releaseNow,
        holdback,
        currency: s.currency,
        verdict: run.verdict,
        artifactId: run.artifactId,
        artifactHash: run.artifactId.slice('art_'.length),
        decidedAt: decidedAt.toISOString(),
      },
      runtime.keys.active,
    );
    facts.decision = (
      await settlements.claim(s._id, 'decision', {
        verdict: run.verdict,
        reason: pass ? null : 'TERMS_NOT_MET',
        releaseNow,
        holdback,
        decidedAt: decidedAt.toISOString(),
        disputeWindowEndsAt: new Date(decidedAt.getTime() + s.disputeWindowSeconds * 1000).toISOString(),
        receipt,
      })
    ).fact;
  }
  const d = facts.decision;
  const pass = d.verdict === 'pass';

  // 2. Move what the decision releases now, then announce it (event ids derive from the settlement).
  if (pass && d.releaseNow > 0) await move(entryIds.release(s._id), 'settlement_release', s.payeeWalletId, d.releaseNow);
  failpoint('released');
  if (pass) {
    await runtime.emit(s.tenantId, 'settlement.completed', { ...subject, settlementId: s._id, amount: d.releaseNow, holdback: d.holdback, currency: s.currency }, `settlement.completed:${s._id}`);
  } else if (!s.gateId) {
    // A gate's failed verification is refunded at once (its refund ruling is recorded with the decision): never held.
    await runtime.emit(s.tenantId, 'settlement.held', { runId: s.runId, settlementId: s._id, reason: d.reason }, `settlement.held:${s._id}`);
  }
  failpoint('decided');

  // 3. The holdback's fate: released when the window ends, unless a dispute claimed it first.
  const windowEnds = Date.parse(d.disputeWindowEndsAt);
  if (pass && d.holdback > 0 && !facts.holdback) {
    if (Date.now() >= windowEnds) {
      facts.holdback = (await settlements.claim(s._id, 'holdback', { fate: 'release', at: new Date().toISOString() })).fact;
    } else {
      await runtime.producers.enqueue('settle', { tenantId: s.tenantId, runId: s.runId, settlementId: s._id }, jobIdFor('settle', s._id, 'holdback'), { delay: windowEnds - Date.now() });
    }
  }
  if (facts.holdback?.fate === 'release') {
    await move(entryIds.holdback(s._id), 'holdback_release', s.payeeWalletId, d.holdback);
    failpoint('holdback-released');
  }

  // 4. A dispute: announced once; a ruling splits the frozen holdback between payer and payee.
  if (facts.holdback?.fate === 'dispute') {
    const dispute = facts.holdback;
    await runtime.emit(s.tenantId, 'dispute.opened', { disputeId: dispute.disputeId, ...subject, settlementId: s._id }, `dispute.opened:${dispute.disputeId}`);
    const ruling = facts.ruling;
    if (ruling) {
      if (ruling.toPayer > 0) await move(entryIds.disputeToPayer(dispute.disputeId), 'dispute_refund', s.payerWalletId, ruling.toPayer);
      failpoint('dispute-payer-paid');
      if (ruling.toPayee > 0) await move(entryIds.disputeToPayee(dispute.disputeId), 'dispute_release', s.payeeWalletId, ruling.toPayee);
      failpoint('dispute-payee-paid');
      await runtime.emit(s.tenantId, 'dispute.resolved', { disputeId: dispute.disputeId, ...subject, settlementId: s._id, outcome: ruling.outcome, toPayer: ruling.toPayer, toPayee: ruling.toPayee, currency: s.currency }, `dispute.resolved:${dispute.disputeId}`);
    }
  }

  // 5. An ops ruling on a held settlement: the whole escrow to the payee, or back to the payer.
  if (!pass && facts.heldRuling) {
    const release = facts.heldRuling.outcome === 'release';
    await move(entryIds.held(s._id, facts.heldRuling.outcome), release ? 'held_release' : 'held_refund', release ? s.payeeWalletId : s.payerWalletId, s.amount);
    failpoint('held-resolved');
    if (release) {
      await runtime.emit(s.tenantId, 'settlement.completed', { ...subject, settlementId: s._id, amount: s.amount, holdback: 0, currency: s.currency }, `settlement.completed:${s._id}:held-release`);
    }
  }

  const state = settlementState(s, facts, applied);
  await settlements.cacheView(s._id, state.view, nextCheck(state, runtime.config.sweeper.staleAfterMs));
  return state;
}

/** When the sweeper should look again: never once final, or while waiting for a person; at the window's end. */
function nextCheck({ view, facts }: SettlementState, staleAfterMs: number): Date | null {
  if (view.final) return null;
  if (view.status === 'held' && !facts.heldRuling) return null;
  if (view.status === 'disputed' && !facts.ruling) return null;
  if (view.holdbackState === 'held' && view.disputeWindowEndsAt) return new Date(view.disputeWindowEndsAt);
  if (view.status === 'completed' && view.holdbackState === 'none' && view.disputeWindowEndsAt) return new Date(view.disputeWindowEndsAt);
  return new Date(Date.now() + staleAfterMs);
}

export function createSettleProcessor(runtime: Runtime): QueueProcessor<'settle'> {
  const { settlements, ledger, runs } = runtime.stores;
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
      const now = new Date();
      const staleBefore = new Date(now.getTime() - runtime.config.sweeper.staleAfterMs);
      let entries = 0;
      for (const entry of await ledger.pendingEntries(staleBefore, SWEEP_BATCH)) {
        await ledger.resume(entry._id).catch(() => undefined); // a debit that cannot be covered is recorded as rejected
        entries++;
      }
      const due = await settlements.due(now, SWEEP_BATCH);
      for (const s of due) await advanceSettlement(runtime, s._id);

      let unlocked = 0;
      const locks = await ledger.unreconciledLocks(staleBefore, SWEEP_BATCH);
      for (const lock of locks) {
        const runId = lock.ref.runId!;
        const run = await runs.getAny(runId);
        if (!run || !run.settlement) {
          const [fromAvailable, toEscrow] = lock.legs as [Leg, Leg];
          await ledger.apply({
            _id: `escrow:${runId}:unlock`,
            tenantId: lock.tenantId,
            kind: 'escrow_unlock',
            currency: lock.currency,
            legs: [{ ...toEscrow, delta: -toEscrow.delta }, { ...fromAvailable, delta: -fromAvailable.delta }],
            ref: { runId },
          });
          unlocked++;
        }
        await ledger.markReconciled(lock._id);
      }
      return { entries, settlements: due.length, locksChecked: locks.length, unlocked };
    },
  };
}
