import { canonicalize } from '../domain/canonical-json.ts';
import { errors } from '../domain/errors.ts';
import { failpoint as crashPoint } from '../domain/failpoints.ts';
import { settlementSubject } from '../domain/events.ts';
import { assertMoney, recorded } from '../domain/money.ts';
import { pricedCapture, pricingSha256 as scheduleSha256 } from '../domain/pricing.ts';
import { receiptMoney, signReceipt } from '../domain/receipt.ts';
import {
  assertDecisionSplit,
  capturedOf,
  decideSettlement,
  entryIds,
  releaseCredits,
  type DecidedMoney,
  type SettlementFacts,
} from '../domain/settlement.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import { accountOf, type Leg, type PreparedEntry } from '../store/ledger.ts';
import type { RunDoc } from '../store/runs.ts';
import type { DueRecord } from '../store/due-work.ts';
import {
  readSettlement,
  settlementOwner,
  settlementState,
  type SettlementDoc,
  type SettlementState,
} from '../store/settlements.ts';
import { captureRunReserve, settlementTerms, withRunEscrow, type SettlementTermsInput } from './escrow.ts';
import { emitEvent } from './events.ts';
import { logStep } from './work-log.ts';
import { sweepItems, sweptPartitions } from './sweep-items.ts';

/**
 * Fault injection for tests: called after each step that moved money or state; throwing there simulates a crash. By
 * default the step is the crash point `settlement.<step>` (domain/failpoints.ts), inert unless a test armed it.
 */
export type Failpoint = (step: string) => void;
const namedCrashPoints: Failpoint = (step) => crashPoint(`settlement.${step}`);

/** How long a settlement waiting for a person (a held one, an open dispute) goes before the sweeper looks again. */
const AWAITING_RULING_RECHECK_MS = 60 * 60 * 1000;
/** Ledger entry kinds of a settlement that give money back to the payer (logged as settlement.refunded). */
const REFUNDS = new Set(['held_refund', 'dispute_refund']);

export function read(runtime: Runtime, s: SettlementDoc): Promise<SettlementState> {
  return readSettlement(runtime.stores.settlements, runtime.stores.ledger, s);
}

function settleJob(s: SettlementDoc, ...parts: string[]) {
  return [
    'settle',
    { tenantId: s.tenantId, runId: s.runId, settlementId: s._id },
    jobIdFor('settle', s._id, ...parts),
  ] as const;
}

/**
 * The settle job that decides a run's settlement, with where this process left the payer's chains: the run's lock
 * (and every other lock this process made for the payer) posted there, and the worker's release debits the same
 * escrow chain. Knowing them, the worker need not read past them before it claims (see ledger.learnReportedHeads).
 */
function decideJob(runtime: Runtime, s: SettlementDoc) {
  const [queue, payload, jobId] = settleJob(s);
  const ledgerHeads = runtime.stores.ledger.knownHeadsOf(
    (['escrow', 'available'] as const).map((bucket) => accountOf(s.payerWalletId, s.currency, bucket)),
  );
  return [queue, ledgerHeads.length > 0 ? { ...payload, ledgerHeads } : payload, jobId] as const;
}

/**
 * Settles a finalized run: its terms (sent now if the run had none, which locks the escrow first) become a pending
 * settlement that the settle worker decides. Repeats return the same settlement.
 */
export async function settleRun(
  runtime: Runtime,
  tenantId: string,
  runId: string,
  offeredInput?: SettlementTermsInput,
): Promise<{ run: RunDoc; settlement: SettlementDoc; state: SettlementState }> {
  const { runs, settlements } = runtime.stores;
  let run = await runs.get(tenantId, runId);
  if (!run) throw errors.notFound('run');
  if (run.status !== 'finalized') throw errors.transitionIllegal('only a finalized run can be settled', run.status);
  const offered = offeredInput ? settlementTerms(offeredInput) : null;
  const otherTerms = (r: RunDoc) =>
    errors.conflict('TRANSITION_ILLEGAL', 'the run already has other settlement terms', {
      status: r.status,
      settlement: r.settlement,
    });
  if (run.settlement && offered && canonicalize(offered) !== canonicalize(run.settlement)) throw otherTerms(run);
  if (!run.settlement) {
    if (!offered)
      throw errors.conflict('TRANSITION_ILLEGAL', 'this run has no settlement terms; send them as settlement', {
        status: run.status,
        settlement: null,
      });
    const current = run;
    run = await withRunEscrow(runtime, tenantId, run._id, run.agentId, offered, () =>
      runs.attachSettlement(tenantId, current._id, offered),
    );
    if (canonicalize(run.settlement) !== canonicalize(offered)) throw otherTerms(run);
  }
  const terms = recorded(run.settlement, `the settlement terms of run ${run._id}`);
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
  const state = await read(runtime, s);
  if (state.view.status === 'pending') await runtime.producers.ensure(...decideJob(runtime, s));
  return { run, settlement: s, state };
}

/** The settlement of one of the tenant's runs. */
export async function getRunSettlement(runtime: Runtime, tenantId: string, runId: string): Promise<SettlementState> {
  const run = await runtime.stores.runs.get(tenantId, runId);
  const s = run && (await runtime.stores.settlements.byRun(run._id));
  if (!s) throw errors.notFound('settlement');
  return read(runtime, s);
}

/**
 * Applies a recorded ruling: the settle job is made sure of first (so the ruling completes even if this process
 * dies), then the steps are run right here, which is safe beside the job because every step happens once. Returns
 * the state and whether it is final.
 */
export async function applyRuling(
  runtime: Runtime,
  s: SettlementDoc,
  ruling: string,
): Promise<{ state: SettlementState; applied: boolean }> {
  await runtime.producers.ensure(...settleJob(s, ruling));
  const state = (await advanceSettlement(runtime, s._id)) ?? (await read(runtime, s));
  return { state, applied: state.view.final };
}

/** Ops ruling on a held settlement: the whole escrow to the payee (`release`) or back to the payer (`refund`). */
export async function resolveHeldSettlement(
  runtime: Runtime,
  settlementId: string,
  outcome: 'release' | 'refund',
): Promise<{ state: SettlementState; applied: boolean }> {
  const { settlements } = runtime.stores;
  const s = await settlements.get(settlementId);
  if (!s) throw errors.notFound('settlement');
  const { view, facts } = await read(runtime, s);
  // The same ruling again (a retry after a crash or a lost answer) finishes applying it; another one is refused.
  if (facts.heldRuling?.outcome === outcome) return applyRuling(runtime, s, 'held-ruling');
  if (view.status !== 'held')
    throw errors.transitionIllegal(`a ${view.status} settlement cannot be resolved this way`, view.status);
  await settlements.due.mark(s._id, s.tenantId, new Date(), settlementOwner(s)); // due before the ruling exists
  const { fact } = await settlements.claim(s._id, 'heldRuling', { outcome, at: new Date().toISOString() });
  if (fact.outcome !== outcome)
    throw errors.transitionIllegal('the held settlement has already been ruled on', view.status);
  crashPoint('settlement.held-ruled');
  return applyRuling(runtime, s, 'held-ruling');
}

/**
 * Moves a settlement through every step that is due. Each decision is a fact recorded by unique insert (first
 * writer wins) and each movement of money a ledger entry with a derived id, so the worker, the sweeper and an ops
 * request may run this at once, or again after a crash anywhere, and every effect still happens exactly once.
 */
export async function advanceSettlement(
  runtime: Runtime,
  settlementId: string,
  failpoint: Failpoint = namedCrashPoints,
  /**
   * The settlement and its facts as the caller just read or claimed them (a snapshot is as good as a read made a
   * moment later: facts only ever get added, and every claim below hands back the winner's). `decidedNow`: the
   * caller won the decision, so no entry of this settlement can exist yet.
   */
  known?: { doc: SettlementDoc; facts: SettlementFacts; decidedNow: boolean; prepared?: Map<string, PreparedEntry> },
): Promise<SettlementState | null> {
  const s = known?.doc ?? (await runtime.stores.settlements.get(settlementId));
  if (!s) return null;
  const facts: SettlementFacts = known ? { ...known.facts } : await runtime.stores.settlements.factsOf(s._id);
  const pass = new SettlementPass(runtime, s, facts, failpoint, known);
  const decision = await pass.decide();
  const paid = decision.verdict === 'pass';
  await pass.releaseNow(decision);
  await pass.holdbackFate(decision);
  if (facts.holdback?.fate === 'dispute') await pass.dispute(facts.holdback);
  if (!paid && facts.heldRuling) await pass.heldRuling(facts.heldRuling);
  return pass.finish();
}

type Decision = NonNullable<SettlementFacts['decision']>;

/**
 * A run priced by use settles what its artifact says the usage costs, capped by the escrow (a fail charges nothing);
 * the receipt binds the schedule's hash, the usage and the priced amount. Null for a run without a price schedule.
 */
async function pricedRunCharge(runtime: Runtime, run: RunDoc, escrowAmount: number, verdict: 'pass' | 'fail') {
  if (!run.pricing) return null;
  // A priced run finalized without an artifact (its usage could not be priced) has nothing to charge: it fails.
  const doc = run.artifactId ? await runtime.stores.runs.getArtifactDoc(run.artifactId) : null;
  const pricing = doc ? runtime.stores.runs.artifactHeader(doc).pricing : undefined;
  if (verdict === 'pass') recorded(pricing, `the priced usage in the artifact of run ${run._id}`);
  if (!pricing) return { captured: 0, receipt: { pricingSha256: scheduleSha256(run.pricing) } };
  const { pricingSha256, usage, amount } = pricing;
  return {
    captured: pricedCapture(amount, escrowAmount, verdict),
    receipt: { pricingSha256, usage, pricedAmount: amount },
  };
}

/**
 * One pass over a settlement, its steps in the order advanceSettlement calls them. Every entry it applies is kept
 * (with the facts it is the settlement's state, so nothing is read again), and the announcements that move no money
 * go out while the pass goes on: the pass waits for them before any later announcement (events keep their order)
 * and before it ends, so a failure still fails the pass and the due record is only removed once they landed.
 */
class SettlementPass {
  private readonly ref: { settlementId: string; runId: string };
  /** What events name as the settled thing, one shape for a run, an x402 gate and an x402 session. */
  private readonly subject: ReturnType<typeof settlementSubject>;
  /** A test gate's settlement is test traffic: its events are marked and reach only endpoints that want them. */
  private readonly marks: { test: boolean };
  private readonly applied = new Set<string>();
  private readonly started: Array<Promise<unknown>> = [];

  constructor(
    private readonly runtime: Runtime,
    private readonly s: SettlementDoc,
    private readonly facts: SettlementFacts,
    private readonly failpoint: Failpoint,
    private readonly known: { decidedNow: boolean; prepared?: Map<string, PreparedEntry> } | undefined,
  ) {
    this.ref = { settlementId: s._id, runId: s.runId };
    this.subject = settlementSubject(s);
    this.marks = { test: s.test === true };
  }

  /** Moves `legs` from the payer's escrow under the derived entry id `id`, once. */
  private async apply(id: string, kind: string, credits: Array<{ walletId: string; amount: number }>): Promise<void> {
    const { s } = this;
    const fromEscrow: Leg = {
      walletId: s.payerWalletId,
      bucket: 'escrow',
      delta: -credits.reduce((sum, c) => sum + c.amount, 0),
    };
    const legs = [
      fromEscrow,
      ...credits.map((c): Leg => ({ walletId: c.walletId, bucket: 'available', delta: c.amount })),
    ];
    let recordedHere = false;
    await this.runtime.stores.ledger.apply(
      { _id: id, tenantId: s.tenantId, kind, currency: s.currency, legs, ref: this.ref },
      {
        expectNew: this.known?.decidedNow === true,
        prepared: this.known?.prepared?.get(id),
        onRecorded: (byThisCall) => (recordedHere = byThisCall),
      },
    );
    this.applied.add(id);
    // Logged once applied, by the pass that recorded the entry (a repeated or concurrent pass finds it recorded).
    if (recordedHere) {
      const paidTo = (walletId: string) => credits.find((c) => c.walletId === walletId)?.amount ?? 0;
      logStep(this.runtime, REFUNDS.has(kind) ? 'settlement.refunded' : 'settlement.released', {
        tenantId: s.tenantId,
        settlementId: s._id,
        ...this.subject,
        entryId: id,
        kind,
        toPayee: paidTo(s.payeeWalletId),
        toPayer: paidTo(s.payerWalletId),
        currency: s.currency,
      });
    }
  }

  private inFlight(work: Promise<unknown>): void {
    work.catch(() => undefined); // awaited later; a failure must not go unhandled meanwhile
    this.started.push(work);
  }

  private emit(type: Parameters<typeof emitEvent>[2], data: Record<string, unknown>, cause: string): Promise<unknown> {
    return emitEvent(
      this.runtime,
      this.s.tenantId,
      type,
      { ...this.subject, settlementId: this.s._id, ...data },
      cause,
      this.marks,
    );
  }

  /**
   * 1. Decides from the verdict, once: the decision (time and signed receipt included) is a fact. A run finalized
   *    without an artifact (its data could never make one) is a fail: its escrow is held for an ops ruling.
   */
  async decide(): Promise<Decision> {
    const { runtime, s, facts } = this;
    // Decided by this pass, or by its caller just before it (a gate's or a session's decision is claimed there).
    let decidedHere = this.known?.decidedNow === true;
    if (!facts.decision) {
      const run = await runtime.stores.runs.get(s.tenantId, s.runId);
      if (!run || run.status !== 'finalized' || !run.verdict)
        throw new Error(`run ${s.runId} of ${s._id} is not finalized`);
      // The run's reserve becomes this settlement's before anything is decided: every later move takes from it.
      const [reserveId] = await Promise.all([
        captureRunReserve(runtime, s),
        runtime.stores.ledger.ensureWallet(s.payeeWalletId, s.tenantId, 'agent'),
      ]);
      this.failpoint('reserve-captured');
      const verdict = run.verdict === 'pass' && run.artifactId !== null ? 'pass' : 'fail';
      const priced = await pricedRunCharge(runtime, run, s.amount, verdict);
      const sign = (money: DecidedMoney) =>
        signReceipt(
          {
            ...receiptMoney({ settlementId: s._id, ...s }, money),
            runId: s.runId,
            artifactId: run.artifactId,
            artifactHash: run.artifactId?.slice('art_'.length) ?? null,
            ...(priced ? { ...priced.receipt, captured: money.captured } : {}),
          },
          runtime.keys.active,
        );
      const decision = decideSettlement(
        { settlementId: s._id, ...s, ...(priced ? { captured: priced.captured } : {}) },
        verdict,
        run.finalizeError?.code ?? 'TERMS_NOT_MET',
        new Date(),
        sign,
        reserveId,
      );
      const claimed = await runtime.stores.settlements.claim(s._id, 'decision', decision);
      facts.decision = claimed.fact;
      decidedHere = claimed.won;
    }
    const d = facts.decision;
    assertDecisionSplit(s._id, s.amount, d);
    if (decidedHere)
      logStep(runtime, 'settlement.decided', {
        tenantId: s.tenantId,
        settlementId: s._id,
        ...this.subject,
        verdict: d.verdict,
        reason: d.reason,
        amount: s.amount,
        captured: d.verdict === 'pass' ? capturedOf(s.amount, d) : 0,
        releaseNow: d.releaseNow,
        holdback: d.holdback,
        currency: s.currency,
      });
    if (facts.ruling) {
      const frozen = facts.holdback?.fate === 'dispute' ? facts.holdback.frozenAmount : -1;
      assertMoney(
        facts.ruling.toPayer + facts.ruling.toPayee === frozen && frozen === d.holdback,
        `settlement ${s._id}: ruling ${facts.ruling.toPayer}+${facts.ruling.toPayee} does not split the frozen holdback ${d.holdback}`,
      );
    }
    return d;
  }

  /**
   * 2. Moves what the decision releases now, then announces it (event ids derive from the settlement). A metered
   *    pass charged less than its reserve: the same entry returns the rest to the payer at once (one debit of the
   *    escrow, a credit to each), so a metered call costs what a whole one does.
   */
  async releaseNow(d: Decision): Promise<void> {
    const { s } = this;
    const pass = d.verdict === 'pass';
    const uncaptured = pass ? s.amount - capturedOf(s.amount, d) : 0;
    const credits = pass ? releaseCredits(s, d) : [];
    if (credits.length > 0) await this.apply(entryIds.release(s._id), 'settlement_release', credits);
    this.failpoint('released');
    if (pass) {
      const returned = uncaptured > 0 ? { uncaptured } : {};
      this.inFlight(
        this.emit(
          'settlement.completed',
          { amount: d.releaseNow, holdback: d.holdback, currency: s.currency, ...returned },
          `settlement.completed:${s._id}`,
        ),
      );
    } else if (!s.gateId && !s.sessionId) {
      // A gate's failed verification is refunded at once (its refund ruling is recorded with the decision): never held.
      this.inFlight(
        this.emit(
          'settlement.held',
          { amount: s.amount, currency: s.currency, reason: d.reason },
          `settlement.held:${s._id}`,
        ),
      );
    }
    this.failpoint('decided');
  }

  /** 3. The holdback's fate: released when the window ends, unless a dispute claimed it first. */
  async holdbackFate(d: Decision): Promise<void> {
    const { runtime, s, facts } = this;
    const windowEnds = Date.parse(d.disputeWindowEndsAt);
    if (d.verdict === 'pass' && d.holdback > 0 && !facts.holdback) {
      if (Date.now() >= windowEnds)
        facts.holdback = (
          await runtime.stores.settlements.claim(s._id, 'holdback', { fate: 'release', at: new Date().toISOString() })
        ).fact;
      else this.inFlight(runtime.producers.schedule(...settleJob(s, 'holdback'), windowEnds - Date.now()));
    }
    if (facts.holdback?.fate !== 'release') return;
    await this.apply(entryIds.holdback(s._id), 'holdback_release', [{ walletId: s.payeeWalletId, amount: d.holdback }]);
    this.failpoint('holdback-released');
    await Promise.all(this.started);
    await this.emit(
      'settlement.holdback_released',
      { amount: d.holdback, currency: s.currency },
      `settlement.holdback_released:${s._id}`,
    );
  }

  /** 4. A dispute: announced once; a ruling splits the frozen holdback between payer and payee. */
  async dispute(dispute: Extract<NonNullable<SettlementFacts['holdback']>, { fate: 'dispute' }>): Promise<void> {
    const { s, facts } = this;
    await Promise.all(this.started);
    const { runtime, subject, marks } = this;
    await emitEvent(
      runtime,
      s.tenantId,
      'dispute.opened',
      { disputeId: dispute.disputeId, ...subject, settlementId: s._id },
      `dispute.opened:${dispute.disputeId}`,
      marks,
    );
    const ruling = facts.ruling;
    if (!ruling) return;
    if (ruling.toPayer > 0)
      await this.apply(entryIds.disputeToPayer(dispute.disputeId), 'dispute_refund', [
        { walletId: s.payerWalletId, amount: ruling.toPayer },
      ]);
    this.failpoint('dispute-payer-paid');
    if (ruling.toPayee > 0)
      await this.apply(entryIds.disputeToPayee(dispute.disputeId), 'dispute_release', [
        { walletId: s.payeeWalletId, amount: ruling.toPayee },
      ]);
    this.failpoint('dispute-payee-paid');
    const { outcome, toPayer, toPayee } = ruling;
    await emitEvent(
      runtime,
      s.tenantId,
      'dispute.resolved',
      {
        disputeId: dispute.disputeId,
        ...subject,
        settlementId: s._id,
        outcome,
        toPayer,
        toPayee,
        currency: s.currency,
      },
      `dispute.resolved:${dispute.disputeId}`,
      marks,
    );
  }

  /** 5. An ops ruling on a held settlement: the whole escrow to the payee, or back to the payer. */
  async heldRuling(ruling: NonNullable<SettlementFacts['heldRuling']>): Promise<void> {
    const { s, facts } = this;
    await Promise.all(this.started);
    const release = ruling.outcome === 'release';
    await this.apply(entryIds.held(s._id, ruling.outcome), release ? 'held_release' : 'held_refund', [
      { walletId: release ? s.payeeWalletId : s.payerWalletId, amount: s.amount },
    ]);
    this.failpoint('held-resolved');
    if (release) {
      await this.emit(
        'settlement.completed',
        { amount: s.amount, holdback: 0, currency: s.currency },
        `settlement.completed:${s._id}:held-release`,
      );
    } else {
      // An operator's refund ruling, or a gate's failed verification (refunded at once).
      await this.emit(
        'settlement.refunded',
        { amount: s.amount, currency: s.currency, reason: facts.decision?.reason ?? 'held_ruling' },
        `settlement.refunded:${s._id}`,
      );
    }
  }

  /**
   * The state this pass leaves, and the settlement's due record: moved to its next step, or removed once everything
   * the sweeper would redo has landed (the record is a hint and does not wait for the rest in flight).
   */
  async finish(): Promise<SettlementState> {
    const { runtime, s } = this;
    const state = settlementState(s, this.facts, this.applied);
    const next = nextCheck(state, runtime.config.sweeper.staleAfterMs);
    // A gate's or a session payee's settlement has a due record only once a pass left work for later: the pass that
    // won its decision (nothing before the decision marks one) has none to remove.
    const noRecord = this.known?.decidedNow === true && (s.gateId != null || s.sessionId != null);
    const started = Promise.all(this.started);
    await Promise.all([
      started,
      next
        ? runtime.stores.settlements.due.mark(s._id, s.tenantId, next, settlementOwner(s))
        : noRecord
          ? null
          : started.then(() => runtime.stores.settlements.due.done(s._id)),
    ]);
    return state;
  }
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
export async function sweepSettlements(
  runtime: Runtime,
  limit: number,
  partition?: number,
): Promise<{ looked: number; failed: number }> {
  const dueIndex = runtime.stores.settlements.due;
  const now = Date.now();
  const due: DueRecord[] = [];
  for await (const p of sweptPartitions(runtime, 'settlements', dueIndex, partition)) {
    due.push(...(await dueIndex.due(new Date(now), limit, p)));
  }
  const items = sweepItems(runtime, 'settlements');
  let failed = 0;
  for (const record of due) {
    const outcome = await items.run(record._id, () => advanceSettlement(runtime, record._id));
    if (!outcome.ok) {
      failed++;
      await dueIndex.mark(record._id, record.tenantId, outcome.retryAt, record.owner).catch(() => undefined);
      continue;
    }
    // A record is written just before its settlement: only one long without a settlement outlived a failed create.
    if (!outcome.value && record.dueAt.getTime() < now - runtime.config.sweeper.staleAfterMs)
      await dueIndex.done(record._id);
  }
  return { looked: due.length, failed };
}
