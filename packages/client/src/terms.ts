// Terms evaluation (contract section 5): metrics from `metric` events, derived from `sample` events where missing.
import type { JsonValue } from './canonical-json.ts';

export type Bound = { min: number } | { max: number };
/** Metric name -> bound. */
export type Terms = Record<string, Bound>;
/** Metric name -> value used for evaluation; null when a term's metric was never reported nor derivable. */
export type Metrics = Record<string, number | null>;

export type TermFailureReason = 'METRIC_MISSING';

export interface TermResult {
  metric: string;
  bound: Bound;
  value: number | null;
  pass: boolean;
  reason?: TermFailureReason;
}

export type Verdict = 'pass' | 'fail';

export interface Evaluation {
  verdict: Verdict;
  results: TermResult[];
}

/** The part of an event that evaluation reads. */
export type MetricSource = { seq: number; type: string; payload: JsonValue };

export const METRIC_NAME = /^[A-Za-z][A-Za-z0-9_]{0,63}$/;
export const MAX_TERMS = 32;

/** Thrown for terms that break the contract's shape (they are validated at run creation, so this means a bug). */
export class TermsError extends Error {
  readonly code = 'TERMS_INVALID';
  constructor(message: string) {
    super(message);
    this.name = 'TermsError';
  }
}

/** Problems with a terms object, as `path: message` strings; empty when valid. Usable by request validation. */
export function termsProblems(terms: unknown): string[] {
  if (typeof terms !== 'object' || terms === null || Array.isArray(terms)) return ['terms: must be an object'];
  const problems: string[] = [];
  const entries = Object.entries(terms as Record<string, unknown>);
  if (entries.length > MAX_TERMS) problems.push(`terms: at most ${MAX_TERMS} metrics`);
  for (const [name, bound] of entries) {
    if (!METRIC_NAME.test(name)) problems.push(`terms.${name}: metric name must match ${METRIC_NAME.source}`);
    if (typeof bound !== 'object' || bound === null || Array.isArray(bound)) {
      problems.push(`terms.${name}: bound must be an object`);
      continue;
    }
    const keys = Object.keys(bound);
    const value = (bound as Record<string, unknown>)[keys[0] ?? ''];
    if (keys.length !== 1 || (keys[0] !== 'min' && keys[0] !== 'max')) {
      problems.push(`terms.${name}: bound must have exactly one of "min" or "max"`);
    } else if (typeof value !== 'number' || !Number.isFinite(value)) {
      problems.push(`terms.${name}.${keys[0]}: must be a finite number`);
    }
  }
  return problems;
}

function asRecord(v: JsonValue): Record<string, JsonValue> | null {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? v : null;
}

function isFiniteNumber(v: unknown): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}

/**
 * Metrics reported by `metric` events, last one (in seq order) wins. A metric event counts only when its payload is
 * `{name, value}` with a valid metric name (the terms' name pattern, which also keeps names like "__proto__" out of
 * plain objects) and a finite number value; other shapes stay in the chain as evidence but report nothing.
 */
function reportedMetrics(sorted: readonly MetricSource[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const e of sorted) {
    if (e.type !== 'metric') continue;
    const p = asRecord(e.payload);
    if (p && typeof p.name === 'string' && METRIC_NAME.test(p.name) && isFiniteNumber(p.value)) {
      out.set(p.name, p.value);
    }
  }
  return out;
}

/** Nearest-rank percentile: sort ascending, rank = ceil(p/100 * n), value = sorted[rank - 1]. */
export function nearestRankPercentile(values: readonly number[], percent: number): number | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  // (percent * n) / 100 is exact for integer percent and n, so ceil never rounds up a float artefact.
  const rank = Math.max(1, Math.ceil((percent * sorted.length) / 100));
  return sorted[rank - 1] ?? null;
}

/** Metrics the contract derives from `sample` events when no `metric` event reports them. */
const DERIVED: Record<string, (samples: readonly Record<string, JsonValue>[]) => number | null> = {
  latencyP95: (samples) => nearestRankPercentile(samples.map((s) => s.latencyMs).filter(isFiniteNumber), 95),
  accuracy: (samples) => {
    const judged = samples.map((s) => s.correct).filter((c): c is boolean => typeof c === 'boolean');
    return judged.length === 0 ? null : judged.filter((c) => c).length / judged.length;
  },
};

function bySeq(events: readonly MetricSource[]): MetricSource[] {
  return [...events].sort((a, b) => a.seq - b.seq);
}

/**
 * The metrics object recorded in the artifact: every reported metric (last `metric` event wins) plus every term
 * metric, derived from `sample` events where it was not reported, null where it is missing altogether.
 * Keys come out sorted so the object reads the same everywhere (JCS sorts for hashing anyway).
 */
export function collectMetrics(events: readonly MetricSource[], terms: Terms = {}): Metrics {
  const sorted = bySeq(events);
  const metrics = new Map<string, number | null>(reportedMetrics(sorted));
  const samples = sorted
    .filter((e) => e.type === 'sample')
    .map((e) => asRecord(e.payload))
    .filter((p): p is Record<string, JsonValue> => p !== null);
  for (const name of Object.keys(terms)) {
    if (metrics.has(name)) continue;
    const derive = Object.hasOwn(DERIVED, name) ? DERIVED[name] : undefined;
    metrics.set(name, derive ? derive(samples) : null);
  }
  const out: Metrics = {};
  for (const name of [...metrics.keys()].sort()) out[name] = metrics.get(name) ?? null;
  return out;
}

/**
 * Evaluate terms against metrics. Bounds are inclusive (`value >= min`, `value <= max`). A term whose metric is
 * missing fails with reason METRIC_MISSING. Verdict is "pass" only when every term passes (no terms -> "pass").
 * Results are sorted by metric name (UTF-16 order, as JCS) so the evaluation is deterministic.
 */
export function evaluateTerms(terms: Terms, metrics: Readonly<Metrics>): Evaluation {
  const problems = termsProblems(terms);
  if (problems.length > 0) throw new TermsError(problems.join('; '));
  const results: TermResult[] = Object.keys(terms)
    .sort()
    .map((metric) => {
      const b = terms[metric] as Bound;
      const bound: Bound = 'min' in b ? { min: b.min } : { max: b.max };
      const v = Object.hasOwn(metrics, metric) ? metrics[metric] : undefined;
      if (!isFiniteNumber(v)) return { metric, bound, value: null, pass: false, reason: 'METRIC_MISSING' };
      const pass = 'min' in bound ? v >= bound.min : v <= bound.max;
      return { metric, bound, value: v, pass };
    });
  return { verdict: results.every((r) => r.pass) ? 'pass' : 'fail', results };
}

/** collectMetrics + evaluateTerms over a run's events. */
export function evaluateRun(
  events: readonly MetricSource[],
  terms: Terms = {},
): { metrics: Metrics; evaluation: Evaluation } {
  const metrics = collectMetrics(events, terms);
  return { metrics, evaluation: evaluateTerms(terms, metrics) };
}
