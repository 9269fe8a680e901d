// Payment session statements (SessionStatement.v1), checked offline: what `GET /x402/sessions/{id}/statement` answers
// is hashed, signed with the service key and commits to its charges and totals; anyone holding it and the JWKS can
// repeat every check. A session priced by use also lets the holder recompute every line's amount from its usage
// record and the schedule, and check the payee's and payer's signatures with the agent keys the statement names,
// without trusting the service for any of it.
import { verifyServiceSignature } from './artifact.ts';
import { canonicalize, type JsonValue } from './canonical-json.ts';
import { sha256Hex } from './crypto.ts';
import { parsePriceSchedule, pricingSha256, type PriceSchedule } from './pricing.ts';
import { priceUsageRecord, usageProblem, usageSignatureValid, type UsageRecord } from './usage.ts';

export const STATEMENT_CHECKS = ['statementHash', 'serviceSignature', 'charges', 'usage', 'totals'] as const;
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
    usage: [],
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
      reasons.usage.push(...usageReasons(body, charges));
      const amounts = charges.map((c) => c.amount);
      if (!amounts.every((a) => Number.isSafeInteger(a) && (a as number) >= 0))
        reasons.totals.push('a charge amount is not a whole number of minor units');
      // A session that pays acknowledged usage only pays nobody for a usage line without the payer's signature.
      const requireAck = body.requireAcknowledgedUsage === true;
      const pays = (c: Record<string, unknown>) => !(requireAck && record(c.usage) && c.usage.payerSignature === null);
      const sum = (lines: Array<Record<string, unknown>>) =>
        lines.reduce<number>((total, c) => total + (Number(c.amount) || 0), 0);
      const total = sum(charges.filter(pays));
      const unacknowledged = sum(charges.filter((c) => !pays(c)));
      if (body.totalCharged !== total)
        reasons.totals.push(`totalCharged ${String(body.totalCharged)} is not the paid charges' sum ${total}`);
      if ((body.unacknowledged ?? 0) !== unacknowledged)
        reasons.totals.push(
          `unacknowledged ${String(body.unacknowledged)} is not the unacknowledged usage's sum ${unacknowledged}`,
        );
      if (body.refunded !== Number(body.budget) - total)
        reasons.totals.push(`refunded ${String(body.refunded)} is not budget - total (${Number(body.budget) - total})`);
      for (const p of Array.isArray(body.payees) ? (body.payees as Array<Record<string, unknown>>) : []) {
        const share = sum(charges.filter((c) => c.payeeAgentId === p.payeeAgentId && pays(c)));
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

/**
 * The usage lines of a statement, each recomputed: its record names the line's session, payment, payee and request;
 * its metrics and counts are ones the schedule prices; the payee's signature (and the payer's, when present) verify
 * with a key the statement lists for that agent; its amount is the record's price. The schedule must hash to
 * pricingSha256. A statement without a schedule must carry no usage.
 */
function usageReasons(body: Record<string, unknown>, charges: Array<Record<string, unknown>>): string[] {
  const out: string[] = [];
  const metered = charges.filter((c) => c.usage !== undefined);
  if (body.pricing === undefined) {
    if (metered.length > 0) out.push('usage lines in a statement without a price schedule');
    return out;
  }
  let schedule: PriceSchedule;
  try {
    schedule = parsePriceSchedule(body.pricing);
  } catch (err) {
    return [`the statement's price schedule is invalid: ${(err as Error).message}`];
  }
  const hash = pricingSha256(schedule);
  if (body.pricingSha256 !== hash || sha256Hex(canonicalize(body.pricing as JsonValue)) !== hash)
    out.push(`pricingSha256 ${String(body.pricingSha256)} is not the schedule's hash ${hash}`);
  const keysOf = new Map<string, Map<string, string>>();
  for (const k of Array.isArray(body.agentKeys) ? (body.agentKeys as Array<Record<string, unknown>>) : []) {
    if (typeof k.agentId !== 'string' || typeof k.keyId !== 'string' || typeof k.publicKey !== 'string') {
      out.push('agentKeys lists a key that is not {agentId, keyId, publicKey}');
      continue;
    }
    if (!keysOf.has(k.agentId)) keysOf.set(k.agentId, new Map());
    keysOf.get(k.agentId)!.set(k.keyId, k.publicKey);
  }
  // A session that pays acknowledged usage only takes no plain amounts: each of its lines is usage.
  if (body.requireAcknowledgedUsage === true)
    for (const c of charges)
      if (c.usage === undefined) out.push(`line ${String(c.seq)}: no usage in a session that pays usage only`);
  const none = new Map<string, string>();
  for (const c of metered) {
    const at = `line ${String(c.seq)}`;
    const u = c.usage as Record<string, unknown> | null;
    if (typeof u !== 'object' || u === null) {
      out.push(`${at}: usage must be {record, payeeSignature, payerSignature}`);
      continue;
    }
    const problem = usageProblem(u.record, schedule);
    if (problem) {
      out.push(`${at}: ${problem.message}`);
      continue;
    }
    const rec = u.record as UsageRecord;
    for (const [field, expected] of [
      ['sessionId', body.sessionId],
      ['paymentId', c.paymentId],
      ['payeeAgentId', c.payeeAgentId],
      ['requestSha256', c.requestSha256],
    ] as const)
      if (rec[field] !== expected) out.push(`${at}: the record's ${field} is not the line's (${String(expected)})`);
    if (!usageSignatureValid(rec, u.payeeSignature, keysOf.get(String(c.payeeAgentId)) ?? none))
      out.push(
        `${at}: the payee's signature does not verify with a key the statement lists for ${String(c.payeeAgentId)}`,
      );
    if (
      u.payerSignature !== null &&
      !usageSignatureValid(rec, u.payerSignature, keysOf.get(String(body.payerAgentId)) ?? none)
    )
      out.push(
        `${at}: the payer's signature does not verify with a key the statement lists for ${String(body.payerAgentId)}`,
      );
    let priced: ReturnType<typeof priceUsageRecord>;
    try {
      priced = priceUsageRecord(schedule, rec);
    } catch (err) {
      out.push(`${at}: ${(err as Error).message}`);
      continue;
    }
    if (priced.aboveCap) out.push(`${at}: the usage prices at ${priced.amount}, above the schedule's cap`);
    if (c.amount !== priced.amount)
      out.push(`${at}: amount ${String(c.amount)} is not the usage's price ${priced.amount}`);
  }
  return out;
}
