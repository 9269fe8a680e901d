import type { KeyObject } from 'node:crypto';
import { verifyServiceSignature } from './artifact.ts';
import { canonicalize } from './canonical-json.ts';
import { isSha256Hex, sha256Hex, signHexDigest } from './crypto.ts';
import type { Usage } from './pricing.ts';

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
  /**
   * A run priced by use only (absent otherwise): the schedule's hash, the usage and priced amount its artifact
   * records, and what was charged: min(pricedAmount, amount) on a pass, 0 on a fail; `amount` stays the escrow.
   */
  pricingSha256?: string;
  usage?: Usage;
  pricedAmount?: number;
  captured?: number;
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

/**
 * The part of every settlement receipt that says what money moved: the one builder of it for runs, gates and session
 * payees, so the three receipts cannot drift apart. The rest of each body names what was settled.
 */
export function receiptMoney(
  settlement: { settlementId: string; payerWalletId: string; payeeWalletId: string; amount: number; currency: string },
  money: { releasedNow: number; holdback: number; verdict: 'pass' | 'fail'; decidedAt: string },
): ReceiptMoney {
  const { settlementId, payerWalletId, payeeWalletId, amount, currency } = settlement;
  const { releasedNow, holdback, verdict, decidedAt } = money;
  return {
    schema: 'SettlementReceipt.v1',
    settlementId,
    payerWalletId,
    payeeWalletId,
    amount,
    releasedNow,
    holdback,
    currency,
    verdict,
    decidedAt,
  };
}

export interface SignedReceipt {
  body: ReceiptBody;
  receiptHash: string;
  signature: { alg: 'Ed25519'; keyId: string; value: string };
}

export function signReceipt(body: ReceiptBody, signer: { keyId: string; privateKey: KeyObject }): SignedReceipt {
  const receiptHash = sha256Hex(canonicalize(body));
  return {
    body,
    receiptHash,
    signature: { alg: 'Ed25519', keyId: signer.keyId, value: signHexDigest(signer.privateKey, receiptHash) },
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Verification (pure): anyone repeats it offline from the receipt and the service's JWKS.

export type ReceiptCheck = 'receiptHash' | 'serviceSignature' | 'artifact';

export interface ReceiptVerification {
  verified: boolean;
  /** `artifact` holds when no artifact was given to compare with. */
  checks: Record<ReceiptCheck, boolean>;
  /** Every failure as "<check>: <reason>". */
  failures: string[];
}

/**
 * Checks a settlement receipt (`{body, receiptHash, signature}`, as GET /runs/{runId}/settlement carries it):
 * receiptHash = sha256hex(JCS(body)), the service signature over it with the JWKS key it names, and, given the run's
 * artifact, that the receipt commits to that artifact (same run, same artifactHash). Never throws.
 */
export function verifyReceipt(
  receipt: unknown,
  jwks: unknown,
  options: { artifact?: { runId?: unknown; artifactHash?: unknown; pricing?: unknown } } = {},
): ReceiptVerification {
  const found: Record<ReceiptCheck, string[]> = { receiptHash: [], serviceSignature: [], artifact: [] };
  const r = receipt as Partial<SignedReceipt> | null;
  if (typeof r !== 'object' || r === null || typeof r.body !== 'object' || r.body === null) {
    const msg = ['receipt must be {body, receiptHash, signature}'];
    found.receiptHash = msg;
    found.serviceSignature = msg;
    found.artifact = options.artifact ? msg : [];
  } else {
    let recomputed: string | null = null;
    try {
      recomputed = sha256Hex(canonicalize(r.body));
    } catch (err) {
      found.receiptHash.push(`body is not canonical JSON: ${(err as Error).message}`);
    }
    if (recomputed !== null && recomputed !== r.receiptHash) {
      found.receiptHash.push(`recomputed hash ${recomputed} does not match receiptHash ${String(r.receiptHash)}`);
    }
    found.serviceSignature = isSha256Hex(r.receiptHash)
      ? verifyServiceSignature(r.signature, r.receiptHash, jwks)
      : ['receiptHash is not 64 lowercase hex digits'];
    const artifact = options.artifact;
    if (artifact) {
      const body = r.body as Partial<SettlementReceiptBody>;
      if (body.runId !== artifact.runId)
        found.artifact.push(`receipt is for run ${String(body.runId)}, the artifact for ${String(artifact.runId)}`);
      if (body.artifactHash !== artifact.artifactHash)
        found.artifact.push(
          `receipt commits to artifactHash ${String(body.artifactHash)}, not ${String(artifact.artifactHash)}`,
        );
      found.artifact.push(...pricedReceiptProblems(body, artifact.pricing));
    }
  }
  const checks = {
    receiptHash: found.receiptHash.length === 0,
    serviceSignature: found.serviceSignature.length === 0,
    artifact: found.artifact.length === 0,
  };
  const failures = (Object.keys(found) as ReceiptCheck[]).flatMap((c) => found[c].map((m) => `${c}: ${m}`));
  return { verified: failures.length === 0, checks, failures };
}

/**
 * A priced run's receipt against its artifact's priced usage (which verifyArtifact recomputes from the events): the
 * same schedule hash, usage and priced amount, and the charge the settlement rule gives: min(pricedAmount, amount)
 * on a pass, 0 on a fail, split into releasedNow + holdback. A receipt of an unpriced run must carry none of it.
 */
function pricedReceiptProblems(body: Partial<SettlementReceiptBody>, pricing: unknown): string[] {
  const p = typeof pricing === 'object' && pricing !== null ? (pricing as Record<string, unknown>) : null;
  if (!p) {
    const stray = (['pricingSha256', 'usage', 'pricedAmount', 'captured'] as const).filter(
      (k) => body[k] !== undefined,
    );
    return stray.length > 0 ? [`the artifact is not priced, yet the receipt states ${stray.join(', ')}`] : [];
  }
  const out: string[] = [];
  if (body.pricingSha256 !== p.pricingSha256)
    out.push(`receipt names pricing ${String(body.pricingSha256)}, the artifact ${String(p.pricingSha256)}`);
  if (body.usage === undefined || canonicalize(body.usage) !== canonicalize(p.usage))
    out.push(`receipt usage ${JSON.stringify(body.usage)} is not the artifact's ${JSON.stringify(p.usage)}`);
  if (body.pricedAmount !== p.amount)
    out.push(`receipt pricedAmount ${String(body.pricedAmount)} is not the artifact's ${String(p.amount)}`);
  const priced = typeof p.amount === 'number' ? p.amount : NaN;
  const expected = body.verdict === 'pass' && typeof body.amount === 'number' ? Math.min(priced, body.amount) : 0;
  if (body.captured !== expected)
    out.push(`receipt captured ${String(body.captured)}, the priced usage charges ${expected}`);
  if (
    body.releasedNow !== undefined &&
    body.holdback !== undefined &&
    body.releasedNow + body.holdback !== body.captured
  )
    out.push(
      `releasedNow ${body.releasedNow} + holdback ${body.holdback} is not the captured ${String(body.captured)}`,
    );
  return out;
}
