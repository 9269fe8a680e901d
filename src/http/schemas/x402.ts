// Request and response schemas of the x402 payment gate (contract section 8), and the views that fill them.
import { Type, type Static } from 'typebox';
import { MAX_AMOUNT } from '../../domain/money.ts';
import { DEFAULT_ESCALATION_TIMEOUT_SECONDS, MAX_QUOTE_TTL_SECONDS } from '../../domain/x402.ts';
import type { EscalationState, GateState, PaymentAuthorization, QuoteResult } from '../../services/x402/service.ts';
import { deadlineOf, deciderName, escalationStatus, type BulkOutcome } from '../../services/x402/service.ts';
import type { PolicyVersionDoc, WindDownSummary as WindDownSummaryDoc } from '../../store/x402.ts';
import { AgentId, Amount, Currency, Timestamp } from './common.ts';

const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$', description: 'lowercase hex SHA-256' });
const ToolId = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$' });
const WalletId = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:-]{2,200}$' });
const Id = Type.String({ maxLength: 128 });

export const GateParams = Type.Object({ gateId: Id });
export const WalletParams = Type.Object({ walletId: WalletId });
export const EscalationParams = Type.Object({ escalationId: Id });
export const AgentParams = Type.Object({ agentId: AgentId });

export const CreateGateBody = Type.Object(
  {
    payerAgentId: AgentId,
    payeeAgentId: AgentId,
    amount: Amount,
    currency: Currency,
    holdbackBps: Type.Optional(Type.Integer({ minimum: 0, maximum: 10_000, default: 0 })),
    disputeWindowSeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 2_592_000, default: 86_400 })),
    toolId: Type.Optional(ToolId),
    sponsorWalletId: Type.Optional(
      Type.String({
        ...WalletId,
        description: "a sponsor wallet of the tenant: it pays, so its escrow is locked instead of the payer's",
      }),
    ),
    runId: Type.Optional(
      Type.String({
        pattern: '^run_[A-Za-z0-9_-]{1,120}$',
        description:
          "The run of this tenant the payment is for (`run_…`): the gate's settlement events name it beside the gate. Unknown or another tenant's: 404.",
      }),
    ),
    test: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'Test traffic (e.g. the onboarding first paid call): the money moves as usual, and the gate\'s events carry `"test": true` and are delivered only to webhook endpoints created with `includeTestEvents`. Default false.',
      }),
    ),
  },
  {
    additionalProperties: false,
    examples: [
      {
        payerAgentId: 'acme:agent:buyer',
        payeeAgentId: 'tools:agent:weather',
        amount: 25,
        currency: 'USD',
        holdbackBps: 500,
        disputeWindowSeconds: 3600,
        toolId: 'weather/forecast',
      },
    ],
  },
);

export const QuoteBody = Type.Object(
  {
    gateId: Id,
    requestSha256: Sha256,
    ttlSeconds: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_QUOTE_TTL_SECONDS, default: 300 })),
  },
  {
    additionalProperties: false,
    examples: [
      {
        gateId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
        requestSha256: '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',
        ttlSeconds: 120,
      },
    ],
  },
);

const OnBreach = Type.Union([Type.Literal('escalate'), Type.Literal('refuse')], {
  description:
    "what a call over a limit (currency, perCallLimit, dailyLimit, allowed payees or tools) gets: `escalate` raises an escalation a person approves or denies (409 `X402_AUTHORIZATION_ESCALATION_REQUIRED`), `refuse` answers 409 `X402_WALLET_POLICY_VIOLATION`. Default: `escalate` for an agent's own wallet (the payer's), `refuse` for a sponsor wallet. A sponsor wallet that escalates is approved in place of its decision: authorize-payment then takes the override token instead of the walletDecisionToken. Payment sessions never escalate: a sponsor's refusal there stays a refusal",
});

export const PolicyBody = Type.Object(
  {
    currency: Currency,
    perCallLimit: Type.Optional(Amount),
    dailyLimit: Type.Optional(
      Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER, description: 'authorized minor units per UTC day' }),
    ),
    allowedPayeeAgentIds: Type.Optional(Type.Array(AgentId, { maxItems: 1000, uniqueItems: true })),
    allowedToolIds: Type.Optional(Type.Array(ToolId, { maxItems: 1000, uniqueItems: true })),
    escalationTimeoutSeconds: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 7 * 86_400,
        description: `how long an escalation this policy raises waits for a person before it is denied by itself (deadline_passed) and its reserve returned; default ${DEFAULT_ESCALATION_TIMEOUT_SECONDS}`,
      }),
    ),
    onBreach: Type.Optional(OnBreach),
  },
  {
    additionalProperties: false,
    examples: [
      {
        currency: 'USD',
        perCallLimit: 100,
        dailyLimit: 5000,
        allowedPayeeAgentIds: ['tools:agent:weather'],
        allowedToolIds: ['weather/forecast'],
        escalationTimeoutSeconds: 900,
      },
    ],
  },
);

export const WalletAuthorizeBody = Type.Object(
  { gateId: Id, quoteId: Id, requestSha256: Sha256 },
  {
    additionalProperties: false,
    examples: [
      {
        gateId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
        quoteId: 'quo_6tY3uI8oP1aS4dF7gH2jK5lZ',
        requestSha256: '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',
      },
    ],
  },
);

export const AuthorizePaymentBody = Type.Object(
  {
    gateId: Id,
    quoteId: Id,
    requestSha256: Sha256,
    walletDecisionToken: Type.Optional(Type.String({ maxLength: 4096 })),
    escalationOverrideToken: Type.Optional(Type.String({ maxLength: 4096 })),
  },
  {
    additionalProperties: false,
    examples: [
      {
        gateId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
        quoteId: 'quo_6tY3uI8oP1aS4dF7gH2jK5lZ',
        requestSha256: '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',
      },
    ],
  },
);

export const VerifyBody = Type.Object(
  {
    gateId: Id,
    evidence: Type.Object(
      { responseSha256: Sha256, providerSignature: Type.Optional(Type.String({ maxLength: 4096 })) },
      { additionalProperties: false },
    ),
    verificationStatus: Type.Optional(
      Type.Union([Type.Literal('verified'), Type.Literal('failed')], {
        description: 'default verified; failed refunds the payer',
      }),
    ),
    amount: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_AMOUNT,
        description:
          "metered capture: what the call actually cost, in minor units, at most the gate's amount (above: 422 X402_CAPTURE_EXCEEDS_AUTHORIZATION); default the whole amount. The holdback applies to it and the rest goes back to the payer at once; 0 charges nothing. Verified calls only. The first report wins",
      }),
    ),
  },
  {
    additionalProperties: false,
    examples: [
      {
        gateId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
        evidence: { responseSha256: '2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae' },
        verificationStatus: 'verified',
        amount: 18,
      },
    ],
  },
);

export const EscalationQuery = Type.Object({
  status: Type.Optional(Type.Union([Type.Literal('pending'), Type.Literal('approved'), Type.Literal('denied')])),
  gateId: Type.Optional(Id),
  agentId: Type.Optional(AgentId),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ pattern: '^[0-9]{1,15}$' })),
});

export const ResolveBody = Type.Object(
  {
    action: Type.Union([Type.Literal('approve'), Type.Literal('deny')]),
    reason: Type.Optional(Type.String({ maxLength: 2000 })),
  },
  {
    additionalProperties: false,
    examples: [{ action: 'approve', reason: 'One-off forecast for the quarterly report' }],
  },
);

export const WindDownBody = Type.Object(
  {
    reasonCode: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_.:-]{1,64}$' })),
    reasonMessage: Type.Optional(Type.String({ maxLength: 2000 })),
  },
  {
    additionalProperties: false,
    examples: [{ reasonCode: 'decommissioned', reasonMessage: 'Replaced by acme:agent:buyer-v2' }],
  },
);

const PaymentRequirements = Type.Object({
  scheme: Type.String(),
  network: Type.String({ description: 'CAIP-2 style network id' }),
  amount: Type.String({ description: 'integer minor units, as a decimal string' }),
  asset: Type.String({ description: 'the currency' }),
  payTo: Type.String({ description: 'the payee agent id' }),
  maxTimeoutSeconds: Type.Integer(),
  extra: Type.Record(Type.String(), Type.Unknown()),
});

export const Quote = Type.Object({
  quoteId: Type.String(),
  gateId: Type.String(),
  quoteSha256: Type.String(),
  requestSha256: Type.String(),
  amount: Type.Integer(),
  currency: Type.String(),
  expiresAt: Timestamp,
  paymentRequirements: PaymentRequirements,
  paymentRequired: Type.String({
    description: 'base64 of {x402Version:2, resource, accepts:[paymentRequirements]}: a PAYMENT-REQUIRED header value',
  }),
});

const Reserve = Type.Object({ amount: Type.Integer(), currency: Type.String(), status: Type.Literal('reserved') });

export const Authorization = Type.Object({
  authorizationRef: Type.String(),
  token: Type.String({ description: 'compact JWS (EdDSA); verify with /.well-known/jwks.json' }),
  tokenKid: Type.String(),
  expiresAt: Timestamp,
  reserve: Reserve,
});

const Receipt = Type.Object({
  receiptHash: Type.String(),
  signature: Type.Object({ alg: Type.String(), keyId: Type.String(), value: Type.String() }),
  body: Type.Record(Type.String(), Type.Unknown(), {
    description: 'SettlementReceipt.v1; receiptHash = sha256hex(JCS(body))',
  }),
});

const Nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()]);

export const Gate = Type.Object({
  gateId: Type.String(),
  status: Type.String({
    description:
      'held | authorized | settling | released | refunded | cancelled | expired | unfunded; expired: nobody authorized it within the gate TTL, or nobody reported the authorized call by its deadline (the payer is refunded)',
  }),
  payerAgentId: Type.String(),
  payeeAgentId: Type.String(),
  escrowWalletId: Type.String(),
  sponsorWalletId: Nullable(Type.String()),
  toolId: Nullable(Type.String()),
  amount: Type.Integer(),
  currency: Type.String(),
  holdbackBps: Type.Integer(),
  disputeWindowSeconds: Type.Integer(),
  runId: Nullable(Type.String({ description: 'The run the payment is for, when the gate was created for one' })),
  test: Type.Boolean({
    description: 'Test traffic: its events are marked `"test": true` and go only to endpoints that include test events',
  }),
  createdAt: Timestamp,
  quote: Nullable(
    Type.Object({
      quoteId: Type.String(),
      requestSha256: Type.String(),
      quoteSha256: Type.String(),
      expiresAt: Timestamp,
      status: Type.String({ description: 'live | expired | used | cancelled' }),
    }),
  ),
  authorization: Nullable(
    Type.Object({
      authorizationRef: Type.String(),
      quoteId: Type.String(),
      requestSha256: Type.String(),
      tokenKid: Type.String(),
      expiresAt: Timestamp,
      reserve: Reserve,
    }),
  ),
  verification: Nullable(
    Type.Object({
      verificationStatus: Type.String({
        description:
          "verified | failed (the provider's report) | expired | wound_down (the gate was returned: no report may come any more)",
      }),
      responseSha256: Nullable(Type.String({ description: 'null when the gate was returned without a report' })),
      capturedAmount: Nullable(
        Type.Integer({
          description:
            "what the reported call cost (the gate's amount unless metered); null when nothing was charged (failed, or returned)",
        }),
      ),
      at: Timestamp,
    }),
  ),
  settlement: Nullable(
    Type.Object({
      settlementId: Type.String(),
      status: Type.String(),
      releasedAmount: Type.Integer(),
      refundedAmount: Type.Integer(),
      holdback: Type.Integer(),
      holdbackState: Type.String(),
      disputeWindowEndsAt: Nullable(Timestamp),
    }),
  ),
  decision: Nullable(Type.Object({ verdict: Type.String(), reason: Nullable(Type.String()), decidedAt: Timestamp })),
  receipt: Nullable(Receipt),
});

export const VerifyResult = Type.Intersect([Gate, Type.Object({ statusUrl: Type.String() })]);

export const Policy = Type.Object({
  walletId: Type.String(),
  version: Type.Integer(),
  currency: Type.String(),
  perCallLimit: Nullable(Type.Integer()),
  dailyLimit: Nullable(Type.Integer()),
  allowedPayeeAgentIds: Nullable(Type.Array(Type.String())),
  allowedToolIds: Nullable(Type.Array(Type.String())),
  escalationTimeoutSeconds: Type.Integer(),
  onBreach: OnBreach,
  updatedAt: Timestamp,
});

export const WalletDecision = Type.Object({ walletDecisionToken: Type.String(), expiresAt: Timestamp });

export const Escalation = Type.Object({
  escalationId: Type.String(),
  status: Type.Union([Type.Literal('pending'), Type.Literal('approved'), Type.Literal('denied')]),
  gateId: Type.String(),
  quoteId: Type.String(),
  requestSha256: Type.String(),
  walletId: Type.String(),
  payerAgentId: Type.String(),
  payeeAgentId: Type.String(),
  amount: Type.Integer(),
  currency: Type.String(),
  rule: Type.String(),
  details: Type.Record(Type.String(), Type.Unknown()),
  createdAt: Timestamp,
  deadlineAt: { ...Timestamp, description: 'when it is denied by itself (reason deadline_passed) if nobody decides' },
  resolution: Nullable(
    Type.Object({
      action: Type.String(),
      reason: Nullable(Type.String()),
      by: Type.String({
        description:
          'who decided: an API key id, admin, deadline, wind-down:<agentId> (tenant: decided before deciders were recorded)',
      }),
      at: Timestamp,
    }),
  ),
});

export const EscalationPage = Type.Object({ items: Type.Array(Escalation), nextCursor: Nullable(Type.String()) });

export const BulkResolveBody = Type.Object(
  {
    action: Type.Union([Type.Literal('approve'), Type.Literal('deny')]),
    reason: Type.String({ minLength: 1, maxLength: 2000 }),
    escalationIds: Type.Array(Id, {
      minItems: 1,
      maxItems: 100,
      description: 'the escalations to decide, e.g. the rows a person selected in a filtered list',
    }),
  },
  {
    additionalProperties: false,
    examples: [
      {
        action: 'deny',
        reason: 'Unknown payee; ask the team first',
        escalationIds: ['esc_3f1a9c0b2d4e5f60718293a4b5c6d7e8'],
      },
    ],
  },
);

export const BulkResolved = Type.Object({
  results: Type.Array(
    Type.Object({
      escalationId: Type.String(),
      outcome: Type.Union([
        Type.Literal('approved'),
        Type.Literal('denied'),
        Type.Literal('already_decided'),
        Type.Literal('deadline_passed'),
        Type.Literal('not_found'),
      ]),
      message: Type.Optional(Type.String()),
      escalation: Type.Optional(Escalation),
      escalationOverrideToken: Type.Optional(
        Nullable(Type.String({ description: 'approve only: present it once to authorize-payment' })),
      ),
      overrideExpiresAt: Type.Optional(Nullable(Timestamp)),
    }),
  ),
});

export function bulkResolvedView(outcomes: BulkOutcome[]): Static<typeof BulkResolved> {
  return {
    results: outcomes.map((o) =>
      'state' in o
        ? {
            escalationId: o.escalationId,
            outcome: o.outcome,
            escalation: escalationView(o.state),
            escalationOverrideToken: o.escalationOverrideToken,
            overrideExpiresAt: o.overrideExpiresAt?.toISOString() ?? null,
          }
        : { escalationId: o.escalationId, outcome: o.outcome, message: o.message },
    ),
  };
}

export const Resolved = Type.Intersect([
  Escalation,
  Type.Object({
    escalationOverrideToken: Nullable(
      Type.String({ description: 'approve only: present it once to authorize-payment' }),
    ),
    overrideExpiresAt: Nullable(Timestamp),
  }),
]);

export const WindDownSummary = Type.Object({
  agentId: Type.String(),
  status: Type.Literal('wound_down'),
  reasonCode: Nullable(Type.String()),
  reasonMessage: Nullable(Type.String()),
  woundDownAt: Timestamp,
  gatesCancelled: Type.Array(Type.String()),
  gatesLeftReserved: Type.Array(Type.String({ description: 'authorized gates: they settle on verification' })),
  quotesCancelled: Type.Array(Type.String()),
  escalationsDenied: Type.Array(Type.String()),
  sessionsClosed: Type.Optional(
    Type.Array(
      Type.String({
        description: 'payment sessions closed: their unspent budget went back, their charges were settled',
      }),
    ),
  ),
  escrowReturned: Type.Array(Type.Object({ walletId: Type.String(), currency: Type.String(), amount: Type.Integer() })),
});

export function gateView(st: GateState, now = new Date()): Static<typeof Gate> {
  const { gate: g, commitment, verification, quote, settlement } = st;
  const authorization = commitment?.kind === 'authorization' ? commitment : null;
  const decision = settlement?.facts.decision ?? null;
  const quoteStatus = (q: NonNullable<typeof quote>) =>
    st.status === 'cancelled'
      ? 'cancelled'
      : authorization?.quoteId === q._id
        ? 'used'
        : q.expiresAt > now
          ? 'live'
          : 'expired';
  return {
    gateId: g._id,
    status: st.status,
    payerAgentId: g.payerAgentId,
    payeeAgentId: g.payeeAgentId,
    escrowWalletId: g.escrowWalletId,
    sponsorWalletId: g.sponsorWalletId,
    toolId: g.toolId,
    amount: g.amount,
    currency: g.currency,
    holdbackBps: g.holdbackBps,
    disputeWindowSeconds: g.disputeWindowSeconds,
    runId: g.runId ?? null,
    test: g.test === true,
    createdAt: g.createdAt.toISOString(),
    quote: quote
      ? {
          quoteId: quote._id,
          requestSha256: quote.requestSha256,
          quoteSha256: quote.quoteSha256,
          expiresAt: quote.expiresAt.toISOString(),
          status: quoteStatus(quote),
        }
      : null,
    authorization: authorization
      ? {
          authorizationRef: authorization.authorizationRef,
          quoteId: authorization.quoteId,
          requestSha256: authorization.requestSha256,
          tokenKid: authorization.tokenKid,
          expiresAt: authorization.expiresAt.toISOString(),
          reserve: { amount: g.amount, currency: g.currency, status: 'reserved' as const },
        }
      : null,
    verification: verification
      ? {
          verificationStatus: verification.verificationStatus,
          responseSha256: verification.evidence.responseSha256,
          capturedAmount: verification.verificationStatus === 'verified' ? (verification.captured ?? g.amount) : null,
          at: verification.at.toISOString(),
        }
      : null,
    settlement: settlement
      ? {
          settlementId: settlement.doc._id,
          status: settlement.view.status,
          releasedAmount: settlement.view.releasedAmount,
          refundedAmount: settlement.view.refundedAmount,
          holdback: settlement.view.holdback,
          holdbackState: settlement.view.holdbackState,
          disputeWindowEndsAt: settlement.view.disputeWindowEndsAt,
        }
      : null,
    decision: decision ? { verdict: decision.verdict, reason: decision.reason, decidedAt: decision.decidedAt } : null,
    receipt: decision
      ? {
          receiptHash: decision.receipt.receiptHash,
          signature: decision.receipt.signature,
          body: decision.receipt.body as unknown as Record<string, unknown>,
        }
      : null,
  };
}

export function quoteView(r: QuoteResult): Static<typeof Quote> {
  return {
    quoteId: r.quote._id,
    gateId: r.gate._id,
    quoteSha256: r.quote.quoteSha256,
    requestSha256: r.quote.requestSha256,
    amount: r.gate.amount,
    currency: r.gate.currency,
    expiresAt: r.quote.expiresAt.toISOString(),
    paymentRequirements: r.paymentRequirements,
    paymentRequired: r.paymentRequired,
  };
}

export function authorizationView(a: PaymentAuthorization): Static<typeof Authorization> {
  return { ...a, expiresAt: a.expiresAt.toISOString() };
}

export function policyView(p: PolicyVersionDoc): Static<typeof Policy> {
  return {
    walletId: p.walletId,
    version: p.version,
    ...p.policy,
    escalationTimeoutSeconds: p.policy.escalationTimeoutSeconds ?? DEFAULT_ESCALATION_TIMEOUT_SECONDS,
    // Filled in by the service from the wallet's kind for a version written before onBreach existed.
    onBreach: p.policy.onBreach ?? 'escalate',
    updatedAt: p.at.toISOString(),
  };
}

export function escalationView(e: EscalationState): Static<typeof Escalation> {
  const { escalation: x, resolution: r } = e;
  const { rule, ...details } = x.breach;
  return {
    escalationId: x._id,
    status: escalationStatus(e),
    gateId: x.gateId,
    quoteId: x.quoteId,
    requestSha256: x.requestSha256,
    walletId: x.walletId,
    payerAgentId: x.payerAgentId,
    payeeAgentId: x.payeeAgentId,
    amount: x.amount,
    currency: x.currency,
    rule,
    details,
    createdAt: x.createdAt.toISOString(),
    deadlineAt: deadlineOf(x).toISOString(),
    resolution: r ? { action: r.action, reason: r.reason, by: deciderName(r.by), at: r.at.toISOString() } : null,
  };
}

export function windDownView(s: WindDownSummaryDoc): Static<typeof WindDownSummary> {
  return s;
}
