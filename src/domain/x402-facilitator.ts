// The x402 v2 facilitator API's shapes as this service answers them (verify, settle, the status lookup), shared by
// the facilitators of both schemes (services/x402-facilitator.ts, services/x402-session-facilitator.ts).
import { paymentStatusWord, settleAnswerWord, type PaymentStatus, type SettlementWord } from './x402.ts';

/** x402 v2 PaymentRequirements, as the facilitator API carries them. */
export interface FacilitatorRequirements {
  scheme: string;
  network: string;
  asset: string;
  amount: string;
  payTo: string;
  maxTimeoutSeconds: number;
  extra: Record<string, unknown>;
}

export interface FacilitatorRequest {
  x402Version: number;
  paymentPayload: {
    x402Version: number;
    resource?: { url: string };
    accepted: FacilitatorRequirements;
    payload: Record<string, unknown>;
  };
  paymentRequirements: FacilitatorRequirements;
}

export interface VerifyAnswer {
  isValid: boolean;
  invalidReason?: string;
  invalidMessage?: string;
  payer?: string;
}

export interface SettleAnswer {
  success: boolean;
  /** The same answer in x402's settlement words (settleAnswerWord): unresolved is never final. */
  status: SettlementWord;
  errorReason?: string;
  errorMessage?: string;
  payer?: string;
  transaction: string;
  network: string;
  /** Settled only: what was charged, in minor units. */
  amount?: string;
  /** Settled only: when (a gate's: its settlement's decision; a session payment's: its charge). */
  settledAt?: string;
  extra?: Record<string, unknown>;
}

/** A settle answer that did not pay, in the protocol's terms and in its words. */
export function unpaidAnswer(
  network: string,
  reason: string,
  message: string,
  rest: { payer?: string; transaction?: string } = {},
): SettleAnswer {
  return {
    success: false,
    status: settleAnswerWord(false, reason),
    errorReason: reason,
    errorMessage: message,
    ...(rest.payer ? { payer: rest.payer } : {}),
    transaction: rest.transaction ?? '',
    network,
  };
}

export type { PaymentStatus };

export interface PaymentStatusAnswer {
  paymentId: string;
  status: PaymentStatus;
  /** The status in x402's settlement words (paymentStatusWord); unresolved is never final. */
  settlementStatus: SettlementWord;
  /** Settled only: when, and what was charged (as in `settlement`). */
  settledAt: string | null;
  settledAmount: string | null;
  /** authorized: until when settle may still report the call (after it, settling is refused and the payer refunded). */
  settleBy: string | null;
  /** settled or refused: the answer settle gave or would give now (any repeat of settle answers the same). */
  settlement: SettleAnswer | null;
}

/** A status answer with its words, the settlement time and amount read from the settle answer. */
export function paymentStatusAnswer(
  paymentId: string,
  status: PaymentStatus,
  settleBy: string | null,
  settlement: SettleAnswer | null,
): PaymentStatusAnswer {
  const settled = status === 'settled' && settlement?.success ? settlement : null;
  return {
    paymentId,
    status,
    settlementStatus: paymentStatusWord(status),
    settledAt: settled?.settledAt ?? null,
    settledAmount: settled?.amount ?? null,
    settleBy,
    settlement,
  };
}
