// Payment session statements (SessionStatement.v1), checked offline: what `GET /x402/sessions/{id}/statement` answers
// is hashed, signed with the service key and commits to its charges and totals; anyone holding it and the JWKS can
// repeat every check.
import { verifyServiceSignature } from './artifact.ts';
import { canonicalize } from './canonical-json.ts';
import { sha256Hex } from './crypto.ts';

export const STATEMENT_CHECKS = ['statementHash', 'serviceSignature', 'charges', 'totals'] as const;
export type StatementCheck = (typeof STATEMENT_CHECKS)[number];

export interface StatementVerification {
  verified: boolean;
  checks: Record<StatementCheck, boolean>;
  reasons: Record<StatementCheck, string[]>;
}

/**
 * Repeats every check of a session statement as `GET /x402/sessions/{id}/statement` answers it, offline: its hash,
 * the service's signature (against the JWKS), that the listed charges are the ones it commits to, and that its totals
 * add up (total = the charges' sum, refund = budget - total, each payee's share = its charges' sum).
 */
export function verifyStatement(doc: unknown, jwks: unknown): StatementVerification {
  const record = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
  const reasons: Record<StatementCheck, string[]> = {
    statementHash: [],
    serviceSignature: [],
    charges: [],
    totals: [],
  };
  const body = record(doc) ? doc.body : undefined;
  if (!record(doc) || !record(body) || body.schema !== 'SessionStatement.v1') {
    for (const c of STATEMENT_CHECKS)
      reasons[c].push('not a SessionStatement.v1 document ({statementHash, signature, body, charges})');
  } else {
    const hash = sha256Hex(canonicalize(body));
    if (doc.statementHash !== hash) reasons.statementHash.push(`statementHash is not sha256hex(JCS(body)) (${hash})`);
    reasons.serviceSignature.push(...verifyServiceSignature(doc.signature, hash, jwks));
    const charges = Array.isArray(doc.charges) ? (doc.charges as Array<Record<string, unknown>>) : null;
    if (!charges) reasons.charges.push('charges is missing');
    else if (body.chargesSha256 !== sha256Hex(canonicalize(charges)))
      reasons.charges.push('the listed charges are not the ones chargesSha256 commits to');
    else if (body.chargeCount !== charges.length)
      reasons.charges.push(`chargeCount ${String(body.chargeCount)} but ${charges.length} charges listed`);
    if (charges) {
      const amounts = charges.map((c) => c.amount);
      if (!amounts.every((a) => Number.isSafeInteger(a) && (a as number) >= 0))
        reasons.totals.push('a charge amount is not a whole number of minor units');
      const total = amounts.reduce<number>((sum, a) => sum + (Number(a) || 0), 0);
      if (body.totalCharged !== total)
        reasons.totals.push(`totalCharged ${String(body.totalCharged)} is not the charges' sum ${total}`);
      if (body.refunded !== Number(body.budget) - total)
        reasons.totals.push(`refunded ${String(body.refunded)} is not budget - total (${Number(body.budget) - total})`);
      for (const p of Array.isArray(body.payees) ? (body.payees as Array<Record<string, unknown>>) : []) {
        const share = charges
          .filter((c) => c.payeeAgentId === p.payeeAgentId)
          .reduce<number>((sum, c) => sum + (Number(c.amount) || 0), 0);
        if (p.charged !== share)
          reasons.totals.push(
            `payee ${String(p.payeeAgentId)} charged ${String(p.charged)}, its charges sum to ${share}`,
          );
      }
    }
  }
  const checks = Object.fromEntries(STATEMENT_CHECKS.map((c) => [c, reasons[c].length === 0])) as Record<
    StatementCheck,
    boolean
  >;
  return { verified: STATEMENT_CHECKS.every((c) => checks[c]), checks, reasons };
}
