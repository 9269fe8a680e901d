// Payment sessions' pure parts: what a charge's receipt and a session's statement commit to, how they are signed
// (canonical JSON, sha256, Ed25519 over the hex digest: the same rules and keys as settlement receipts), and the
// statement's totals with the invariants they must hold.
import type { KeyObject } from 'node:crypto';
import { canonicalize } from './canonical-json.ts';
import { sha256Hex, signHexDigest } from './crypto.ts';
import { assertMoney } from './money.ts';

export const MAX_SESSION_PAYEES = 20;
export const MAX_SESSION_TTL_SECONDS = 30 * 86_400;
export const DEFAULT_SESSION_TTL_SECONDS = 3_600;

export type SessionStatus = 'open' | 'closing' | 'closed' | 'expired' | 'wound_down' | 'unfunded';

interface Signature {
  alg: 'Ed25519';
  keyId: string;
  value: string;
}

/** What one paid call's receipt commits to: who paid whom how much, for which request, in which session. */
export interface ChargeReceiptBody {
  schema: 'SessionChargeReceipt.v1';
  sessionId: string;
  chargeId: string;
  seq: number;
  paymentId: string;
  payerAgentId: string;
  walletId: string;
  payeeAgentId: string;
  amount: number;
  currency: string;
  requestSha256: string | null;
  chargedAt: string;
}

export interface SignedChargeReceipt {
  body: ChargeReceiptBody;
  receiptHash: string;
  signature: Signature;
}

/** One line of a statement: a charge as the session recorded it. */
export interface StatementCharge {
  seq: number;
  payeeAgentId: string;
  amount: number;
  paymentId: string;
  requestSha256: string | null;
  chargedAt: string;
  receiptHash: string;
}

/**
 * What a closed session's statement commits to. The charges themselves are listed beside it (they can be many):
 * `chargesSha256` is the sha256 of their canonical JSON array, so the list is as signed as the totals.
 */
export interface SessionStatementBody {
  schema: 'SessionStatement.v1';
  sessionId: string;
  payerAgentId: string;
  walletId: string;
  currency: string;
  budget: number;
  maxPerCall: number;
  holdbackBps: number;
  openedAt: string;
  expiresAt: string;
  reason: 'closed' | 'expired' | 'wound_down';
  closedAt: string;
  /** Debits numbered but never charged (a call that crashed before it was recorded, or lost to the close). */
  voided: number;
  chargeCount: number;
  chargesSha256: string;
  totalCharged: number;
  refunded: number;
  /** Per payee (in the session's order) what it was charged, and the settlement that pays it (null: nothing). */
  payees: Array<{ payeeAgentId: string; charged: number; settlementId: string | null }>;
}

export interface SignedStatement {
  body: SessionStatementBody;
  statementHash: string;
  signature: Signature;
}

function sign<T>(body: T, signer: { keyId: string; privateKey: KeyObject }): { hash: string; signature: Signature } {
  const hash = sha256Hex(canonicalize(body));
  return { hash, signature: { alg: 'Ed25519', keyId: signer.keyId, value: signHexDigest(signer.privateKey, hash) } };
}

export function signChargeReceipt(
  body: ChargeReceiptBody,
  signer: { keyId: string; privateKey: KeyObject },
): SignedChargeReceipt {
  const { hash, signature } = sign(body, signer);
  return { body, receiptHash: hash, signature };
}

export function chargesSha256(charges: StatementCharge[]): string {
  return sha256Hex(canonicalize(charges));
}

/**
 * The statement's money from its charges: every charge within the per-call maximum, the total within the budget,
 * refund = budget - total, and each payee's share adding up to the total (a MoneyInvariantError otherwise, before
 * anything moves).
 */
/** The last seq a closed session decided (charged or void): its statement covers seqs 1..this. */
export function statementLastSeq(body: { chargeCount: number; voided: number }): number {
  return body.chargeCount + body.voided;
}

export function statementTotals(
  session: { _id: string; budget: number; maxPerCall: number; payeeAgentIds: string[] },
  charges: StatementCharge[],
): { totalCharged: number; refunded: number; perPayee: Map<string, number> } {
  const perPayee = new Map(session.payeeAgentIds.map((p) => [p, 0]));
  let total = 0;
  for (const c of charges) {
    // Zero is a metered call that cost nothing: listed, paid nothing.
    assertMoney(
      Number.isSafeInteger(c.amount) && c.amount >= 0 && c.amount <= session.maxPerCall,
      `session ${session._id}: charge ${c.seq} of ${c.amount} breaks the per-call maximum`,
    );
    assertMoney(
      perPayee.has(c.payeeAgentId),
      `session ${session._id}: charge ${c.seq} pays ${c.payeeAgentId}, not one of its payees`,
    );
    perPayee.set(c.payeeAgentId, perPayee.get(c.payeeAgentId)! + c.amount);
    total += c.amount;
  }
  assertMoney(
    total <= session.budget,
    `session ${session._id}: charges of ${total} exceed its budget of ${session.budget}`,
  );
  return { totalCharged: total, refunded: session.budget - total, perPayee };
}

export function signStatement(
  body: SessionStatementBody,
  signer: { keyId: string; privateKey: KeyObject },
): SignedStatement {
  const { hash, signature } = sign(body, signer);
  return { body, statementHash: hash, signature };
}

// The statement's offline check is the client package's (the CLI and any holder of a statement run it).
export {
  STATEMENT_CHECKS,
  verifyStatement,
  type StatementCheck,
  type StatementVerification,
} from 'agent-settlement-client/statement';
