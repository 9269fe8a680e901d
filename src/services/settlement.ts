import { canonicalize } from '../domain/canonical-json.ts';
import { errors } from '../domain/errors.ts';
import { failpoint as crashPoint } from '../domain/failpoints.ts';
import { settlementSubject } from '../domain/events.ts';
import { assertMoney } from '../domain/money.ts';
import { signReceipt } from '../domain/receipt.ts';
import { assertDecisionSplit, capturedOf, decideSettlement, entryIds, releaseCredits, type SettlementFacts } from '../domain/settlement.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { Leg, PreparedEntry } from '../store/ledger.ts';
import type { RunDoc } from '../store/runs.ts';
import { readSettlement, settlementState, type SettlementDoc, type SettlementState } from '../store/settlements.ts';
import { captureRunReserve, settlementTerms, withRunEscrow, type SettlementTermsInput } from './escrow.ts';
import { emitEvent } from './events.ts';
import { sweepItems } from './sweep-items.ts';

/**
 * Fault injection for tests: called after each step that moved money or state; throwing there simulates a crash. By
 * default the step is the crash point `settlement.<step>` (domain/failpoints.ts), inert unless a test armed it.
 */
export type Failpoint = (step: string) => void;
const namedCrashPoints: Failpoint = (step) => crashPoint(`settlement.${step}`);

/** How long a settlement waiting for a person (a held one, an open dispute) goes before the sweeper looks again. */
const AWAITING_RULING_RECHECK_MS = 60 * 60 * 1000;

export function read(rt: Runtime, s: SettlementDoc): Promise<SettlementState> {
  return readSettlement(rt.stores.settlements, rt.stores.ledger, s);
}

function settleJob(s: SettlementDoc, ...parts: string[]) {
  return ['settle', { tenantId: s.tenantId, runId: s.runId, settlementId: s._id }, jobIdFor('settle', s._id, ...parts)] as const;
}

/**
 * Settles a finalized run: its terms (sent now if the run had none, which locks the escrow first) become a pending
 * settlement that the settle worker decides. Repeats return the same settlement.
 */
export async function settleRun(rt: Runtime, tenantId: string, runId: string, offeredInput?: SettlementTermsInput): Promise<{ run: RunDoc; settlement: SettlementDoc; state: SettlementState }> {
  const { runs, settlements } = rt.stores;
  let run = await runs.get(tenantId, runId);
  if (!run) throw errors.notFound('run');
  if (run.status !== 'finalized') throw errors.transitionIllegal('only a finalized run can be settled', run.status);
  const offered = offeredInput ? settlementTerms(offeredInput) : null;
  const otherTerms = (r: RunDoc) => errors.conflict('TRANSITION_ILLEGAL', 'the run already has other settlement terms', { status: r.status, settlement: r.settlement });
  if (run.settlement && offered && canonicalize(offered) !== canonicalize(run.settlement)) throw otherTerms(run);
  if (!run.settlement) {
    if (!offered) throw errors.conflict('TRANSITION_ILLEGAL', 'this run has no settlement terms; send them as settlement', { status: run.status, settlement: null });
    const current = run;
    run = await withRunEscrow(rt, tenantId, run._id, run.agentId, offered, () => runs.attachSettlement(tenantId, current._id, offered));
    if (canonicalize(run.settlement) !== canonicalize(offered)) throw otherTerms(run);
  }
  const terms = run.settlement!;
  const s = await settlements.createOrGet({
    tenantId,
    runId: run._id,
    payerWalletId: terms.payerAgentId,
    payeeWalletId: run.agentId,
    amount: terms.amount,
    currency: terms.currency,
    holdbackBps: terms.holdbackBps,
    disputeWindowSeconds: terms.disputeWindowSeconds,
  });
  const state = await read(rt, s);
  if (state.view.status === 'pending') await rt.producers.ensure(...settleJob(s));
  return { run, settlement: s, state };
}

/** The settlement of one of the tenant's runs. */
export async function getRunSettlement(rt: Runtime, tenantId: string, runId: string): Promise<SettlementState> {
  const run = await rt.stores.runs.get(tenantId, runId);
  const s = run && (await rt.stores.settlements.byRun(run._id));
  if (!s) throw errors.notFound('settlement');
  return read(rt, s);
}

/**
 * Applies a recorded ruling: the settle job is made sure of first (so the ruling completes even if this process
 * dies), then the steps are run right here, which is safe beside the job because every step happens once. Returns
 * the state and whether it is final.
 */
export async function applyRuling(rt: Runtime, s: SettlementDoc, ruling: string): Promise<{ state: SettlementState; applied: boolean }> {
  await rt.producers.ensure(...settleJob(s, ruling));
  const state = (await advanceSettlement(rt, s._id)) ?? (await read(rt, s));
  return { state, applied: state.view.final };
}

/** Ops ruling on a held settlement: the whole escrow to the payee (`release`) or back to the payer (`refund`). */
export async function resolveHeldSettlement(rt: Runtime, settlementId: string, outcome: 'release' | 'refund'): Promise<{ state: SettlementState; applied: boolean }> {
  const { settlements } = rt.stores;
  const s = await settlements.get(settlementId);
  if (!s) throw errors.notFound('settlement');
  const { view, facts } = await read(rt, s);
  // The same ruling again (a retry after a crash or a lost answer) finishes applying it; another one is refused.
  if (facts.heldRuling?.outcome === outcome) return applyRuling(rt, s, 'held-ruling');
  if (view.status !== 'held') throw errors.transitionIllegal(`a ${view.status} settlement cannot be resolved this way`, view.status);
  await settlements.due.mark(s._id, s.tenantId, new Date()); // due before the ruling exists
  const { fact } = await settlements.claim(s._id, 'heldRuling', { outcome, at: new Date().toISOString() });
  if (fact.outcome !== outcome) throw errors.transitionIllegal('the held settlement has already been ruled on', view.status);
  crashPoint('settlement.held-ruled');
  return applyRuling(rt, s, 'held-ruling');
}

/**
 * Moves a settlement through every step that is due. Each decision is a fact recorded by unique insert (first
 * writer wins) and each movement of money a ledger entry with a derived id, so the worker, the sweeper and an ops
 * request may run this at once, or again after a crash anywhere, and every effect still happens exactly once.
 */
export async function advanceSettlement(
  rt: Runtime,
  settlementId: string,
  failpoint: Failpoint = namedCrashPoints,
  /**
   * The settlement and its facts as the caller just read or claimed them (a snapshot is as good as a read made a
   * moment later: facts only ever get added, and every claim below hands back the winner's). `decidedNow`: the
   * caller won the decision, so no entry of this settlement can exist yet.
   */
  known?: { doc: SettlementDoc; facts: SettlementFacts; decidedNow: boolean; prepared?: Map<string, PreparedEntry> },
): Promise<SettlementState | null> {
  const { settlements, ledger, runs } = rt.stores;
  const s = known?.doc ?? (await settlements.get(settlementId));
  if (!s) return null;
  const facts: SettlementFacts = known ? { ...known.facts } : await settlements.factsOf(s._id);
  const ref = { settlementId: s._id, runId: s.runId };
  // What events name as the settled thing, one shape for a run, an x402 gate and an x402 session.
  const subject = settlementSubject(s);
  // A test gate's settlement is test traffic: its events are marked and reach only endpoints that want them.
  const marks = { test: s.test === true };
  const fromEscrow = (amount: number): Leg => ({ walletId: s.payerWalletId, bucket: 'escrow', delta: -amount });
  const toAvailable = (walletId: string, amount: number): Leg => ({ walletId, bucket: 'available', delta: amount });
  // Every entry this pass applies; together with the facts it is the settlement's state (no re-read needed).
  const applied = new Set<string>();
  const move = async (id: string, kind: string, to: string, amount: number) => {
    await ledger.apply({ _id: id, tenantId: s.tenantId, kind, currency: s.currency, legs: [fromEscrow(amount), toAvailable(to, amount)], ref }, { expectNew: known?.decidedNow === true, prepared: known?.prepared?.get(id) });
    applied.add(id);
  };

  // 1. Decide from the verdict, once: the decision (time and signed receipt included) is a fact. A run finalized
  //    without an artifact (its data could never make one) is a fail: its escrow is held for an ops ruling.
  if (!facts.decision) {
    const run = await runs.get(s.tenantId, s.runId);
    if (!run || run.status !== 'finalized' || !run.verdict) throw new Error(`run ${s.runId} of ${s._id} is not finalized`);
    // The run's reserve becomes this settlement's before anything is decided: every later move takes from it.
    const [reserveId] = await Promise.all([captureRunReserve(rt, s), ledger.ensureWallet(s.payeeWalletId, s.tenantId, 'agent')]);
    failpoint('reserve-captured');
    const verdict = run.verdict === 'pass' && run.artifactId !== null ? 'pass' : 'fail';
    const decision = decideSettlement({ settlementId: s._id, ...s }, verdict, run.finalizeError?.code ?? 'TERMS_NOT_MET', new Date(), (money) =>
      signReceipt(
        {
          schema: 'SettlementReceipt.v1',
          settlementId: s._id,
          runId: s.runId,
          payerWalletId: s.payerWalletId,
          payeeWalletId: s.payeeWalletId,
          amount: s.amount,
          releasedNow: money.releasedNow,
          holdback: money.holdback,
          currency: s.currency,
          verdict: money.verdict,
          artifactId: run.artifactId,
          artifactHash: run.artifactId?.slice('art_'.length) ?? null,
          decidedAt: money.decidedAt,
        },
        rt.keys.active,
      ), reserveId);
    facts.decision = (await settlements.claim(s._id, 'decision', decision)).fact;
  }
  const d = facts.decision;
  const pass = d.verdict === 'pass';
  assertDecisionSplit(s._id, s.amount, d);
  if (facts.ruling) {
    const frozen = facts.holdback?.fate === 'dispute' ? facts.holdback.frozenAmount : -1;
    assertMoney(facts.ruling.toPayer + facts.ruling.toPayee === frozen && frozen === d.holdback, `settlement ${s._id}: ruling ${facts.ruling.toPayer}+${facts.ruling.toPayee} does not split the frozen holdback ${d.holdback}`);
  }

  // The decision's announcement and the holdback's timer go out while the pass goes on (they move no money and are
  // repeated by every pass: event ids derive from the settlement, the job id from its step). The pass waits for them
  // before any later announcement (events keep their order) and before it ends: a failure still fails the pass, and
  // the due record is only removed once they landed.
  const started: Array<Promise<unknown>> = [];
  const inFlight = (work: Promise<unknown>) => {
    work.catch(() => undefined); // awaited below; a failure must not go unhandled meanwhile
    started.push(work);
  };

  // 2. Move what the decision releases now, then announce it (event ids derive from the settlement). A metered pass
  //    charged less than its reserve: the same entry returns the rest to the payer at once (one debit of the escrow,
  //    a credit to each), so a metered call costs what a whole one does.
  const uncaptured = pass ? s.amount - capturedOf(s.amount, d) : 0;
  const credits = pass ? releaseCredits(s, d) : [];
  if (credits.length > 0) {
    const id = entryIds.release(s._id);
    const legs = [fromEscrow(credits.reduce((sum, c) => sum + c.amount, 0)), ...credits.map((c) => toAvailable(c.walletId, c.amount))];
    await ledger.apply({ _id: id, tenantId: s.tenantId, kind: 'settlement_release', currency: s.currency, legs, ref }, { expectNew: known?.decidedNow === true, prepared: known?.prepared?.get(id) });
    applied.add(id);
  }
  failpoint('released');
  if (pass) {
    const returned = uncaptured > 0 ? { uncaptured } : {};
    inFlight(emitEvent(rt, s.tenantId, 'settlement.completed', { ...subject, settlementId: s._id, amount: d.releaseNow, holdback: d.holdback, currency: s.currency, ...returned }, `settlement.completed:${s._id}`, marks));
  } else if (!s.gateId && !s.sessionId) {
    // A gate's failed verification is refunded at once (its refund ruling is recorded with the decision): never held.
    inFlight(emitEvent(rt, s.tenantId, 'settlement.held', { ...subject, settlementId: s._id, amount: s.amount, currency: s.currency, reason: d.reason }, `settlement.held:${s._id}`, marks));
  }
  failpoint('decided');

  // 3. The holdback's fate: released when the window ends, unless a dispute claimed it first.
  const windowEnds = Date.parse(d.disputeWindowEndsAt);
  if (pass && d.holdback > 0 && !facts.holdback) {
    if (Date.now() >= windowEnds) {
      facts.holdback = (await settlements.claim(s._id, 'holdback', { fate: 'release', at: new Date().toISOString() })).fact;
    } else {
      inFlight(rt.producers.schedule(...settleJob(s, 'holdback'), windowEnds - Date.now()));
    }
  }
  if (facts.holdback?.fate === 'release') {
    await move(entryIds.holdback(s._id), 'holdback_release', s.payeeWalletId, d.holdback);
    failpoint('holdback-released');
    await Promise.all(started);
    await emitEvent(rt, s.tenantId, 'settlement.holdback_released', { ...subject, settlementId: s._id, amount: d.holdback, currency: s.currency }, `settlement.holdback_released:${s._id}`, marks);
  }

  // 4. A dispute: announced once; a ruling splits the frozen holdback between payer and payee.
  if (facts.holdback?.fate === 'dispute') {
    const dispute = facts.holdback;
    await Promise.all(started);
    await emitEvent(rt, s.tenantId, 'dispute.opened', { disputeId: dispute.disputeId, ...subject, settlementId: s._id }, `dispute.opened:${dispute.disputeId}`, marks);
    const ruling = facts.ruling;
    if (ruling) {
      if (ruling.toPayer > 0) await move(entryIds.disputeToPayer(dispute.disputeId), 'dispute_refund', s.payerWalletId, ruling.toPayer);
      failpoint('dispute-payer-paid');
      if (ruling.toPayee > 0) await move(entryIds.disputeToPayee(dispute.disputeId), 'dispute_release', s.payeeWalletId, ruling.toPayee);
      failpoint('dispute-payee-paid');
      await emitEvent(rt, s.tenantId, 'dispute.resolved', { disputeId: dispute.disputeId, ...subject, settlementId: s._id, outcome: ruling.outcome, toPayer: ruling.toPayer, toPayee: ruling.toPayee, currency: s.currency }, `dispute.resolved:${dispute.disputeId}`, marks);
    }
  }

  // 5. An ops ruling on a held settlement: the whole escrow to the payee, or back to the payer.
  if (!pass && facts.heldRuling) {
    await Promise.all(started);
    const release = facts.heldRuling.outcome === 'release';
    await move(entryIds.held(s._id, facts.heldRuling.outcome), release ? 'held_release' : 'held_refund', release ? s.payeeWalletId : s.payerWalletId, s.amount);
    failpoint('held-resolved');
    if (release) {
      await emitEvent(rt, s.tenantId, 'settlement.completed', { ...subject, settlementId: s._id, amount: s.amount, holdback: 0, currency: s.currency }, `settlement.completed:${s._id}:held-release`, marks);
    } else {
      // An operator's refund ruling, or a gate's failed verification (refunded at once).
      await emitEvent(rt, s.tenantId, 'settlement.refunded', { ...subject, settlementId: s._id, amount: s.amount, currency: s.currency, reason: d.reason ?? 'held_ruling' }, `settlement.refunded:${s._id}`, marks);
    }
  }

  const state = settlementState(s, facts, applied);
  const next = nextCheck(state, rt.config.sweeper.staleAfterMs);
  // A gate's or a session payee's settlement has a due record only once a pass left work for later: the pass that
  // won its decision (nothing before the decision marks one) has none to remove.
  const noRecord = known?.decidedNow === true && (s.gateId != null || s.sessionId != null);
  // The due record is a hint: it does not wait for what is still in flight, except that the sweeper's record goes
  // only once everything it would redo has landed.
  await Promise.all([...started, next ? settlements.due.mark(s._id, s.tenantId, next) : noRecord ? null : Promise.all(started).then(() => settlements.due.done(s._id))]);
  return state;
}

/**
 * When the sweeper should look again: never once nothing is left for it (final, or completed with nothing held: the
 * view turns final at the window's end by itself, and a dispute's ruling makes its settlement due); rarely while
 * waiting for a person; at the window's end when a holdback waits for it.
 */
function nextCheck({ view, facts }: SettlementState, staleAfterMs: number): Date | null {
  if (view.final) return null;
  const awaitingRuling = (view.status === 'held' && !facts.heldRuling) || (view.status === 'disputed' && !facts.ruling);
  if (awaitingRuling) return new Date(Date.now() + AWAITING_RULING_RECHECK_MS);
  if (view.holdbackState === 'held' && view.disputeWindowEndsAt) return new Date(view.disputeWindowEndsAt);
  if (view.status === 'completed' && view.holdbackState === 'none' && view.disputeWindowEndsAt) return null;
  return new Date(Date.now() + staleAfterMs);
}

/**
 * Advances every settlement that is due (their job lost, or a step waiting for its time). One that fails backs off
 * alone (its due record moves later) and is counted; the sweep goes on with the others.
 */
export async function sweepSettlements(rt: Runtime, limit: number): Promise<{ looked: number; failed: number }> {
  const audit = await rt.stores.settlements.due.audit();
  if (audit) rt.logger.info(audit, 'settlement due index audited against its records');
  const now = Date.now();
  const due = await rt.stores.settlements.due.due(new Date(now), limit);
  const items = sweepItems(rt, 'settlements');
  let failed = 0;
  for (const record of due) {
    const outcome = await items.run(record._id, () => advanceSettlement(rt, record._id));
    if (!outcome.ok) {
      failed++;
      await rt.stores.settlements.due.mark(record._id, record.tenantId, outcome.retryAt).catch(() => undefined);
      continue;
    }
    // A record is written just before its settlement: only one long without a settlement outlived a failed create.
    if (!outcome.value && record.dueAt.getTime() < now - rt.config.sweeper.staleAfterMs) await rt.stores.settlements.due.done(record._id);
  }
  return { looked: due.length, failed };
}
