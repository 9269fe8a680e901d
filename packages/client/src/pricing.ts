// Prices in the terms (priced by use): a run's price schedule, the usage its signed events report, and the amount that
// usage costs. Integers end to end: prices, counts and amounts are safe integers, every product and sum is BigInt, and
// an amount that no longer fits a safe integer is an error, never a float.
import { canonicalize, type JsonValue } from './canonical-json.ts';
import { sha256Hex } from './crypto.ts';
import { METRIC_NAME, type MetricSource } from './terms.ts';

/** `price` minor units (of the settlement's currency) per `per` units of the metric. */
export interface MetricPrice {
  price: number;
  per: number;
}

/**
 * A price schedule: the cost of each metric is ceil(units × price / per) (the one rounding rule: a started block of
 * `per` units is paid pro rata, rounded up to the next minor unit); the amount is the sum over the metrics, raised to
 * `minimum` and lowered to `cap` when those are given.
 */
export interface PriceSchedule {
  prices: Record<string, MetricPrice>;
  minimum?: number;
  cap?: number;
}

/** Metric name -> units the run's events report (a non-negative safe integer). */
export type Usage = Record<string, number>;

/** What the artifact records about a priced run: the schedule, its hash, the usage and what that usage costs. */
export interface PricedUsage {
  schedule: PriceSchedule;
  /** sha256hex(JCS(schedule)): what a receipt names the schedule by. */
  pricingSha256: string;
  usage: Usage;
  /** Σ ceil(units × price / per) over the priced metrics, before minimum and cap. */
  subtotal: number;
  /** The subtotal raised to the minimum and lowered to the cap: what the usage costs (settlement caps it by escrow). */
  amount: number;
}

export const MAX_PRICED_METRICS = 32;

/** A schedule, a usage count or an amount that breaks the integer rules (bad input, or an overflow). */
export class PricingError extends Error {
  readonly code = 'PRICING_INVALID';
  constructor(message: string) {
    super(message);
    this.name = 'PricingError';
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isCount(v: unknown, min: number): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= min;
}

/** Problems with a price schedule, as `path: message` strings (path under `pricing`); empty when valid. */
export function pricingProblems(pricing: unknown): string[] {
  if (!isRecord(pricing)) return ['pricing: must be an object'];
  const problems: string[] = [];
  for (const key of Object.keys(pricing))
    if (key !== 'prices' && key !== 'minimum' && key !== 'cap') problems.push(`pricing.${key}: unknown field`);
  const { prices, minimum, cap } = pricing;
  if (!isRecord(prices)) problems.push('pricing.prices: must be an object');
  else {
    const entries = Object.entries(prices);
    if (entries.length === 0) problems.push('pricing.prices: at least one metric');
    if (entries.length > MAX_PRICED_METRICS) problems.push(`pricing.prices: at most ${MAX_PRICED_METRICS} metrics`);
    for (const [name, p] of entries) {
      const at = `pricing.prices.${name}`;
      if (!METRIC_NAME.test(name)) problems.push(`${at}: metric name must match ${METRIC_NAME.source}`);
      if (!isRecord(p)) {
        problems.push(`${at}: must be {price, per}`);
        continue;
      }
      for (const key of Object.keys(p))
        if (key !== 'price' && key !== 'per') problems.push(`${at}.${key}: unknown field`);
      if (!isCount(p.price, 0)) problems.push(`${at}.price: must be an integer of minor units, 0 or more`);
      if (!isCount(p.per, 1)) problems.push(`${at}.per: must be a positive integer`);
    }
  }
  if (minimum !== undefined && !isCount(minimum, 0)) problems.push('pricing.minimum: must be an integer, 0 or more');
  if (cap !== undefined && !isCount(cap, 0)) problems.push('pricing.cap: must be an integer, 0 or more');
  if (isCount(minimum, 0) && isCount(cap, 0) && cap < minimum)
    problems.push('pricing.cap: must be at least the minimum');
  return problems;
}

/** A valid schedule as a plain copy with only its own fields (so its hash is the schedule's alone), or a PricingError. */
export function parsePriceSchedule(pricing: unknown): PriceSchedule {
  const problems = pricingProblems(pricing);
  if (problems.length > 0) throw new PricingError(problems.join('; '));
  const p = pricing as PriceSchedule;
  const prices: Record<string, MetricPrice> = {};
  for (const name of Object.keys(p.prices).sort())
    prices[name] = { price: p.prices[name]!.price, per: p.prices[name]!.per };
  return {
    prices,
    ...(p.minimum !== undefined ? { minimum: p.minimum } : {}),
    ...(p.cap !== undefined ? { cap: p.cap } : {}),
  };
}

/** sha256hex(JCS(schedule)): the name a receipt gives the schedule. */
export function pricingSha256(schedule: PriceSchedule): string {
  return sha256Hex(canonicalize(schedule));
}

function asRecord(v: JsonValue): Record<string, JsonValue> | null {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? v : null;
}

function safe(value: bigint, what: string): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw new PricingError(`${what} overflows a safe integer`);
  return Number(value);
}

/**
 * The usage a run's signed events report for each priced metric, read as evaluation reads metrics: the last `metric`
 * event `{name, value}` for the metric wins (the run reports its total); where there is none, the metric's field is
 * summed over the `sample` events (each sample reports its own share). Only non-negative safe integers count; any
 * other value stays in the chain as evidence and counts nothing. A metric nothing reports used 0 units.
 */
export function collectUsage(events: readonly MetricSource[], schedule: PriceSchedule): Usage {
  const sorted = [...events].sort((a, b) => a.seq - b.seq);
  const names = Object.keys(schedule.prices).sort();
  const reported = new Map<string, number>();
  const sampled = new Map<string, bigint>(names.map((n) => [n, 0n]));
  for (const e of sorted) {
    const p = asRecord(e.payload);
    if (!p) continue;
    if (e.type === 'metric' && typeof p.name === 'string' && sampled.has(p.name) && isCount(p.value, 0))
      reported.set(p.name, p.value);
    if (e.type === 'sample')
      for (const n of names) {
        const v = Object.hasOwn(p, n) ? p[n] : undefined;
        if (isCount(v, 0)) sampled.set(n, sampled.get(n)! + BigInt(v));
      }
  }
  const usage: Usage = {};
  for (const n of names) usage[n] = reported.get(n) ?? safe(sampled.get(n)!, `usage of ${n}`);
  return usage;
}

/** ceil(units × price / per) in BigInt. */
function metricCost(units: number, p: MetricPrice): bigint {
  const product = BigInt(units) * BigInt(p.price);
  const per = BigInt(p.per);
  return (product + per - 1n) / per;
}

/**
 * What `usage` costs under `schedule`: the subtotal Σ ceil(units × price / per) and the amount (subtotal raised to
 * the minimum, lowered to the cap). A usage count that is not a non-negative safe integer, a metric the schedule does
 * not price, or an amount beyond a safe integer is a PricingError.
 */
export function priceUsage(schedule: PriceSchedule, usage: Usage): { subtotal: bigint; amount: number } {
  let subtotal = 0n;
  for (const [name, units] of Object.entries(usage)) {
    const price = Object.hasOwn(schedule.prices, name) ? schedule.prices[name] : undefined;
    if (!price) throw new PricingError(`usage of ${name}: the schedule does not price it`);
    if (!isCount(units, 0)) throw new PricingError(`usage of ${name}: must be a non-negative safe integer`);
    subtotal += metricCost(units, price);
  }
  let amount = subtotal;
  if (schedule.minimum !== undefined && amount < BigInt(schedule.minimum)) amount = BigInt(schedule.minimum);
  if (schedule.cap !== undefined && amount > BigInt(schedule.cap)) amount = BigInt(schedule.cap);
  return { subtotal, amount: safe(amount, 'the priced amount') };
}

/** The artifact's priced usage of a run: usage from its events, priced by its schedule (all integers). */
export function pricedUsage(events: readonly MetricSource[], schedule: PriceSchedule): PricedUsage {
  const usage = collectUsage(events, schedule);
  const { subtotal, amount } = priceUsage(schedule, usage);
  return {
    schedule: structuredClone(schedule),
    pricingSha256: pricingSha256(schedule),
    usage,
    subtotal: safe(subtotal, 'the priced subtotal'),
    amount,
  };
}

/** What a settlement of a priced run charges: the priced amount, capped by the escrow; nothing on a fail. */
export function pricedCapture(pricedAmount: number, escrowAmount: number, verdict: 'pass' | 'fail'): number {
  if (!isCount(pricedAmount, 0) || !isCount(escrowAmount, 0))
    throw new PricingError('amounts must be non-negative safe integers');
  return verdict === 'pass' ? Math.min(pricedAmount, escrowAmount) : 0;
}

/**
 * Recomputes a priced run's record from its events alone and compares it with what the artifact states: the schedule
 * must be valid, its hash, the usage, subtotal and amount must all be the recomputed ones. Answers what differs.
 */
export function checkPricedUsage(recorded: unknown, events: readonly MetricSource[]): string[] {
  if (!isRecord(recorded)) return ['pricing must be {schedule, pricingSha256, usage, subtotal, amount}'];
  let schedule: PriceSchedule;
  try {
    schedule = parsePriceSchedule(recorded.schedule);
  } catch (err) {
    return [`schedule is invalid: ${(err as Error).message}`];
  }
  let fresh: PricedUsage;
  try {
    fresh = pricedUsage(events, schedule);
  } catch (err) {
    return [`cannot recompute the priced usage: ${(err as Error).message}`];
  }
  const out: string[] = [];
  if (recorded.pricingSha256 !== fresh.pricingSha256)
    out.push(`pricingSha256 ${String(recorded.pricingSha256)} is not the schedule's hash ${fresh.pricingSha256}`);
  if (!isRecord(recorded.usage) || canonicalize(recorded.usage) !== canonicalize(fresh.usage))
    out.push(`usage ${JSON.stringify(recorded.usage)} is not what the events report: ${JSON.stringify(fresh.usage)}`);
  if (recorded.subtotal !== fresh.subtotal)
    out.push(`subtotal ${String(recorded.subtotal)} is not the recomputed ${fresh.subtotal}`);
  if (recorded.amount !== fresh.amount)
    out.push(`amount ${String(recorded.amount)} is not the recomputed ${fresh.amount}`);
  const extra = Object.keys(recorded).filter(
    (k) => !['schedule', 'pricingSha256', 'usage', 'subtotal', 'amount'].includes(k),
  );
  if (extra.length > 0) out.push(`unknown fields: ${extra.join(', ')}`);
  return out;
}
