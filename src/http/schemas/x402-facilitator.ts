// Request and response schemas of the x402 v2 facilitator API (`/x402/facilitator/*`), as stock x402 clients send
// and read them. Fields the protocol may grow are let through (no additionalProperties: false on its objects).
import { Type } from 'typebox';

const PaymentRequirements = Type.Object({
  scheme: Type.String({ maxLength: 64 }),
  network: Type.String({
    maxLength: 80,
    description:
      "CAIP-2 network id: this deployment's `agentstl:<deployment>` (a legacy `agent-settlement:<deployment>` id is accepted during its deprecation window); any other is refused with invalid_network",
  }),
  asset: Type.String({ maxLength: 64, description: 'the currency' }),
  amount: Type.String({ pattern: '^[0-9]{1,16}$', description: 'integer minor units, as a decimal string' }),
  payTo: Type.String({ maxLength: 256, description: 'the payee agent id' }),
  maxTimeoutSeconds: Type.Integer({ minimum: 0 }),
  extra: Type.Record(Type.String(), Type.Unknown(), {
    description: 'escrow-gate: method and resource (the request binding), holdbackBps, disputeWindowSeconds',
  }),
});

const PaymentPayload = Type.Object({
  x402Version: Type.Integer(),
  resource: Type.Optional(Type.Object({ url: Type.String({ maxLength: 4096 }) })),
  accepted: PaymentRequirements,
  payload: Type.Record(Type.String(), Type.Unknown(), {
    description: 'escrow-gate: {token, gateId, quoteId, requestSha256, responseSha256?}',
  }),
  extensions: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
});

const REQUIREMENTS_EXAMPLE = {
  scheme: 'escrow-gate',
  network: 'agentstl:default',
  asset: 'USD',
  amount: '25',
  payTo: 'tools:agent:weather',
  maxTimeoutSeconds: 120,
  extra: {
    method: 'GET',
    resource: 'https://tools.example/weather/forecast?city=Lisbon',
    holdbackBps: 500,
    disputeWindowSeconds: 3600,
  },
};
export const FacilitatorBody = Type.Object(
  { x402Version: Type.Integer(), paymentPayload: PaymentPayload, paymentRequirements: PaymentRequirements },
  {
    examples: [
      {
        x402Version: 2,
        paymentPayload: {
          x402Version: 2,
          resource: { url: 'https://tools.example/weather/forecast?city=Lisbon' },
          accepted: REQUIREMENTS_EXAMPLE,
          payload: {
            token: 'eyJhbGciOiJFZERTQSJ9.payment-token-from-authorize-payment',
            gateId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
            quoteId: 'quo_6tY3uI8oP1aS4dF7gH2jK5lZ',
            requestSha256: '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',
          },
        },
        paymentRequirements: REQUIREMENTS_EXAMPLE,
      },
    ],
  },
);

export const VerifyResponse = Type.Object({
  isValid: Type.Boolean(),
  invalidReason: Type.Optional(
    Type.String({
      description:
        'snake_case, e.g. payment_already_settled, invalid_signature, payee_mismatch, amount_mismatch, request_binding_mismatch, quote_expired, unsupported_scheme',
    }),
  ),
  invalidMessage: Type.Optional(Type.String()),
  payer: Type.Optional(Type.String()),
});

const WORDS =
  "x402's settlement status words: settled (the payee was paid what was charged; final), failed (it was not, and this answer will not change; final), unresolved (still being decided, or not yet settled: never final, ask again)";
const settlementWord = (description: string) =>
  Type.Union([Type.Literal('settled'), Type.Literal('failed'), Type.Literal('unresolved')], { description });
const SettlementWord = settlementWord(
  `${WORDS}. From success and errorReason: success is settled, settlement_pending unresolved, any other reason failed`,
);

export const SettleResponse = Type.Object({
  success: Type.Boolean(),
  status: SettlementWord,
  errorReason: Type.Optional(Type.String()),
  errorMessage: Type.Optional(Type.String()),
  payer: Type.Optional(Type.String()),
  transaction: Type.String({ description: 'the settlement id (empty when nothing was settled)' }),
  network: Type.String(),
  amount: Type.Optional(
    Type.String({
      description:
        "settled only: what was charged (the amount actually settled), in minor units: the requirement's amount, which a metered call (settlement override) may set below the authorized maximum",
    }),
  ),
  settledAt: Type.Optional(
    Type.String({
      format: 'date-time',
      description:
        "settled only: when (escrow-gate: the settlement's decision, with which the release is recorded; escrow-session: the charge)",
    }),
  ),
  extra: Type.Optional(
    Type.Union([
      Type.Object(
        {
          gateId: Type.String(),
          status: Type.String({
            description:
              'released, or settling while the decision is being recorded; refunded when a metered call charged 0 (all of it back with the payer)',
          }),
          releasedNow: Type.Union([Type.Integer(), Type.Null()]),
          holdback: Type.Union([Type.Integer(), Type.Null()]),
          receiptHash: Type.Union([Type.String(), Type.Null()]),
        },
        { title: 'EscrowGateSettlement' },
      ),
      Type.Object(
        {
          sessionId: Type.String(),
          paymentId: Type.String(),
          seq: Type.Integer({ description: "the charge's number in its session (transaction = `<sessionId>#<seq>`)" }),
          remaining: Type.Integer({ description: "what is left of the session's budget" }),
          receiptHash: Type.String({ description: "of the charge's signed receipt (SessionChargeReceipt.v1)" }),
          usage: Type.Optional(
            Type.Object(
              {
                record: Type.Record(Type.String(), Type.Unknown(), { description: 'UsageRecord.v1' }),
                payeeSignature: Type.Record(Type.String(), Type.Unknown()),
              },
              {
                description:
                  "a charge priced from witnessed usage: the payee's signed record, for the payer to check against the response and acknowledge",
              },
            ),
          ),
        },
        { title: 'EscrowSessionCharge' },
      ),
    ]),
  ),
});

const DeprecatedNetwork = Type.Object({
  network: Type.String({ description: 'a legacy network id (not CAIP-2) still accepted on payments of this kind' }),
  acceptedUntil: Type.String({
    format: 'date-time',
    description: 'after this time a payment naming it is refused with invalid_network',
  }),
  replacedBy: Type.String({ description: 'the CAIP-2 id to name instead' }),
});

export const SupportedResponse = Type.Object(
  {
    kinds: Type.Array(
      Type.Object({
        x402Version: Type.Integer(),
        scheme: Type.String(),
        network: Type.String({ description: 'CAIP-2: `agentstl:<deployment>`' }),
        extra: Type.Optional(
          Type.Object({
            deprecatedNetworks: Type.Array(DeprecatedNetwork, {
              description: 'the deprecation announcement: old ids accepted for a window, never listed as kinds',
            }),
          }),
        ),
      }),
    ),
    extensions: Type.Array(Type.String()),
    signers: Type.Record(Type.String(), Type.Array(Type.String())),
  },
  {
    examples: [
      {
        kinds: ['escrow-gate', 'escrow-session'].map((scheme) => ({
          x402Version: 2,
          scheme,
          network: 'agentstl:default',
          extra: {
            deprecatedNetworks: [
              {
                network: 'agent-settlement:default',
                acceptedUntil: '2027-06-01T00:00:00.000Z',
                replacedBy: 'agentstl:default',
              },
            ],
          },
        })),
        extensions: [],
        signers: {},
      },
    ],
  },
);

export const PaymentParams = Type.Object({
  paymentId: Type.String({
    maxLength: 258,
    description:
      "an escrow-gate payment's id: its gateId (paymentPayload.payload.gateId); an escrow-session payment's: `<sessionId>:<paymentId>` from its payload",
  }),
});

export const PaymentStatusResponse = Type.Object(
  {
    paymentId: Type.String(),
    status: Type.Union(
      [
        Type.Literal('unknown'),
        Type.Literal('authorized'),
        Type.Literal('settling'),
        Type.Literal('settled'),
        Type.Literal('refused'),
      ],
      {
        description:
          "unknown: no such payment for this credential (another tenant's too), or none was ever authorized; authorized: paid for, never settled (safe to settle now, until settleBy); settling: reported, the decision is in flight (ask again; a settle answers the same); settled: the payee was paid what was charged; refused: refunded, expired, cancelled or failed (settlement.errorReason says why)",
      },
    ),
    settlementStatus: settlementWord(
      `${WORDS}. From status: settled is settled, refused failed; unknown, authorized and settling are unresolved`,
    ),
    settledAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'settled only: when the payment was settled',
    }),
    settledAmount: Type.Union([Type.String(), Type.Null()], {
      description: 'settled only: what was charged, in minor units',
    }),
    settleBy: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'authorized only: the last moment a settle is accepted; after it the payer is refunded',
    }),
    settlement: Type.Union([SettleResponse, Type.Null()], {
      description: 'settled or refused: the answer settle gave, and gives to any repeat',
    }),
  },
  {
    examples: [
      {
        paymentId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
        status: 'settled',
        settlementStatus: 'settled',
        settledAt: '2026-11-28T09:00:00.000Z',
        settledAmount: '25',
        settleBy: null,
        settlement: {
          success: true,
          status: 'settled',
          settledAt: '2026-11-28T09:00:00.000Z',
          payer: 'acme:agent:buyer',
          transaction: 'stl_2hX7kQ9mW4pZ1vB8nT6rL3cY',
          network: 'agentstl:default',
          amount: '25',
          extra: {
            gateId: 'gate_2hX7kQ9mW4pZ1vB8nT6rL3cY',
            status: 'released',
            releasedNow: 24,
            holdback: 1,
            receiptHash: '5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8',
          },
        },
      },
    ],
  },
);
