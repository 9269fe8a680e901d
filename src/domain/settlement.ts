// A settlement is its fixed terms plus immutable facts, each recorded once by a unique insert (first writer wins).
// Everything a client sees (status, amounts, where the holdback is) is derived from those facts and from which
// ledger entries have been applied: nothing relies on an update of a shared document being atomic.
import { assertMoney, holdbackOf } from './money.ts';
import type { SignedReceipt } from './receipt.ts';
import type { Verdict } from './terms.ts';

export interface SettlementTerms {
  settlementId: string;
  runId: string;
  payerWalletId: string;
  payeeWalletId: string;
  amount: number;
  currency: string;
  holdbackBps: number;
  disputeWindowSeconds: number;
}

export interface DecisionFact {
  verdict: Verdict;
  /** The escrow reserve (lock entry id) the settlement captured before deciding; absent on a gate's decision. */
  reserveId?: string;
  reason: string | null;
  releaseNow: number;
  holdback: number;
  /**
   * What a pass charged (a metered x402 call may charge less than its authorized amount); the rest goes back to the
   * payer at once. Absent on a fail and on decisions made before metering: a pass then captured the whole amount.
   */
  captured?: number;
  decidedAt: string;
  disputeWindowEndsAt: string;
  receipt: SignedReceipt;
}

/** Who got the holdback's fate first: its release at the window's end, or a dispute inside the window. */
export type HoldbackFact =
  | { fate: 'release'; at: string }
  | {
      fate: 'dispute';
      disputeId: string;
      reason: string;
      evidenceJson: string | null;
      frozenAmount: number;
      at: string;
    };

export interface RulingFact {
  outcome: 'payee' | 'payer' | 'split';
  payerShareBps: number | null;
  toPayer: number;
  toPayee: number;
  at: string;
}

export interface HeldRulingFact {
  outcome: 'release' | 'refund';
  at: string;
}

export interface SettlementFacts {
  decision?: DecisionFact;
  holdback?: HoldbackFact;
  ruling?: RulingFact;
  heldRuling?: HeldRulingFact;
}

export type SettlementStatus = 'pending' | 'completed' | 'held' | 'refunded' | 'disputed' | 'partially_refunded';
export type HoldbackState = 'none' | 'held' | 'releasing' | 'released' | 'frozen' | 'resolving' | 'refunded' | 'split';

export interface SettlementView {
  status: SettlementStatus;
  holdbackState: HoldbackState;
  holdback: number;
  releasedAmount: number;
  refundedAmount: number;
  disputeWindowEndsAt: string | null;
  /** No step can happen any more without an outside action, and none will ever happen again. */
  final: boolean;
}

/** What the decision's receipt states about the money; the signer adds what names the settled subject. */
export interface DecidedMoney {
  verdict: Verdict;
  /** What was charged: 0 on a fail. */
  captured: number;
  releasedNow: number;
  holdback: number;
  decidedAt: string;
}

/** What a decision charged: its captured amount, the whole amount on a pass that predates metering, 0 on a fail. */
export function capturedOf(amount: number, d: Pick<DecisionFact, 'verdict' | 'captured'>): number {
  return d.verdict === 'pass' ? (d.captured ?? amount) : 0;
}

/** A capture is a whole number from 0 to the amount, and only a pass captures; answers what was captured. */
function assertCapture(settlementId: string, amount: number, d: Pick<DecisionFact, 'verdict' | 'captured'>): number {
  const captured = capturedOf(amount, d);
  assertMoney(
    (d.captured === undefined || (d.verdict === 'pass' && Number.isSafeInteger(d.captured))) &&
      captured >= 0 &&
      captured <= amount,
    `settlement ${settlementId}: a ${d.verdict} cannot capture ${String(d.captured)} of ${amount}`,
  );
  return captured;
}

/**
 * What every decision must hold, fresh or read back: a pass splits what it captured (at most the amount) into release
 * now and holdback, a fail captures and releases nothing (a MoneyInvariantError otherwise, before any money moves).
 */
export function assertDecisionSplit(
  settlementId: string,
  amount: number,
  d: Pick<DecisionFact, 'verdict' | 'releaseNow' | 'holdback' | 'captured'>,
): void {
  const captured = assertCapture(settlementId, amount, d);
  assertMoney(
    d.releaseNow >= 0 && d.holdback >= 0 && d.releaseNow + d.holdback === captured,
    `settlement ${settlementId}: release ${d.releaseNow} + holdback ${d.holdback} does not make the ${d.verdict} capture of ${captured} (of ${amount})`,
  );
}

/**
 * The one settlement decision, for runs and x402 gates alike: a pass releases what it captured (the whole amount
 * unless `captured` says less: a metered gate) less its holdback now, keeps the holdback for the dispute window, and
 * returns the uncaptured rest to the payer; a fail releases nothing (the escrow stays for a ruling, or a gate's
 * refund). `sign` makes the subject's signed receipt from the decided money.
 */
export function decideSettlement(
  terms: { settlementId: string; amount: number; holdbackBps: number; disputeWindowSeconds: number; captured?: number },
  verdict: Verdict,
  reason: string | null,
  decidedAt: Date,
  sign: (money: DecidedMoney) => SignedReceipt,
  reserveId?: string,
): DecisionFact {
  const metered = verdict === 'pass' && terms.captured !== undefined ? { captured: terms.captured } : {};
  const captured = assertCapture(terms.settlementId, terms.amount, { verdict, ...metered });
  const { holdback, releaseNow } =
    verdict === 'pass' ? holdbackOf(captured, terms.holdbackBps) : { holdback: 0, releaseNow: 0 };
  assertDecisionSplit(terms.settlementId, terms.amount, { verdict, releaseNow, holdback, ...metered });
  const at = decidedAt.toISOString();
  return {
    verdict,
    ...(reserveId ? { reserveId } : {}),
    reason: verdict === 'pass' ? null : reason,
    releaseNow,
    holdback,
    ...metered,
    decidedAt: at,
    disputeWindowEndsAt: new Date(decidedAt.getTime() + terms.disputeWindowSeconds * 1000).toISOString(),
    receipt: sign({ verdict, captured, releasedNow: releaseNow, holdback, decidedAt: at }),
  };
}

/**
 * The credits of a pass's release entry, in leg order (its one debit, of their sum, is the payer's escrow): the payee
 * gets what is released now, the payer the uncaptured rest of its reserve. The worker that reads the accounts' heads
 * ahead of the decision and the settlement pass that posts the entry both build them here.
 */
export function releaseCredits(
  s: { amount: number; payerWalletId: string; payeeWalletId: string },
  d: Pick<DecisionFact, 'verdict' | 'releaseNow' | 'captured'>,
): Array<{ walletId: string; amount: number }> {
  const uncaptured = d.verdict === 'pass' ? s.amount - capturedOf(s.amount, d) : 0;
  return [
    ...(d.releaseNow > 0 ? [{ walletId: s.payeeWalletId, amount: d.releaseNow }] : []),
    ...(uncaptured > 0 ? [{ walletId: s.payerWalletId, amount: uncaptured }] : []),
  ];
}

/** The ledger entry each money step uses; deterministic, so a step applied twice is one entry. */
export const entryIds = {
  release: (settlementId: string) => `settle:${settlementId}:release`,
  holdback: (settlementId: string) => `settle:${settlementId}:holdback`,
  disputeToPayer: (disputeId: string) => `dispute:${disputeId}:payer`,
  disputeToPayee: (disputeId: string) => `dispute:${disputeId}:payee`,
  held: (settlementId: string, outcome: 'release' | 'refund') => `settle:${settlementId}:held-${outcome}`,
};

export function deriveSettlement(
  terms: SettlementTerms,
  facts: SettlementFacts,
  applied: ReadonlySet<string>,
  now: Date,
): SettlementView {
  const d = facts.decision;
  if (!d) {
    return {
      status: 'pending',
      holdbackState: 'none',
      holdback: 0,
      releasedAmount: 0,
      refundedAmount: 0,
      disputeWindowEndsAt: null,
      final: false,
    };
  }
  const windowEnds = d.disputeWindowEndsAt;
  if (d.verdict === 'fail') {
    const ruling = facts.heldRuling;
    const done = ruling ? applied.has(entryIds.held(terms.settlementId, ruling.outcome)) : false;
    if (!ruling || !done) {
      return {
        status: 'held',
        holdbackState: 'none',
        holdback: 0,
        releasedAmount: 0,
        refundedAmount: 0,
        disputeWindowEndsAt: null,
        final: false,
      };
    }
    return ruling.outcome === 'release'
      ? {
          status: 'completed',
          holdbackState: 'none',
          holdback: 0,
          releasedAmount: terms.amount,
          refundedAmount: 0,
          disputeWindowEndsAt: null,
          final: true,
        }
      : {
          status: 'refunded',
          holdbackState: 'none',
          holdback: 0,
          releasedAmount: 0,
          refundedAmount: terms.amount,
          disputeWindowEndsAt: null,
          final: true,
        };
  }

  const base = { holdback: d.holdback, disputeWindowEndsAt: windowEnds };
  // A metered pass returns what it did not capture by the release entry itself (a leg of its own): refunded from then on.
  const captured = capturedOf(terms.amount, d);
  const uncaptured = terms.amount - captured;
  // Decided, but the money has not moved yet: still pending to the outside.
  if (d.releaseNow + uncaptured > 0 && !applied.has(entryIds.release(terms.settlementId))) {
    return { ...base, status: 'pending', holdbackState: 'none', releasedAmount: 0, refundedAmount: 0, final: false };
  }
  // Nothing charged: the whole amount went back, and there is nothing to dispute.
  if (captured === 0) {
    return {
      ...base,
      status: 'refunded',
      holdbackState: 'none',
      releasedAmount: 0,
      refundedAmount: uncaptured,
      final: true,
    };
  }
  const releasedNow = d.releaseNow;
  const hb = facts.holdback;
  if (hb?.fate === 'dispute') {
    const ruling = facts.ruling;
    if (!ruling) {
      return {
        ...base,
        status: 'disputed',
        holdbackState: hb.frozenAmount > 0 ? 'frozen' : 'none',
        releasedAmount: releasedNow,
        refundedAmount: uncaptured,
        final: false,
      };
    }
    const payerDone = ruling.toPayer === 0 || applied.has(entryIds.disputeToPayer(hb.disputeId));
    const payeeDone = ruling.toPayee === 0 || applied.has(entryIds.disputeToPayee(hb.disputeId));
    if (!payerDone || !payeeDone) {
      return {
        ...base,
        status: 'disputed',
        holdbackState: 'resolving',
        releasedAmount: releasedNow,
        refundedAmount: uncaptured,
        final: false,
      };
    }
    const status =
      ruling.outcome === 'payee' ? 'completed' : ruling.outcome === 'payer' ? 'refunded' : 'partially_refunded';
    const holdbackState = ruling.outcome === 'payee' ? 'released' : ruling.outcome === 'payer' ? 'refunded' : 'split';
    return {
      ...base,
      status,
      holdbackState: hb.frozenAmount > 0 ? holdbackState : 'none',
      releasedAmount: releasedNow + ruling.toPayee,
      refundedAmount: uncaptured + ruling.toPayer,
      final: true,
    };
  }
  if (d.holdback === 0) {
    const windowOver = now.getTime() >= Date.parse(windowEnds);
    return {
      ...base,
      status: 'completed',
      holdbackState: 'none',
      releasedAmount: releasedNow,
      refundedAmount: uncaptured,
      final: windowOver,
    };
  }
  if (hb?.fate === 'release') {
    const done = applied.has(entryIds.holdback(terms.settlementId));
    return {
      ...base,
      status: 'completed',
      holdbackState: done ? 'released' : 'releasing',
      releasedAmount: releasedNow + (done ? d.holdback : 0),
      refundedAmount: uncaptured,
      final: done,
    };
  }
  return {
    ...base,
    status: 'completed',
    holdbackState: 'held',
    releasedAmount: releasedNow,
    refundedAmount: uncaptured,
    final: false,
  };
}
