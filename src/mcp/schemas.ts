// zod shapes of the tools' inputs and outputs. Output objects are loose: the tools pass the service's answers
// through, and a field the service adds later must not make a client reject the result.
import { z } from 'zod';

export const IdempotencyKey = z
  .string()
  .regex(/^[A-Za-z0-9._:-]{1,255}$/)
  .optional()
  .describe(
    'sent as the Idempotency-Key header: repeating the call with the same key and input replays the first answer',
  );
export const KeyFilePath = z
  .string()
  .min(1)
  .optional()
  .describe('path of the local agent key file; default ~/.agent-settlement/keys/<tenantId>.json');

export const AgentId = z.string().min(1).max(256).describe('<namespace>:agent:<id>');
export const Amount = z
  .number()
  .int()
  .min(1)
  .max(Number.MAX_SAFE_INTEGER)
  .describe('integer minor units (cents for USD)');
export const Currency = z
  .string()
  .regex(/^[A-Z][A-Z0-9]{2,11}$/)
  .describe('e.g. USD, USDC');
export const Sha256Hex = z
  .string()
  .regex(/^[0-9a-f]{64}$/)
  .describe('lowercase hex SHA-256');
const HoldbackBps = z
  .number()
  .int()
  .min(0)
  .max(10_000)
  .optional()
  .describe('share kept in escrow until the dispute window ends, in basis points (default 0)');
const DisputeWindowSeconds = z.number().int().min(0).max(2_592_000).optional().describe('default 86400');

export const Terms = z
  .record(
    z.string().regex(/^[A-Za-z][A-Za-z0-9_]{0,63}$/),
    z.union([z.strictObject({ min: z.number() }), z.strictObject({ max: z.number() })]),
  )
  .describe('metric name -> {min} | {max}, e.g. {"accuracy":{"min":0.9},"latencyP95":{"max":800}}');

export const SettlementTerms = z.strictObject({
  payerAgentId: AgentId,
  amount: Amount,
  currency: Currency,
  holdbackBps: HoldbackBps,
  disputeWindowSeconds: DisputeWindowSeconds,
});

export const GateCreateInput = {
  payerAgentId: AgentId,
  payeeAgentId: AgentId.describe('must differ from the payer'),
  amount: Amount,
  currency: Currency,
  holdbackBps: HoldbackBps,
  disputeWindowSeconds: DisputeWindowSeconds,
  toolId: z.string().min(1).max(256).optional(),
  sponsorWalletId: z
    .string()
    .min(1)
    .max(256)
    .optional()
    .describe('a sponsor wallet whose policy must authorize the payment'),
  idempotencyKey: IdempotencyKey,
};

export const EventInput = z.strictObject({
  type: z
    .string()
    .regex(/^[A-Za-z][A-Za-z0-9_.:-]{0,63}$/)
    .describe('metric {name, value} | sample {latencyMs?, correct?} | any other type kept as evidence'),
  payload: z.unknown().describe('any JSON value'),
  id: z
    .string()
    .regex(/^evt_[A-Za-z0-9_-]{1,128}$/)
    .optional()
    .describe('evt_…; generated when absent'),
});

const Head = z.object({ seq: z.number().int(), chainHash: z.string().nullable() });

export const ToolError = z.object({
  code: z.string().describe("the service's error code (UPPER_SNAKE), or SERVICE_UNREACHABLE"),
  message: z.string(),
  status: z.number().int().optional().describe('HTTP status of the failed call'),
  details: z.record(z.string(), z.unknown()).optional(),
  requestId: z.string().optional(),
});

export const Outputs = {
  whoami: {
    tenantId: z.string(),
    keyId: z.string(),
    scopes: z.array(z.string()),
    serviceBaseUrl: z.string(),
    health: z.looseObject({ status: z.string(), checks: z.record(z.string(), z.boolean()).optional() }),
  },
  registerAgent: {
    agentId: z.string(),
    keyId: z.string(),
    status: z.string(),
    createdAt: z.string(),
    keyFile: z.string().describe('where the private key is stored (never returned)'),
  },
  run: {
    runId: z.string(),
    status: z.string().describe('in_progress | finalizing | finalized'),
    verdict: z.string().nullable(),
    artifactId: z.string().nullable(),
    agentId: z.string(),
    head: Head,
    settlement: z.record(z.string(), z.unknown()).nullable(),
  },
  appended: {
    runId: z.string(),
    accepted: z.number().int(),
    head: Head,
    eventIds: z.array(z.string()),
  },
  finalizing: { runId: z.string(), status: z.string(), artifactId: z.string().nullable() },
  verification: {
    verified: z.boolean(),
    checks: z.record(z.string(), z.boolean()),
    runId: z.string(),
    artifactId: z.string(),
    verdict: z.string().nullable(),
  },
  settleAccepted: { runId: z.string(), settlementId: z.string(), status: z.string() },
  settlement: {
    settlementId: z.string(),
    runId: z.string(),
    status: z.string(),
    amount: z.number().int(),
    releasedAmount: z.number().int(),
    refundedAmount: z.number().int(),
    holdback: z.number().int(),
    currency: z.string(),
  },
  wallet: {
    walletId: z.string(),
    balances: z.record(z.string(), z.object({ available: z.number().int(), escrow: z.number().int() })),
  },
  gate: { gateId: z.string(), status: z.string() },
  quote: {
    quoteId: z.string(),
    quoteSha256: z.string(),
    expiresAt: z.string(),
    paymentRequirements: z.record(z.string(), z.unknown()),
    paymentRequired: z.string().describe('base64 JSON for a PAYMENT-REQUIRED header'),
  },
  authorization: {
    authorizationRef: z.string(),
    token: z.string().describe('compact JWS (EdDSA) binding the gate, quote, request, amount and payee'),
    tokenKid: z.string(),
    expiresAt: z.string(),
    reserve: z.looseObject({ amount: z.number().int(), currency: z.string(), status: z.string() }),
  },
  gateVerification: {
    completed: z.boolean().describe('false: the decision is still being made; poll gate_get'),
    httpStatus: z.number().int(),
  },
} satisfies Record<string, z.ZodRawShape>;

/**
 * A tool's output schema: its fields, or `error` on a failed call. Error results carry structuredContent too, and
 * the SDK's Client validates it even when isError is set (typescript-sdk#1943), so the schema must admit both; the
 * refinement keeps the server's own check of successful results strict.
 */
export function toolOutput<S extends z.ZodRawShape>(shape: S) {
  const success = z.object(shape);
  return z
    .looseObject(shape)
    .partial()
    .extend({ error: ToolError.optional() })
    .refine(
      (value) => value.error !== undefined || success.safeParse(value).success,
      'a result carries every field of the tool, or an error',
    );
}
