import { Type, type Static } from 'typebox';
import type { ChainHead } from '../../domain/event-chain.ts';
import { MAX_PRICED_METRICS } from '../../domain/pricing.ts';
import { MAX_TERMS } from '../../domain/terms.ts';
import type { RunDoc } from '../../store/runs.ts';
import { AgentId, Amount, Currency, Timestamp } from './common.ts';

const Bound = Type.Union([
  Type.Object({ min: Type.Number() }, { additionalProperties: false }),
  Type.Object({ max: Type.Number() }, { additionalProperties: false }),
]);
// The key rule goes in propertyNames: the OpenAPI writer turns a patterned key into a plain additionalProperties.
export const TermsSchema = Type.Record(Type.String(), Bound, {
  propertyNames: { pattern: '^[A-Za-z][A-Za-z0-9_]{0,63}$' },
  maxProperties: MAX_TERMS,
  description: 'metric name -> {min} | {max} (inclusive); e.g. {"accuracy":{"min":0.9},"latencyP95":{"max":800}}',
});
const minorUnits = (description: string) => Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER, description });
export const PricingSchema = Type.Object(
  {
    prices: Type.Record(
      Type.String(),
      Type.Object(
        {
          price: minorUnits('integer minor units of the settlement currency per `per` units'),
          per: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
        },
        { additionalProperties: false },
      ),
      {
        propertyNames: { pattern: '^[A-Za-z][A-Za-z0-9_]{0,63}$' },
        minProperties: 1,
        maxProperties: MAX_PRICED_METRICS,
        description: 'usage metric name (e.g. tokens, rows, seconds) -> {price, per}',
      },
    ),
    minimum: Type.Optional(minorUnits('the least a passing run is charged')),
    cap: Type.Optional(minorUnits('the most a run is charged (at least the minimum)')),
  },
  {
    additionalProperties: false,
    description:
      'Priced by use: each metric costs ceil(units × price / per) minor units (the one rounding rule: up); the amount ' +
      'is their sum, raised to minimum and lowered to cap, and a settlement charges it up to the escrowed amount. ' +
      'Usage is what the signed events report: the last `metric` event {name, value} of the metric, else the sum of ' +
      'the metric field of `sample` events; only non-negative integers count. Integers only, no fractions anywhere.',
  },
);
export const SettlementTermsSchema = Type.Object(
  {
    payerAgentId: AgentId,
    amount: Amount,
    currency: Currency,
    holdbackBps: Type.Optional(Type.Integer({ minimum: 0, maximum: 10_000, default: 0 })),
    disputeWindowSeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 2_592_000, default: 86_400 })),
  },
  { additionalProperties: false },
);
const Head = Type.Object({ seq: Type.Integer(), chainHash: Type.Union([Type.String(), Type.Null()]) });
const HEX64 = Type.String({ pattern: '^[0-9a-f]{64}$' });

export const EventSchema = Type.Object(
  {
    v: Type.Literal(1),
    id: Type.String({ pattern: '^evt_[A-Za-z0-9_-]{1,128}$' }),
    runId: Type.String({ maxLength: 128 }),
    seq: Type.Integer({ minimum: 1 }),
    type: Type.String({ pattern: '^[A-Za-z][A-Za-z0-9_.:-]{0,63}$' }),
    at: Type.String({ maxLength: 64, description: 'RFC 3339 time the agent recorded the event' }),
    payload: Type.Unknown({
      description: 'any JSON nested at most 128 deep; metric {name, value}; sample {latencyMs?, correct?}',
    }),
    prevChainHash: Type.Union([HEX64, Type.Null()]),
    payloadHash: HEX64,
    chainHash: HEX64,
    signerKeyId: Type.String({ maxLength: 64 }),
    signature: Type.String({ maxLength: 200 }),
  },
  { additionalProperties: false, description: 'Agent-signed, hash-chained event (contract section 5)' },
);

const SETTLEMENT_EXAMPLE = {
  payerAgentId: 'acme:agent:buyer',
  amount: 2500,
  currency: 'USD',
  holdbackBps: 1000,
  disputeWindowSeconds: 86_400,
};
export const CreateRun = Type.Object(
  {
    agentId: AgentId,
    terms: Type.Optional(TermsSchema),
    pricing: Type.Optional(PricingSchema),
    settlement: Type.Optional(SettlementTermsSchema),
  },
  {
    additionalProperties: false,
    examples: [
      {
        agentId: 'acme:agent:summarizer',
        terms: { accuracy: { min: 0.9 }, latencyP95: { max: 800 } },
        settlement: SETTLEMENT_EXAMPLE,
      },
    ],
  },
);
export const RunView = Type.Object({
  runId: Type.String(),
  status: Type.Union([Type.Literal('in_progress'), Type.Literal('finalizing'), Type.Literal('finalized')]),
  verdict: Type.Union([Type.Literal('pass'), Type.Literal('fail'), Type.Null()]),
  artifactId: Type.Union([Type.String(), Type.Null()]),
  agentId: Type.String(),
  terms: TermsSchema,
  pricing: Type.Optional(PricingSchema),
  settlement: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  head: Head,
  eventCount: Type.Integer(),
  createdAt: Timestamp,
  finalizedAt: Type.Union([Timestamp, Type.Null()]),
  finalizeError: Type.Union([Type.Object({ code: Type.String(), message: Type.String() }), Type.Null()], {
    description: 'set when the run could not be made into an artifact; it is then finalized with verdict fail',
  }),
});
export const RunParams = Type.Object({ runId: Type.String({ maxLength: 128 }) });
/** A real envelope: signed with the example key of the agents examples, first in its run's chain. */
const EVENT_EXAMPLE = {
  v: 1,
  id: 'evt_0001',
  runId: 'run_7Qm2xK9pLs4VbN8cT3wZ5hRj',
  seq: 1,
  type: 'metric',
  at: '2026-03-14T09:26:53.589Z',
  payload: { name: 'accuracy', value: 0.94 },
  prevChainHash: null,
  payloadHash: '0fc7133b082c7229f690864ddd8c7c4807ed3808d8b5737213a3490c80216540',
  chainHash: '4d54a3d2e67927b101269b398653318292b1899f34bd2cb091e92e270eb2b519',
  signerKeyId: 'key_5f2b9c0e4a7d1f3b8e6c2a90',
  signature: '0aQkIt2I359Tb9tdg-7G_THRtnm5OnFJAKnVhvJWlJmgm5f2WgL6yJU3DbZDfIWZr6Wd3ZyjnPOmFv0yF292AQ',
};
export const AppendBody = Type.Union(
  [
    Type.Object({ event: EventSchema }, { additionalProperties: false }),
    Type.Object({ events: Type.Array(EventSchema, { minItems: 1, maxItems: 100 }) }, { additionalProperties: false }),
  ],
  { examples: [{ event: EVENT_EXAMPLE }] },
);
export const Appended = Type.Object({
  runId: Type.String(),
  accepted: Type.Integer({
    description: 'events of the request now in the chain (identical resends count, and change nothing)',
  }),
  head: Head,
});
export const Finalizing = Type.Object({
  runId: Type.String(),
  status: Type.Union([Type.Literal('finalizing'), Type.Literal('finalized')]),
  artifactId: Type.Union([Type.String(), Type.Null()]),
});

export function runView(run: RunDoc, head: ChainHead): Static<typeof RunView> {
  return {
    runId: run._id,
    status: run.status,
    verdict: run.verdict,
    artifactId: run.artifactId,
    agentId: run.agentId,
    terms: run.terms,
    ...(run.pricing ? { pricing: run.pricing } : {}),
    settlement: run.settlement as Record<string, unknown> | null,
    head,
    eventCount: head.seq,
    createdAt: run.createdAt.toISOString(),
    finalizedAt: run.finalizedAt?.toISOString() ?? null,
    finalizeError: run.finalizeError ?? null,
  };
}
