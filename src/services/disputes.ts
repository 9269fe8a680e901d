import { assertClientJsonDepth, toStoredJson } from '../domain/client-json.ts';
import { newId } from '../domain/crypto.ts';
import { errors } from '../domain/errors.ts';
import { settlementSubject } from '../domain/events.ts';
import { failpoint } from '../domain/failpoints.ts';
import { disputeSplit } from '../domain/money.ts';
import type { RulingFact } from '../domain/settlement.ts';
import type { Runtime } from '../runtime.ts';
import { settlementOwner, type SettlementDoc, type SettlementState } from '../store/settlements.ts';
import { emitEvent } from './events.ts';
import { applyRuling, read } from './settlement.ts';

/**
 * The payer disputes a completed settlement inside its window: the holdback is frozen. The dispute and the
 * holdback's release at the window's end claim the same fact, so whichever is recorded first decides.
 */
export async function openDispute(
  runtime: Runtime,
  tenantId: string,
  runId: string,
  input: { reason: string; evidence?: unknown },
) {
  const { runs, settlements } = runtime.stores;
  const run = await runs.get(tenantId, runId);
  const s = run && (await settlements.byRun(run._id));
  if (!s) throw errors.notFound('settlement');
  return disputeSettlement(runtime, s, input);
}

/** Disputes one settlement (a run's, or a payment session payee's): its holdback is frozen until a ruling. */
export async function disputeSettlement(
  runtime: Runtime,
  s: SettlementDoc,
  input: { reason: string; evidence?: unknown },
) {
  const { settlements } = runtime.stores;
  if (input.evidence !== undefined) assertClientJsonDepth(input.evidence, 'body.evidence');
  const evidenceJson = input.evidence === undefined ? null : toStoredJson(input.evidence);
  const { view, facts } = await read(runtime, s);
  const now = Date.now();
  if (view.status !== 'completed' || facts.holdback)
    throw errors.transitionIllegal(`a ${view.status} settlement cannot be disputed`, view.status);
  if (!view.disputeWindowEndsAt || Date.parse(view.disputeWindowEndsAt) <= now)
    throw errors.transitionIllegal('the dispute window has ended', view.status);
  const disputeId = newId('dsp');
  const frozenAmount = view.holdbackState === 'held' ? view.holdback : 0;
  await settlements.referDispute(disputeId, s);
  // Due before the dispute exists: a crash before its announcement leaves it for a pass to announce (a settlement
  // with nothing held has no due record of its own by then; the pass sets the next one).
  await settlements.due.mark(
    s._id,
    s.tenantId,
    new Date(now + runtime.config.sweeper.staleAfterMs),
    settlementOwner(s),
  );
  const { won, fact } = await settlements.claim(s._id, 'holdback', {
    fate: 'dispute',
    disputeId,
    reason: input.reason,
    evidenceJson,
    frozenAmount,
    at: new Date(now).toISOString(),
  });
  if (!won) {
    throw errors.transitionIllegal(
      fact.fate === 'dispute' ? 'the settlement is already disputed' : 'the dispute window has ended',
      fact.fate === 'dispute' ? 'disputed' : 'completed',
    );
  }
  failpoint('dispute.opened');
  // Named as advanceSettlement names it (the same event id: whichever emits first, the data is the same).
  const subject = settlementSubject(s);
  // A test gate's settlement is test traffic: its events are marked and reach only endpoints that want them.
  const marks = { test: s.test === true };
  await emitEvent(
    runtime,
    s.tenantId,
    'dispute.opened',
    { disputeId, ...subject, settlementId: s._id },
    `dispute.opened:${disputeId}`,
    marks,
  );
  return { disputeId, status: 'open' as const, settlementId: s._id, runId: s.runId, frozenAmount };
}

/** Ops ruling on an open dispute: the frozen holdback goes to the payee, the payer, or is split. */
export async function resolveDispute(
  runtime: Runtime,
  disputeId: string,
  ruling: { outcome: 'payee' | 'payer' | 'split'; payerShareBps?: number },
): Promise<{ state: SettlementState; applied: boolean }> {
  const { settlements } = runtime.stores;
  const { outcome, payerShareBps } = ruling;
  if ((outcome === 'split') !== (payerShareBps !== undefined)) {
    throw errors.unprocessable('payerShareBps goes with outcome "split", and only with it', {
      errors: [{ path: 'body.payerShareBps', message: 'required for split, not allowed otherwise' }],
    });
  }
  const s = await settlements.byDispute(disputeId);
  if (!s) throw errors.notFound('dispute');
  const { facts, view } = await read(runtime, s);
  if (facts.holdback?.fate !== 'dispute' || facts.holdback.disputeId !== disputeId) throw errors.notFound('dispute');
  const { toPayer, toPayee } = disputeSplit(facts.holdback.frozenAmount, outcome, payerShareBps);
  const sameRuling = (r: RulingFact) => r.outcome === outcome && r.payerShareBps === (payerShareBps ?? null);
  // The same ruling again (a retry after a crash or a lost answer) finishes applying it; another one is refused.
  if (facts.ruling && !sameRuling(facts.ruling))
    throw errors.transitionIllegal('the dispute has already been ruled on', view.status);
  if (!facts.ruling) {
    await settlements.due.mark(s._id, s.tenantId, new Date(), settlementOwner(s)); // due before the ruling exists
    const { fact } = await settlements.claim(s._id, 'ruling', {
      outcome,
      payerShareBps: payerShareBps ?? null,
      toPayer,
      toPayee,
      at: new Date().toISOString(),
    });
    if (!sameRuling(fact)) throw errors.transitionIllegal('the dispute has already been ruled on', view.status);
  }
  failpoint('dispute.ruled');
  return applyRuling(runtime, s, `dispute-${disputeId}`);
}
