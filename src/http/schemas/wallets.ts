import { Type, type Static } from 'typebox';
import type { Balances, PostingDoc, WalletDoc } from '../../store/ledger.ts';
import { Amount, Currency, Cursor, Timestamp } from './common.ts';

// Wallet shapes: request schemas, response schemas and the views that fill them.

const WalletId = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:-]{2,200}$' });
export const WalletParams = Type.Object({ walletId: WalletId });
export const CreditBody = Type.Object(
  {
    amount: Amount,
    currency: Currency,
    tenantId: Type.Optional(
      Type.String({ description: "owner of a new sponsor wallet (agent wallets belong to the agent's tenant)" }),
    ),
    reference: Type.Optional(
      Type.String({
        pattern: '^[A-Za-z0-9._:-]{1,128}$',
        description: 'external reference; crediting the same reference twice credits once',
      }),
    ),
  },
  { additionalProperties: false, examples: [{ amount: 100_000, currency: 'USD', reference: 'invoice:2026-03-0042' }] },
);
const Balance = Type.Object({ available: Type.Integer(), escrow: Type.Integer() });
export const Wallet = Type.Object({
  walletId: Type.String(),
  kind: Type.Union([Type.Literal('agent'), Type.Literal('sponsor')]),
  balances: Type.Record(Type.String(), Balance),
  createdAt: Timestamp,
});
export const CreditedWallet = Type.Intersect([Wallet, Type.Object({ entryId: Type.String() })]);
const Posting = Type.Object({
  postingId: Type.String(),
  entryId: Type.String(),
  kind: Type.String(),
  currency: Type.String(),
  bucket: Type.Union([Type.Literal('available'), Type.Literal('escrow')]),
  delta: Type.Integer(),
  balanceAfter: Type.Integer(),
  at: Timestamp,
});
export const EntriesQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500 })),
  cursor: Type.Optional(Cursor(2_000)),
});
export const EntriesPage = Type.Object({
  items: Type.Array(Posting),
  nextCursor: Type.Union([Type.String(), Type.Null()]),
});

export function walletView(w: WalletDoc, balances: Balances): Static<typeof Wallet> {
  return { walletId: w._id, kind: w.kind, balances, createdAt: w.createdAt.toISOString() };
}

export function postingView(p: PostingDoc): Static<typeof Posting> {
  return {
    postingId: p._id,
    entryId: p.entryId,
    kind: p.kind,
    currency: p.currency,
    bucket: p.bucket,
    delta: p.delta,
    balanceAfter: p.balanceAfter,
    at: p.at.toISOString(),
  };
}
