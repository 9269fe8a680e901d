// Request and response schemas of x402 payment sessions, and the views that fill them.
import { Type, type Static } from 'typebox';
import { MAX_SESSION_PAYEES, MAX_SESSION_TTL_SECONDS, type StatementCharge } from '../../domain/x402-sessions.ts';
import type { ChargeAnswer, SessionState } from '../../services/x402/sessions.ts';
import type { CloseDoc } from '../../store/x402-sessions.ts';
import { AgentId, Amount, Currency, Timestamp } from './common.ts';
import { PricingSchema } from './runs.ts';

const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$', description: 'lowercase hex SHA-256' });
const WalletId = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:-]{2,200}$' });
const PaymentId = Type.String({
  pattern: '^[A-Za-z0-9._:-]{1,128}$',
  description: "the caller's id of this paid call: the same id again is charged once and answers the first receipt",
});
const Nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()]);
const Signature = Type.Object({
  alg: Type.String(),
  keyId: Type.String(),
  value: Type.String({ description: 'Ed25519 over the hex digest, base64url' }),
});
/** An agent's signature over a usage record (checked by the service against the agent's registered keys). */
const AgentSignature = Type.Object(
  {
    alg: Type.Literal('Ed25519'),
    keyId: Type.String({ maxLength: 200 }),
    value: Type.String({ maxLength: 200, description: 'base64url Ed25519 over the bytes of sha256hex(JCS(record))' }),
  },
  { additionalProperties: false },
);
const UsageRecord = Type.Object(
  {
    schema: Type.Literal('UsageRecord.v1'),
    sessionId: Type.String({ maxLength: 128 }),
    paymentId: Type.String({ maxLength: 128 }),
    payeeAgentId: Type.String({ maxLength: 256 }),
    usage: Type.Record(Type.String({ maxLength: 64 }), Type.Number(), {
      minProperties: 1,
      maxProperties: 32,
      description:
        'metric name -> units used; each a metric the schedule prices, a non-negative safe integer (else X402_USAGE_METRIC_UNKNOWN / X402_USAGE_COUNT_INVALID)',
    }),
    requestSha256: Sha256,
    responseSha256: Sha256,
  },
  { additionalProperties: false, description: 'UsageRecord.v1: what one call used, as its payee states it' },
);
const WitnessedUsage = Type.Object({
  record: UsageRecord,
  payeeSignature: AgentSignature,
  payerSignature: Nullable(AgentSignature),
});

export const SessionParams = Type.Object({ sessionId: Type.String({ maxLength: 128 }) });

export const OpenSessionBody = Type.Object(
  {
    payerAgentId: AgentId,
    payeeAgentIds: Type.Array(AgentId, {
      minItems: 1,
      maxItems: MAX_SESSION_PAYEES,
      description: 'who the session may pay (an allow-list)',
    }),
    currency: Currency,
    budget: Type.Integer({ ...Amount, description: 'reserved from the wallet at once (integer minor units)' }),
    maxPerCall: Type.Integer({ ...Amount, description: 'the most one call may be charged' }),
    ttlSeconds: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_SESSION_TTL_SECONDS,
        default: 3600,
        description: 'after this the session closes by itself and the rest goes back',
      }),
    ),
    holdbackBps: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 10_000,
        default: 0,
        description: "held back from each payee's total at close, for the dispute window",
      }),
    ),
    disputeWindowSeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 2_592_000, default: 86_400 })),
    sponsorWalletId: Type.Optional(
      Type.String({
        ...WalletId,
        description:
          'a sponsor wallet of the tenant pays instead (its policy must allow every payee at maxPerCall, and the budget today)',
      }),
    ),
    pricing: Type.Optional(PricingSchema),
    requireAcknowledgedUsage: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'with pricing: pay each payee at close only for usage the payer acknowledged; unacknowledged usage goes back to the payer',
      }),
    ),
  },
  {
    additionalProperties: false,
    examples: [
      {
        payerAgentId: 'acme:agent:buyer',
        payeeAgentIds: ['tools:agent:search'],
        currency: 'USD',
        budget: 500,
        maxPerCall: 5,
        ttlSeconds: 3600,
      },
    ],
  },
);

export const ChargeBody = Type.Object(
  {
    paymentId: Type.Optional(PaymentId),
    payeeAgentId: AgentId,
    amount: Type.Optional(
      Type.Integer({
        ...Amount,
        description: "what this call costs (integer minor units), at most the session's maxPerCall; or send usage",
      }),
    ),
    usage: Type.Optional(
      Type.Object(
        {
          record: UsageRecord,
          payeeSignature: AgentSignature,
          payerSignature: Type.Optional(Nullable(AgentSignature)),
        },
        {
          additionalProperties: false,
          description:
            "instead of amount, on a priced session: the payee's signed usage record (and the payer's acknowledgement, if it has one); the session prices it",
        },
      ),
    ),
    requestSha256: Type.Optional(Sha256),
  },
  {
    additionalProperties: false,
    examples: [{ paymentId: 'call-0001', payeeAgentId: 'tools:agent:search', amount: 2 }],
  },
);

export const Session = Type.Object({
  sessionId: Type.String(),
  status: Type.String({ description: 'open | closing | closed | expired | wound_down | unfunded' }),
  payerAgentId: Type.String(),
  payeeAgentIds: Type.Array(Type.String()),
  walletId: Type.String({ description: 'the wallet the budget is reserved from' }),
  sponsorWalletId: Nullable(Type.String()),
  currency: Type.String(),
  budget: Type.Integer(),
  maxPerCall: Type.Integer(),
  spent: Type.Integer({ description: "charged so far (at close: the statement's total)" }),
  remaining: Type.Integer(),
  charges: Type.Integer({ description: 'calls debited so far (at close: charges in the statement)' }),
  holdbackBps: Type.Integer(),
  disputeWindowSeconds: Type.Integer(),
  expiresAt: Timestamp,
  createdAt: Timestamp,
  closedAt: Nullable(Timestamp),
  refunded: Nullable(Type.Integer({ description: 'the unspent budget returned at close' })),
  statementUrl: Nullable(Type.String()),
  pricing: Type.Optional(PricingSchema),
  pricingSha256: Type.Optional(Type.String({ description: 'sha256hex(JCS(pricing))' })),
  requireAcknowledgedUsage: Type.Optional(Type.Boolean()),
});

export const Charge = Type.Object({
  chargeId: Type.String(),
  sessionId: Type.String(),
  seq: Type.Integer(),
  paymentId: Type.String(),
  payeeAgentId: Type.String(),
  amount: Type.Integer(),
  currency: Type.String(),
  remaining: Type.Integer({ description: 'what is left of the budget' }),
  repeated: Type.Boolean({ description: 'true when this payment id was charged before: nothing new was charged' }),
  usage: Type.Optional(WitnessedUsage),
  receipt: Type.Object({
    receiptHash: Type.String(),
    signature: Signature,
    body: Type.Record(Type.String(), Type.Unknown(), {
      description: 'SessionChargeReceipt.v1; receiptHash = sha256hex(JCS(body))',
    }),
  }),
});

const StatementLine = Type.Object({
  seq: Type.Integer(),
  payeeAgentId: Type.String(),
  amount: Type.Integer(),
  paymentId: Type.String(),
  requestSha256: Nullable(Type.String()),
  chargedAt: Timestamp,
  receiptHash: Type.String(),
  usage: Type.Optional(WitnessedUsage),
});

export const Statement = Type.Object({
  statementHash: Type.String({ description: 'sha256hex(JCS(body))' }),
  signature: Signature,
  body: Type.Record(Type.String(), Type.Unknown(), {
    description: 'SessionStatement.v1; body.chargesSha256 = sha256hex(JCS(charges))',
  }),
  charges: Type.Array(StatementLine),
});

export const SessionDisputeBody = Type.Object(
  {
    payeeAgentId: AgentId,
    reason: Type.String({ minLength: 1, maxLength: 2_000 }),
    evidence: Type.Optional(Type.Unknown({ description: 'any JSON nested at most 128 deep' })),
    lines: Type.Optional(
      Type.Array(Type.Integer({ minimum: 1 }), {
        minItems: 1,
        maxItems: 256,
        description: 'statement lines (seqs) of this payee whose usage the payer never acknowledged, cited as evidence',
      }),
    ),
  },
  {
    additionalProperties: false,
    examples: [
      {
        payeeAgentId: 'tools:agent:search',
        reason: 'half of the results were empty',
        evidence: { paymentIds: ['call-0007'] },
      },
    ],
  },
);

export const SessionDisputeOpened = Type.Object({
  disputeId: Type.String(),
  status: Type.Literal('open'),
  settlementId: Type.String(),
  sessionId: Type.String(),
  payeeAgentId: Type.String(),
  frozenAmount: Type.Integer({
    description: "the payee's holdback, frozen until the ruling (POST /ops/disputes/{disputeId}/resolve)",
  }),
  lines: Type.Optional(Type.Array(Type.Integer(), { description: 'the statement lines cited' })),
});

export const AcknowledgementsBody = Type.Object(
  {
    acknowledgements: Type.Array(
      Type.Object(
        {
          paymentId: PaymentId,
          payerSignature: AgentSignature,
        },
        { additionalProperties: false },
      ),
      { minItems: 1, maxItems: 256 },
    ),
  },
  {
    additionalProperties: false,
    examples: [
      {
        acknowledgements: [
          {
            paymentId: 'call-0001',
            payerSignature: { alg: 'Ed25519', keyId: 'key_3f2a9c1e', value: 'base64url-signature-over-the-digest' },
          },
        ],
      },
    ],
  },
);

export const Acknowledgements = Type.Object({
  acknowledgements: Type.Array(
    Type.Object({ paymentId: Type.String(), seq: Type.Integer(), acknowledged: Type.Literal(true) }),
  ),
});

export function sessionView(s: SessionState): Static<typeof Session> {
  const { session } = s;
  const body = s.close?.statement.body;
  return {
    sessionId: session._id,
    status: s.status,
    payerAgentId: session.payerAgentId,
    payeeAgentIds: session.payeeAgentIds,
    walletId: session.walletId,
    sponsorWalletId: session.sponsorWalletId,
    currency: session.currency,
    budget: session.budget,
    maxPerCall: session.maxPerCall,
    spent: s.spent,
    remaining: s.status === 'open' ? session.budget - s.spent : 0,
    charges: s.charges,
    holdbackBps: session.holdbackBps,
    disputeWindowSeconds: session.disputeWindowSeconds,
    expiresAt: session.expiresAt.toISOString(),
    createdAt: session.createdAt.toISOString(),
    closedAt: s.close ? s.close.at.toISOString() : null,
    refunded: body ? body.refunded : null,
    statementUrl: s.close ? `/x402/sessions/${session._id}/statement` : null,
    ...(session.pricing
      ? {
          pricing: session.pricing,
          pricingSha256: session.pricingSha256!,
          requireAcknowledgedUsage: session.requireAcknowledgedUsage ?? false,
        }
      : {}),
  };
}

export function chargeView(a: ChargeAnswer): Static<typeof Charge> {
  return {
    chargeId: a.charge._id,
    sessionId: a.charge.sessionId,
    seq: a.charge.seq,
    paymentId: a.charge.paymentId!,
    payeeAgentId: a.charge.payeeAgentId!,
    amount: a.charge.amount,
    currency: a.receipt.body.currency,
    remaining: a.remaining,
    repeated: a.repeated,
    ...(a.charge.usage ? { usage: a.charge.usage } : {}),
    receipt: { receiptHash: a.receipt.receiptHash, signature: a.receipt.signature, body: { ...a.receipt.body } },
  };
}

export function statementView(close: CloseDoc, charges: StatementCharge[]): Static<typeof Statement> {
  const { body, statementHash, signature } = close.statement;
  return { statementHash, signature, body: { ...body }, charges };
}
