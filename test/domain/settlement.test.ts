import { describe, expect, it } from 'vitest';
import { MoneyInvariantError } from '../../src/domain/money.ts';
import type { SignedReceipt } from '../../src/domain/receipt.ts';
import {
  assertDecisionSplit,
  decideSettlement,
  deriveSettlement,
  entryIds,
  releaseCredits,
  type DecidedMoney,
  type SettlementTerms,
} from '../../src/domain/settlement.ts';

// Metered capture in the one settlement decision: a pass splits what it captured, the rest is the payer's again.

const terms: SettlementTerms = {
  settlementId: 'stl_m',
  runId: 'gate_m',
  payerWalletId: 'a:agent:payer',
  payeeWalletId: 'a:agent:payee',
  amount: 1_000,
  currency: 'USD',
  holdbackBps: 1_000,
  disputeWindowSeconds: 0,
};
const signed: DecidedMoney[] = [];
const sign = (money: DecidedMoney): SignedReceipt => {
  signed.push(money);
  return { body: {} as SignedReceipt['body'], receiptHash: 'h', signature: { alg: 'Ed25519', keyId: 'k', value: 'v' } };
};
const at = new Date('2030-01-01T00:00:00Z');
const decide = (captured: number | undefined, verdict: 'pass' | 'fail' = 'pass') =>
  decideSettlement(
    { ...terms, ...(captured === undefined ? {} : { captured }) },
    verdict,
    'VERIFICATION_FAILED',
    at,
    sign,
  );
const all = (...ids: string[]) => new Set(ids);

describe('metered settlement decision', () => {
  it('splits the captured amount into release and holdback (holdback on what was charged) and signs the capture', () => {
    const d = decide(400);
    expect(d).toMatchObject({ verdict: 'pass', captured: 400, releaseNow: 360, holdback: 40 });
    expect(signed.at(-1)).toMatchObject({ captured: 400, releasedNow: 360, holdback: 40 });
  });

  it('without a capture a pass takes the whole amount, a fail nothing (and records no capture)', () => {
    expect(decide(undefined)).toMatchObject({ releaseNow: 900, holdback: 100 });
    expect(decide(undefined).captured).toBeUndefined();
    const fail = decide(400, 'fail');
    expect(fail).toMatchObject({ releaseNow: 0, holdback: 0 });
    expect(fail.captured).toBeUndefined();
    expect(signed.at(-1)).toMatchObject({ captured: 0 });
  });

  it('refuses a capture above the amount, a negative or fractional one, a split that does not make it, and a capture on a fail', () => {
    expect(() => decide(1_001)).toThrow(MoneyInvariantError);
    expect(() => decide(-1)).toThrow(MoneyInvariantError);
    expect(() => decide(10.5)).toThrow(MoneyInvariantError);
    expect(() =>
      assertDecisionSplit('stl_m', 1_000, { verdict: 'pass', captured: 400, releaseNow: 400, holdback: 40 }),
    ).toThrow(MoneyInvariantError);
    expect(() =>
      assertDecisionSplit('stl_m', 1_000, { verdict: 'pass', captured: 400, releaseNow: 900, holdback: 100 }),
    ).toThrow(MoneyInvariantError);
    expect(() =>
      assertDecisionSplit('stl_m', 1_000, { verdict: 'fail', captured: 0, releaseNow: 0, holdback: 0 }),
    ).toThrow(MoneyInvariantError);
    // A decision stored before metering (no capture) still reads as the whole amount.
    expect(() =>
      assertDecisionSplit('stl_m', 1_000, { verdict: 'pass', releaseNow: 900, holdback: 100 }),
    ).not.toThrow();
  });
});

describe('the release entry of a pass', () => {
  const credits = (captured: number | undefined, holdbackBps = 1_000) =>
    releaseCredits(
      terms,
      decideSettlement(
        { ...terms, holdbackBps, ...(captured === undefined ? {} : { captured }) },
        'pass',
        null,
        at,
        sign,
      ),
    );

  it('credits the payee what is released now and the payer the uncaptured rest, leaving the holdback in escrow', () => {
    expect(credits(undefined)).toEqual([{ walletId: terms.payeeWalletId, amount: 900 }]);
    expect(credits(400)).toEqual([
      { walletId: terms.payeeWalletId, amount: 360 },
      { walletId: terms.payerWalletId, amount: 600 },
    ]);
    expect(credits(0)).toEqual([{ walletId: terms.payerWalletId, amount: 1_000 }]);
    // A holdback of everything charged: nothing reaches the payee now, so the entry does not credit it at all.
    expect(credits(400, 10_000)).toEqual([{ walletId: terms.payerWalletId, amount: 600 }]);
    expect(credits(undefined, 10_000)).toEqual([]);
  });
});

describe('metered settlement view', () => {
  const release = entryIds.release(terms.settlementId);
  const holdback = entryIds.holdback(terms.settlementId);

  it('is pending until the release entry (which also returns the uncaptured rest) is applied; then released and refunded parts show', () => {
    const decision = decide(400);
    expect(deriveSettlement(terms, { decision }, all(), at).status).toBe('pending');
    expect(deriveSettlement(terms, { decision }, all(release), at)).toMatchObject({
      status: 'completed',
      holdbackState: 'held',
      releasedAmount: 360,
      refundedAmount: 600,
      holdback: 40,
    });
    const done = deriveSettlement(
      terms,
      { decision, holdback: { fate: 'release', at: at.toISOString() } },
      all(release, holdback),
      at,
    );
    expect(done).toMatchObject({
      status: 'completed',
      holdbackState: 'released',
      releasedAmount: 400,
      refundedAmount: 600,
      final: true,
    });
  });

  it('a zero capture reads as refunded once the whole amount is back, and is final', () => {
    const decision = decide(0);
    expect(decision).toMatchObject({ captured: 0, releaseNow: 0, holdback: 0 });
    expect(deriveSettlement(terms, { decision }, all(), at).status).toBe('pending');
    expect(deriveSettlement(terms, { decision }, all(release), at)).toMatchObject({
      status: 'refunded',
      releasedAmount: 0,
      refundedAmount: 1_000,
      final: true,
    });
  });

  it('a full capture needs no return: completed as before', () => {
    expect(deriveSettlement(terms, { decision: decide(1_000) }, all(release), at)).toMatchObject({
      status: 'completed',
      releasedAmount: 900,
      refundedAmount: 0,
    });
  });
});
