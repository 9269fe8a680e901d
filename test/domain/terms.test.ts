import { describe, expect, it } from 'vitest';
import type { JsonValue } from '../../src/domain/canonical-json.ts';
import {
  collectMetrics,
  evaluateRun,
  evaluateTerms,
  nearestRankPercentile,
  termsProblems,
  TermsError,
} from '../../src/domain/terms.ts';
import type { MetricSource, Terms } from '../../src/domain/terms.ts';

let seq = 0;
const ev = (type: string, payload: JsonValue): MetricSource => ({ seq: ++seq, type, payload });
const metric = (name: string, value: JsonValue) => ev('metric', { name, value });
const sample = (payload: JsonValue) => ev('sample', payload);

describe('nearestRankPercentile', () => {
  it('uses rank = ceil(p * n) on the ascending sort', () => {
    const hundred = Array.from({ length: 100 }, (_, i) => 100 - i); // 100..1, unsorted on purpose
    expect(nearestRankPercentile(hundred, 95)).toBe(95);
    const twenty = Array.from({ length: 20 }, (_, i) => i + 1);
    expect(nearestRankPercentile(twenty, 95)).toBe(19); // ceil(19) = 19 exactly, no float drift to 20
    expect(nearestRankPercentile([5, 1, 3], 95)).toBe(5); // ceil(2.85) = 3
    expect(nearestRankPercentile([42], 95)).toBe(42);
    expect(nearestRankPercentile([10, 20], 50)).toBe(10);
    expect(nearestRankPercentile([], 95)).toBeNull();
  });

  it('sorts numerically, not lexically', () => {
    expect(nearestRankPercentile([9, 100, 20], 95)).toBe(100);
  });
});

describe('collectMetrics', () => {
  it('takes metric events, last one in seq order winning', () => {
    const a = metric('accuracy', 0.5);
    const b = metric('accuracy', 0.8);
    // Given out of order: seq decides, not array position.
    expect(collectMetrics([b, a])).toEqual({ accuracy: 0.8 });
  });

  it('derives latencyP95 and accuracy from samples only for terms without a metric event', () => {
    const events = [
      ...Array.from({ length: 20 }, (_, i) => sample({ latencyMs: (i + 1) * 10, correct: i < 15 })),
      sample({ latencyMs: 'fast', correct: 'yes' }), // ignored: not a number / not a boolean
      sample({ note: 'no measurements' }),
      ev('log', { latencyMs: 100000 }), // only sample events count
    ];
    const terms: Terms = { latencyP95: { max: 500 }, accuracy: { min: 0.7 } };
    expect(collectMetrics(events, terms)).toEqual({ accuracy: 0.75, latencyP95: 190 });
    // A reported metric overrides derivation.
    expect(collectMetrics([...events, metric('accuracy', 0.99)], terms)).toEqual({ accuracy: 0.99, latencyP95: 190 });
  });

  it('does not derive metrics nobody asked for, and records missing term metrics as null', () => {
    const events = [sample({ latencyMs: 5, correct: true }), metric('cost', 3)];
    expect(collectMetrics(events)).toEqual({ cost: 3 });
    expect(collectMetrics(events, { throughput: { min: 1 } })).toEqual({ cost: 3, throughput: null });
  });

  it('accuracy counts only samples that carry a boolean correct', () => {
    const events = [
      sample({ correct: true }),
      sample({ correct: false }),
      sample({ latencyMs: 3 }),
      sample({ correct: 1 }),
    ];
    expect(collectMetrics(events, { accuracy: { min: 0 } })).toEqual({ accuracy: 0.5 });
    expect(collectMetrics([sample({ latencyMs: 3 })], { accuracy: { min: 0 } })).toEqual({ accuracy: null });
  });

  it('ignores metric events that are not {name, value:number} with a valid name', () => {
    const events = [
      metric('accuracy', 0.9),
      metric('accuracy', 'high'),
      ev('metric', { name: 'accuracy' }),
      ev('metric', [1, 2]),
      metric('__proto__', 1),
      metric('bad name', 2),
    ];
    const out = collectMetrics(events);
    expect(out).toEqual({ accuracy: 0.9 });
    expect(Object.getPrototypeOf(out)).toBe(Object.prototype);
  });

  it('returns keys in sorted order', () => {
    expect(Object.keys(collectMetrics([metric('zeta', 1), metric('alpha', 2)], { mid: { min: 0 } }))).toEqual([
      'alpha',
      'mid',
      'zeta',
    ]);
  });
});

describe('evaluateTerms', () => {
  it('passes only when every term passes; bounds are inclusive', () => {
    const terms: Terms = { accuracy: { min: 0.9 }, latencyP95: { max: 200 } };
    expect(evaluateTerms(terms, { accuracy: 0.9, latencyP95: 200 })).toEqual({
      verdict: 'pass',
      results: [
        { metric: 'accuracy', bound: { min: 0.9 }, value: 0.9, pass: true },
        { metric: 'latencyP95', bound: { max: 200 }, value: 200, pass: true },
      ],
    });
    const fail = evaluateTerms(terms, { accuracy: 0.95, latencyP95: 200.5 });
    expect(fail.verdict).toBe('fail');
    expect(fail.results.map((r) => r.pass)).toEqual([true, false]);
  });

  it('fails a term whose metric is missing with METRIC_MISSING', () => {
    const r = evaluateTerms({ accuracy: { min: 0.5 } }, { latencyP95: 3, accuracy: null });
    expect(r).toEqual({
      verdict: 'fail',
      results: [{ metric: 'accuracy', bound: { min: 0.5 }, value: null, pass: false, reason: 'METRIC_MISSING' }],
    });
    expect(evaluateTerms({ accuracy: { min: 0.5 } }, {}).results[0]?.reason).toBe('METRIC_MISSING');
  });

  it('passes a run without terms', () => {
    expect(evaluateTerms({}, { anything: 1 })).toEqual({ verdict: 'pass', results: [] });
  });

  it('orders results by metric name regardless of insertion order', () => {
    const r = evaluateTerms({ z: { min: 0 }, a: { min: 0 }, M: { max: 1 } }, { z: 1, a: 1, M: 1 });
    expect(r.results.map((x) => x.metric)).toEqual(['M', 'a', 'z']);
  });

  it('refuses terms that break the contract shape', () => {
    expect(() => evaluateTerms({ a: { min: 1, max: 2 } as never }, {})).toThrow(TermsError);
    expect(() => evaluateTerms({ a: {} as never }, {})).toThrow(TermsError);
    expect(() => evaluateTerms({ a: { min: Number.NaN } }, {})).toThrow(TermsError);
  });
});

describe('termsProblems', () => {
  it('accepts contract-shaped terms and names every problem otherwise', () => {
    expect(termsProblems({ accuracy: { min: 0.9 }, latencyP95: { max: 250 } })).toEqual([]);
    expect(termsProblems({ '1bad': { min: 1 } })[0]).toMatch(/^terms\.1bad: metric name/);
    expect(termsProblems({ a: { min: '1' } })).toEqual(['terms.a.min: must be a finite number']);
    expect(termsProblems({ a: { least: 1 } })).toHaveLength(1);
    expect(termsProblems([])).toEqual(['terms: must be an object']);
    const many = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`m${i}`, { min: 0 }]));
    expect(termsProblems(many)).toEqual(['terms: at most 32 metrics']);
  });
});

describe('evaluateRun', () => {
  it('evaluates derived metrics end to end', () => {
    const events = [
      ...Array.from({ length: 10 }, (_, i) => sample({ latencyMs: 100 + i * 10, correct: i !== 0 })),
      metric('cost', 12),
    ];
    const { metrics, evaluation } = evaluateRun(events, { accuracy: { min: 0.9 }, latencyP95: { max: 150 } });
    expect(metrics).toEqual({ accuracy: 0.9, cost: 12, latencyP95: 190 });
    expect(evaluation.verdict).toBe('fail');
    expect(evaluation.results).toEqual([
      { metric: 'accuracy', bound: { min: 0.9 }, value: 0.9, pass: true },
      { metric: 'latencyP95', bound: { max: 150 }, value: 190, pass: false },
    ]);
  });
});
