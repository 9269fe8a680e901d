// The read of a session's charges while it runs (its statement lists them once it is closed).
import { Type, type Static } from 'typebox';
import type { SessionChargesPage } from '../../services/x402/session-charges.ts';
import type { ChargeDoc } from '../../store/x402-sessions.ts';
import { Cursor, Timestamp } from './common.ts';

const Nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()]);

export const SessionChargesQuery = Type.Object(
  {
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
    cursor: Type.Optional(Cursor(400)),
  },
  { additionalProperties: false },
);

export const SessionChargeLine = Type.Object({
  chargeId: Type.String({ description: '`<sessionId>#<seq>`' }),
  seq: Type.Integer({ description: 'the order the budget debited it in, from 1' }),
  state: Type.Union([Type.Literal('charged'), Type.Literal('void')], {
    description: '`void`: the debit was never recorded as a charge (its call failed, or a close got there first)',
  }),
  paymentId: Nullable(Type.String()),
  payeeAgentId: Nullable(Type.String()),
  amount: Type.Integer({ description: 'integer minor units; 0 for a void' }),
  currency: Type.String(),
  requestSha256: Nullable(Type.String()),
  chargedAt: Timestamp,
  receiptHash: Nullable(Type.String({ description: "of the charge's signed receipt (SessionChargeReceipt.v1)" })),
});

export const SessionChargeList = Type.Object({
  items: Type.Array(SessionChargeLine, { description: 'newest first' }),
  nextCursor: Nullable(Type.String()),
});

function chargeLineView(c: ChargeDoc, currency: string): Static<typeof SessionChargeLine> {
  return {
    chargeId: c._id,
    seq: c.seq,
    state: c.state,
    paymentId: c.paymentId,
    payeeAgentId: c.payeeAgentId,
    amount: c.amount,
    currency,
    requestSha256: c.requestSha256,
    chargedAt: c.at.toISOString(),
    receiptHash: c.receipt?.receiptHash ?? null,
  };
}

export function sessionChargesView(page: SessionChargesPage): Static<typeof SessionChargeList> {
  return { items: page.items.map((c) => chargeLineView(c, page.currency)), nextCursor: page.nextCursor };
}
