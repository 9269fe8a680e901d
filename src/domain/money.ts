// Money rules: integers in minor units only; shares computed in BigInt so no product can lose precision.

export const CURRENCY_PATTERN = '^[A-Z][A-Z0-9]{2,11}$';
export const MAX_AMOUNT = Number.MAX_SAFE_INTEGER;

export function isAmount(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) >= 1;
}

/** Basis-point share of an amount, rounded down (the remainder stays with the other side). */
export function bpsShare(amount: number, bps: number): number {
  if (!Number.isSafeInteger(amount) || amount < 0) throw new RangeError('amount must be a non-negative safe integer');
  if (!Number.isInteger(bps) || bps < 0 || bps > 10_000) throw new RangeError('bps must be an integer 0..10000');
  return Number((BigInt(amount) * BigInt(bps)) / 10_000n);
}

/** The part kept in escrow until the dispute window ends; the rest is released at once on a pass. */
export function holdbackOf(amount: number, holdbackBps: number): { holdback: number; releaseNow: number } {
  const holdback = bpsShare(amount, holdbackBps);
  return { holdback, releaseNow: amount - holdback };
}

/** How a frozen amount divides when a dispute is resolved. */
export function disputeSplit(
  frozen: number,
  outcome: 'payee' | 'payer' | 'split',
  payerShareBps = 0,
): { toPayer: number; toPayee: number } {
  const bps = outcome === 'payer' ? 10_000 : outcome === 'payee' ? 0 : payerShareBps;
  const toPayer = bpsShare(frozen, bps);
  return { toPayer, toPayee: frozen - toPayer };
}

/**
 * A money path found its own books inconsistent (a split that does not add up, a capture beyond its reserve): the
 * operation stops loudly instead of moving money wrongly, and the sweeper counts it and tries again later.
 */
export class MoneyInvariantError extends Error {
  override readonly name = 'MoneyInvariantError';
}

/** Stops with a MoneyInvariantError unless `holds`. */
export function assertMoney(holds: boolean, what: string): asserts holds {
  if (!holds) throw new MoneyInvariantError(`money invariant broken: ${what}`);
}

/**
 * A fact money relies on that must be there: the winner read back after a unique insert lost, the terms a run was
 * settled under. Missing, it stops the path with a MoneyInvariantError naming `what`, instead of a TypeError later.
 */
export function recorded<T>(value: T | null | undefined, what: string): T {
  assertMoney(value !== null && value !== undefined, `${what} is not recorded`);
  return value;
}
