import { Type, type Static } from 'typebox';
import type { SettlementState } from '../../store/settlements.ts';
import { Timestamp } from './common.ts';
import { SettlementTermsSchema } from './runs.ts';

export const SettleBody = Type.Object(
  { settlement: Type.Optional(SettlementTermsSchema) },
  {
    additionalProperties: false,
    examples: [
      {
        settlement: {
          payerAgentId: 'acme:agent:buyer',
          amount: 2500,
          currency: 'USD',
          holdbackBps: 1000,
          disputeWindowSeconds: 86_400,
        },
      },
    ],
  },
);
export const SettleAccepted = Type.Object({ runId: Type.String(), settlementId: Type.String(), status: Type.String() });
export const DisputeBody = Type.Object(
  {
    reason: Type.String({ minLength: 1, maxLength: 2_000 }),
    evidence: Type.Optional(Type.Unknown({ description: 'any JSON nested at most 128 deep' })),
  },
  {
    additionalProperties: false,
    examples: [
      {
        reason: 'The summaries cite sources that do not exist',
        evidence: { sampleIds: ['s-17', 's-42'], reviewer: 'qa@acme.example' },
      },
    ],
  },
);
export const DisputeOpened = Type.Object({
  disputeId: Type.String(),
  status: Type.Literal('open'),
  settlementId: Type.String(),
  runId: Type.String(),
  frozenAmount: Type.Integer(),
});
export const DisputeRuling = Type.Object(
  {
    outcome: Type.Union([Type.Literal('payee'), Type.Literal('payer'), Type.Literal('split')]),
    payerShareBps: Type.Optional(Type.Integer({ minimum: 0, maximum: 10_000 })),
  },
  { additionalProperties: false, examples: [{ outcome: 'split', payerShareBps: 5000 }] },
);
export const DisputeParams = Type.Object({ disputeId: Type.String({ maxLength: 128 }) });
export const HeldRuling = Type.Object(
  { outcome: Type.Union([Type.Literal('release'), Type.Literal('refund')]) },
  { additionalProperties: false, examples: [{ outcome: 'refund' }] },
);
export const SettlementParams = Type.Object({ settlementId: Type.String({ maxLength: 128 }) });
export const Dispute = Type.Object({
  disputeId: Type.String(),
  status: Type.String(),
  reason: Type.String(),
  frozenAmount: Type.Integer(),
  openedAt: Timestamp,
  outcome: Type.Union([Type.String(), Type.Null()]),
  toPayer: Type.Union([Type.Integer(), Type.Null()]),
  toPayee: Type.Union([Type.Integer(), Type.Null()]),
  resolvedAt: Type.Union([Timestamp, Type.Null()]),
});
export const Settlement = Type.Object({
  settlementId: Type.String(),
  runId: Type.String(),
  status: Type.String(),
  amount: Type.Integer(),
  releasedAmount: Type.Integer(),
  refundedAmount: Type.Integer(),
  holdback: Type.Integer(),
  holdbackState: Type.String(),
  currency: Type.String(),
  payerWalletId: Type.String(),
  payeeWalletId: Type.String(),
  disputeWindowEndsAt: Type.Union([Timestamp, Type.Null()]),
  dispute: Type.Union([Dispute, Type.Null()]),
  decision: Type.Union([
    Type.Object({ verdict: Type.String(), reason: Type.Union([Type.String(), Type.Null()]), decidedAt: Timestamp }),
    Type.Null(),
  ]),
  receipt: Type.Union([
    Type.Object({
      receiptHash: Type.String(),
      signature: Type.Object({ alg: Type.String(), keyId: Type.String(), value: Type.String() }),
      body: Type.Record(Type.String(), Type.Unknown(), {
        description: 'SettlementReceipt.v1; receiptHash = sha256hex(JCS(body))',
      }),
    }),
    Type.Null(),
  ]),
});

export function settlementView({ doc: s, facts, view }: SettlementState): Static<typeof Settlement> {
  const d = facts.decision;
  const hb = facts.holdback;
  const dispute =
    hb?.fate === 'dispute'
      ? {
          disputeId: hb.disputeId,
          status: !facts.ruling ? 'open' : view.holdbackState === 'resolving' ? 'resolving' : 'resolved',
          reason: hb.reason,
          frozenAmount: hb.frozenAmount,
          openedAt: hb.at,
          outcome: facts.ruling?.outcome ?? null,
          toPayer: facts.ruling?.toPayer ?? null,
          toPayee: facts.ruling?.toPayee ?? null,
          resolvedAt: facts.ruling && view.holdbackState !== 'resolving' ? facts.ruling.at : null,
        }
      : null;
  return {
    settlementId: s._id,
    runId: s.runId,
    status: view.status,
    amount: s.amount,
    releasedAmount: view.releasedAmount,
    refundedAmount: view.refundedAmount,
    holdback: view.holdback,
    holdbackState: view.holdbackState,
    currency: s.currency,
    payerWalletId: s.payerWalletId,
    payeeWalletId: s.payeeWalletId,
    disputeWindowEndsAt: view.disputeWindowEndsAt,
    dispute,
    decision: d ? { verdict: d.verdict, reason: d.reason, decidedAt: d.decidedAt } : null,
    receipt: d
      ? {
          receiptHash: d.receipt.receiptHash,
          signature: d.receipt.signature,
          body: d.receipt.body as unknown as Record<string, unknown>,
        }
      : null,
  };
}
