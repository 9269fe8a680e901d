// Witnessed usage (UsageRecord.v1): what a metered call used, signed by the payee agent that served it and, once it
// has read the response, by the payer agent. The service prices a session charge from it, and the offline statement
// verifier repeats every step here: the same digest, the same signature rule as run events (Ed25519 over the bytes
// of sha256hex(JCS(record))) and the same integer pricing.
import type { KeyObject } from 'node:crypto';
import { canonicalize } from './canonical-json.ts';
import { isSha256Hex, publicKeyFromRaw, sha256Hex, signHexDigest, verifyHexDigest } from './crypto.ts';
import { priceUsage, type PriceSchedule } from './pricing.ts';

export const USAGE_RECORD_SCHEMA = 'UsageRecord.v1';

/** One metered call's usage, as its payee states it: which session and payment, which request and response. */
export interface UsageRecord {
  schema: typeof USAGE_RECORD_SCHEMA;
  sessionId: string;
  paymentId: string;
  payeeAgentId: string;
  /** Metric name -> units used (non-negative safe integers), each a metric the session's schedule prices. */
  usage: Record<string, number>;
  requestSha256: string;
  responseSha256: string;
}

export interface UsageSignature {
  alg: 'Ed25519';
  keyId: string;
  /** base64url Ed25519 signature over the bytes of usageDigest(record). */
  value: string;
}

/** A record with its payee's signature and, when the payer acknowledged it, the payer's. */
export interface WitnessedUsage {
  record: UsageRecord;
  payeeSignature: UsageSignature;
  payerSignature: UsageSignature | null;
}

/** Why a usage record cannot be priced: a metric the schedule does not price, or a count that is not a count. */
export type UsageProblemKind = 'metric' | 'count' | 'shape';

export interface UsageProblem {
  kind: UsageProblemKind;
  message: string;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const RECORD_FIELDS = [
  'schema',
  'sessionId',
  'paymentId',
  'payeeAgentId',
  'usage',
  'requestSha256',
  'responseSha256',
] as const;

/** The first thing that keeps `record` from being a UsageRecord.v1 priced by `schedule` (null: none). */
export function usageProblem(record: unknown, schedule: PriceSchedule): UsageProblem | null {
  if (!isRecord(record)) return { kind: 'shape', message: 'the usage record must be an object' };
  const extra = Object.keys(record).filter((k) => !(RECORD_FIELDS as readonly string[]).includes(k));
  if (extra.length > 0) return { kind: 'shape', message: `unknown fields in the usage record: ${extra.join(', ')}` };
  if (record.schema !== USAGE_RECORD_SCHEMA) return { kind: 'shape', message: `schema must be ${USAGE_RECORD_SCHEMA}` };
  for (const f of ['sessionId', 'paymentId', 'payeeAgentId'] as const)
    if (typeof record[f] !== 'string') return { kind: 'shape', message: `${f} must be a string` };
  for (const f of ['requestSha256', 'responseSha256'] as const)
    if (!isSha256Hex(record[f])) return { kind: 'shape', message: `${f} must be 64 lowercase hex digits` };
  if (!isRecord(record.usage) || Object.keys(record.usage).length === 0)
    return { kind: 'shape', message: 'usage must name at least one metric' };
  for (const [name, units] of Object.entries(record.usage)) {
    if (!Object.hasOwn(schedule.prices, name))
      return { kind: 'metric', message: `the session's schedule does not price the metric ${name}` };
    if (typeof units !== 'number' || !Number.isSafeInteger(units) || units < 0)
      return { kind: 'count', message: `usage of ${name} must be a non-negative safe integer, not ${String(units)}` };
  }
  return null;
}

/** sha256hex(JCS(record)): what both parties sign. */
export function usageDigest(record: UsageRecord): string {
  return sha256Hex(canonicalize(record as unknown as Parameters<typeof canonicalize>[0]));
}

/** The signature of an agent key over a usage record (the payee's when it serves, the payer's when it acknowledges). */
export function signUsageRecord(record: UsageRecord, key: { keyId: string; privateKey: KeyObject }): UsageSignature {
  return { alg: 'Ed25519', keyId: key.keyId, value: signHexDigest(key.privateKey, usageDigest(record)) };
}

/**
 * Whether `signature` is a valid Ed25519 signature over the record by one of `keys` (keyId -> public key: a
 * KeyObject, or base64url of the raw 32 bytes as the API and statements list them). A key not listed is false.
 */
export function usageSignatureValid(
  record: UsageRecord,
  signature: unknown,
  keys: ReadonlyMap<string, KeyObject | string>,
): boolean {
  if (!isRecord(signature) || signature.alg !== 'Ed25519') return false;
  if (typeof signature.keyId !== 'string' || typeof signature.value !== 'string') return false;
  const key = keys.get(signature.keyId);
  if (key === undefined) return false;
  let publicKey: KeyObject;
  try {
    publicKey = typeof key === 'string' ? publicKeyFromRaw(Buffer.from(key, 'base64url')) : key;
  } catch {
    return false;
  }
  return verifyHexDigest(publicKey, usageDigest(record), signature.value);
}

/**
 * What a witnessed call costs: the schedule's price of its usage, raised to the schedule's minimum. `aboveCap` is
 * true when the usage prices above the schedule's cap: a session refuses such a record rather than clamp it, so that a
 * line's amount is always exactly its usage's price (see docs/x402.md, "Witnessed usage").
 */
export function priceUsageRecord(
  schedule: PriceSchedule,
  record: UsageRecord,
): { amount: number; subtotal: bigint; aboveCap: boolean } {
  const { subtotal, amount } = priceUsage({ prices: schedule.prices, minimum: schedule.minimum }, record.usage);
  return { amount, subtotal, aboveCap: schedule.cap !== undefined && amount > schedule.cap };
}
