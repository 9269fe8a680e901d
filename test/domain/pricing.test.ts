import { describe, expect, it } from 'vitest';
import {
  ArtifactBuildError,
  artifactIdFor,
  buildArtifact,
  hashArtifact,
  signArtifactHash,
  verifyArtifact,
  type RunArtifact,
} from '../../src/domain/artifact.ts';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { base64urlEncode, generateEd25519KeyPair, rawToJwk, sha256Hex } from '../../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents, type EventEnvelope } from '../../src/domain/event-chain.ts';
import {
  collectUsage,
  parsePriceSchedule,
  priceUsage,
  pricedCapture,
  pricedUsage,
  pricingProblems,
  pricingSha256,
  type PriceSchedule,
} from '../../src/domain/pricing.ts';
import type { MetricSource } from '../../src/domain/terms.ts';

const perToken: PriceSchedule = { prices: { tokens: { price: 3, per: 1000 } } };

function ev(seq: number, type: string, payload: MetricSource['payload']): MetricSource {
  return { seq, type, payload };
}

describe('price schedules', () => {
  it('accepts integer prices with a positive per, an optional minimum and a cap at least the minimum', () => {
    expect(pricingProblems(perToken)).toEqual([]);
    expect(
      pricingProblems({ prices: { tokens: { price: 0, per: 1 }, rows: { price: 5, per: 1 } }, minimum: 10, cap: 10 }),
    ).toEqual([]);
  });

  it.each([
    ['not an object', 7, 'pricing: must be an object'],
    ['no metrics', { prices: {} }, 'pricing.prices: at least one metric'],
    ['a fractional price', { prices: { tokens: { price: 1.5, per: 1 } } }, 'pricing.prices.tokens.price'],
    ['a negative price', { prices: { tokens: { price: -1, per: 1 } } }, 'pricing.prices.tokens.price'],
    ['a zero per', { prices: { tokens: { price: 1, per: 0 } } }, 'pricing.prices.tokens.per'],
    ['a fractional per', { prices: { tokens: { price: 1, per: 0.5 } } }, 'pricing.prices.tokens.per'],
    ['a price beyond a safe integer', { prices: { tokens: { price: 2 ** 53, per: 1 } } }, 'price'],
    ['a string price', { prices: { tokens: { price: '3', per: 1 } } }, 'pricing.prices.tokens.price'],
    ['a bad metric name', { prices: { '9lives': { price: 1, per: 1 } } }, 'metric name must match'],
    ['a fractional minimum', { prices: { tokens: { price: 1, per: 1 } }, minimum: 0.5 }, 'pricing.minimum'],
    ['a cap below the minimum', { prices: { tokens: { price: 1, per: 1 } }, minimum: 10, cap: 9 }, 'pricing.cap'],
    ['an unknown field', { prices: { tokens: { price: 1, per: 1 } }, currency: 'USD' }, 'pricing.currency'],
    ['an unknown price field', { prices: { tokens: { price: 1, per: 1, round: 'up' } } }, 'tokens.round'],
  ])('refuses %s', (_name, schedule, problem) => {
    const problems = pricingProblems(schedule);
    expect(problems.join('; ')).toContain(problem);
    expect(() => parsePriceSchedule(schedule)).toThrow(/PRICING|pricing/);
  });

  it('is named by the sha256 of its canonical JSON, whatever the key order it came in', () => {
    const a = parsePriceSchedule({ cap: 500, prices: { rows: { per: 1, price: 2 }, tokens: { price: 3, per: 1000 } } });
    const b = parsePriceSchedule({ prices: { tokens: { per: 1000, price: 3 }, rows: { price: 2, per: 1 } }, cap: 500 });
    expect(pricingSha256(a)).toBe(pricingSha256(b));
    expect(pricingSha256(a)).toBe(sha256Hex(canonicalize(a)));
    expect(pricingSha256(a)).not.toBe(pricingSha256({ ...a, cap: 501 }));
  });
});

describe('usage from events', () => {
  it('takes the last metric event of a metric, else sums its sample fields; other values count nothing', () => {
    const schedule = parsePriceSchedule({
      prices: { tokens: { price: 1, per: 1 }, rows: { price: 1, per: 1 }, seconds: { price: 1, per: 1 } },
    });
    const usage = collectUsage(
      [
        ev(3, 'metric', { name: 'tokens', value: 900 }),
        ev(1, 'metric', { name: 'tokens', value: 100 }),
        ev(2, 'sample', { tokens: 5, rows: 4 }),
        ev(4, 'sample', { rows: 6, seconds: 1.5 }),
        ev(5, 'sample', { rows: -2 }),
        ev(6, 'metric', { name: 'seconds', value: '7' }),
        ev(7, 'log', { rows: 1000 }),
      ],
      schedule,
    );
    expect(usage).toEqual({ rows: 10, seconds: 0, tokens: 900 });
  });

  it('refuses a sum of samples beyond a safe integer instead of rounding it', () => {
    const big = Number.MAX_SAFE_INTEGER;
    expect(() => collectUsage([ev(1, 'sample', { tokens: big }), ev(2, 'sample', { tokens: 1 })], perToken)).toThrow(
      /overflows/,
    );
  });
});

describe('the priced amount', () => {
  it('rounds each metric up once: ceil(units × price / per), in integers', () => {
    expect(priceUsage(perToken, { tokens: 12_345 })).toEqual({ subtotal: 38n, amount: 38 }); // 37.035 -> 38
    expect(priceUsage(perToken, { tokens: 1 })).toEqual({ subtotal: 1n, amount: 1 });
    expect(priceUsage(perToken, { tokens: 0 })).toEqual({ subtotal: 0n, amount: 0 });
    expect(priceUsage(perToken, { tokens: 2000 })).toEqual({ subtotal: 6n, amount: 6 });
  });

  it('raises to the minimum and lowers to the cap', () => {
    const s = parsePriceSchedule({ prices: { rows: { price: 7, per: 1 } }, minimum: 50, cap: 100 });
    expect(priceUsage(s, { rows: 2 }).amount).toBe(50);
    expect(priceUsage(s, { rows: 10 }).amount).toBe(70);
    expect(priceUsage(s, { rows: 1000 }).amount).toBe(100);
  });

  it('computes products beyond 2^53 exactly and refuses an amount that does not fit', () => {
    const s = parsePriceSchedule({ prices: { tokens: { price: 2 ** 40, per: 2 ** 40 } } });
    // 2^52 × 2^40 overflows a double's integers; in BigInt it divides back exactly.
    expect(priceUsage(s, { tokens: 2 ** 52 }).amount).toBe(2 ** 52);
    const dear = parsePriceSchedule({ prices: { tokens: { price: 2 ** 40, per: 1 } } });
    expect(() => priceUsage(dear, { tokens: 2 ** 20 })).toThrow(/overflows/);
    expect(priceUsage({ ...dear, cap: 1000 }, { tokens: 2 ** 20 }).amount).toBe(1000);
  });

  it('refuses usage of an unpriced metric or a non-integer count', () => {
    expect(() => priceUsage(perToken, { rows: 1 })).toThrow(/does not price/);
    expect(() => priceUsage(perToken, { tokens: 1.5 })).toThrow(/non-negative safe integer/);
  });

  it('is charged up to the escrow on a pass, and not at all on a fail', () => {
    expect(pricedCapture(38, 2500, 'pass')).toBe(38);
    expect(pricedCapture(3000, 2500, 'pass')).toBe(2500);
    expect(pricedCapture(38, 2500, 'fail')).toBe(0);
  });
});

describe('the artifact of a priced run', () => {
  const agent = generateEd25519KeyPair();
  const service = generateEd25519KeyPair();
  const jwks = { keys: [rawToJwk(service.raw)] };
  const RUN = 'run_PricedArtifact00000000';
  const events = signEvents(
    [
      { id: 'evt_1', runId: RUN, type: 'sample', at: '2026-01-01T00:00:01Z', payload: { tokens: 7000, correct: true } },
      { id: 'evt_2', runId: RUN, type: 'sample', at: '2026-01-01T00:00:02Z', payload: { tokens: 5345 } },
    ],
    EMPTY_HEAD,
    agent.privateKey,
    agent.keyId,
  );
  const build = (pricing: PriceSchedule | null, items: EventEnvelope[] = events) =>
    buildArtifact(
      {
        runId: RUN,
        agentId: 'acme:agent:worker',
        agentKeys: [{ keyId: agent.keyId, publicKey: base64urlEncode(agent.raw) }],
        pricing,
        events: items,
        finalizedAt: '2026-01-01T00:01:00Z',
      },
      service,
    );

  it('records the schedule, its hash, the usage and the amount, and verifies with a pricing check', () => {
    const a = build(perToken);
    expect(a.pricing).toEqual({
      schedule: perToken,
      pricingSha256: pricingSha256(perToken),
      usage: { tokens: 12_345 },
      subtotal: 38,
      amount: 38,
    });
    expect(a.pricing).toEqual(pricedUsage(events, perToken));
    const r = verifyArtifact(a, jwks);
    expect(r.failures).toEqual([]);
    expect(r.checks.pricing).toBe(true);
  });

  it('refuses to build an artifact whose usage cannot be priced in safe integers', () => {
    const huge = signEvents(
      [
        { id: 'evt_x', runId: RUN, type: 'sample', at: '2026-01-01T00:00:01Z', payload: { tokens: 2 ** 53 - 1 } },
        { id: 'evt_y', runId: RUN, type: 'sample', at: '2026-01-01T00:00:02Z', payload: { tokens: 1 } },
      ],
      EMPTY_HEAD,
      agent.privateKey,
      agent.keyId,
    );
    expect(() => build(perToken, huge)).toThrow(ArtifactBuildError);
    expect(() => build(perToken, huge)).toThrow(/overflows/);
  });

  it('leaves an unpriced artifact as it was: no pricing field, four checks', () => {
    const a = build(null);
    expect('pricing' in a).toBe(false);
    expect(Object.keys(verifyArtifact(a, jwks).checks).sort()).toEqual(
      ['artifactHash', 'chain', 'eventSignatures', 'serviceSignature'].sort(),
    );
  });

  /** Re-hash and re-sign a changed body, as a service that lied would: only the recomputation can catch it. */
  function resigned(a: RunArtifact, change: (p: NonNullable<RunArtifact['pricing']>) => void): RunArtifact {
    const copy = structuredClone(a);
    change(copy.pricing!);
    const hash = hashArtifact(copy);
    return {
      ...copy,
      artifactHash: hash,
      artifactId: artifactIdFor(hash),
      signature: signArtifactHash(hash, service.privateKey, service.keyId),
    };
  }

  it.each([
    ['usage', (p: NonNullable<RunArtifact['pricing']>) => void (p.usage = { tokens: 20_000 })],
    ['price', (p: NonNullable<RunArtifact['pricing']>) => void (p.schedule.prices.tokens!.price = 4)],
    ['amount', (p: NonNullable<RunArtifact['pricing']>) => void (p.amount = 39)],
    ['subtotal', (p: NonNullable<RunArtifact['pricing']>) => void (p.subtotal = 37)],
  ])('fails when the %s is changed, even re-hashed and re-signed by the service key', (_what, change) => {
    const a = build(perToken);
    const forged = resigned(a, change);
    const r = verifyArtifact(forged, jwks);
    expect(r.checks.artifactHash).toBe(true);
    expect(r.checks.serviceSignature).toBe(true);
    expect(r.checks.pricing).toBe(false);
    expect(r.verified).toBe(false);
    // Changed without re-signing, the hash check fails as well.
    const plain = structuredClone(a);
    change(plain.pricing!);
    expect(verifyArtifact(plain, jwks)).toMatchObject({ verified: false, checks: { artifactHash: false } });
  });
});
