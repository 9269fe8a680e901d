import type { KeyObject } from 'node:crypto';
import { canonicalize } from './canonical-json.ts';
import { sha256Hex, signHexDigest } from './crypto.ts';

/** The money every settlement receipt commits to, whatever was settled. */
interface ReceiptMoney {
  schema: 'SettlementReceipt.v1';
  settlementId: string;
  payerWalletId: string;
  payeeWalletId: string;
  amount: number;
  releasedNow: number;
  holdback: number;
  currency: string;
  verdict: 'pass' | 'fail';
  decidedAt: string;
}

/** What a decided settlement of a run commits to; hashed with canonical JSON and signed with the service key. */
export interface SettlementReceiptBody extends ReceiptMoney {
  runId: string;
  /** null when the run's data could never make an artifact (verdict fail, reason ARTIFACT_BUILD_FAILED). */
  artifactId: string | null;
  artifactHash: string | null;
}

/** The same receipt for an x402 gate: it commits to the gate, its authorization and the provider's evidence. */
export interface GateSettlementReceiptBody extends ReceiptMoney {
  gateId: string;
  /**
   * What the call was charged (releasedNow + holdback; 0 when nothing was paid); `amount` stays the authorized
   * maximum, and the rest went back to the payer. Absent on receipts signed before metered capture (then: amount).
   */
  captured?: number;
  authorizationRef: string | null;
  quoteId: string | null;
  requestSha256: string | null;
  /** null when nobody reported the call: the gate was returned (expired, or an agent wound down). */
  responseSha256: string | null;
  verificationStatus: 'verified' | 'failed' | 'expired' | 'wound_down';
}

/** The receipt of a payee's settlement at a payment session's close: it commits to the session's signed statement. */
export interface SessionSettlementReceiptBody extends ReceiptMoney {
  sessionId: string;
  statementHash: string;
}

type ReceiptBody = SettlementReceiptBody | GateSettlementReceiptBody | SessionSettlementReceiptBody;

export interface SignedReceipt {
  body: ReceiptBody;
  receiptHash: string;
  signature: { alg: 'Ed25519'; keyId: string; value: string };
}

export function signReceipt(body: ReceiptBody, signer: { keyId: string; privateKey: KeyObject }): SignedReceipt {
  const receiptHash = sha256Hex(canonicalize(body));
  return { body, receiptHash, signature: { alg: 'Ed25519', keyId: signer.keyId, value: signHexDigest(signer.privateKey, receiptHash) } };
}
