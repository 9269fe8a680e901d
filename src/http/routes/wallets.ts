import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { newId } from '../../domain/crypto.ts';
import { errors } from '../../domain/errors.ts';
import { CURRENCY_PATTERN, MAX_AMOUNT } from '../../domain/money.ts';
import type { Runtime } from '../../runtime.ts';
import type { Balances, WalletDoc } from '../../store/ledger.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses, Timestamp } from '../schemas/common.ts';

export const Amount = Type.Integer({ minimum: 1, maximum: MAX_AMOUNT, description: 'integer minor units' });
export const Currency = Type.String({ pattern: CURRENCY_PATTERN });
const WalletId = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:-]{2,200}$' });
const WalletParams = Type.Object({ walletId: WalletId });
const Credit = Type.Object(
  {
    amount: Amount,
    currency: Currency,
    tenantId: Type.Optional(Type.String({ description: 'owner of a new sponsor wallet (agent wallets belong to the agent\'s tenant)' })),
    reference: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9._:-]{1,128}$', description: 'external reference; crediting the same reference twice credits once' })),
  },
  { additionalProperties: false },
);
const Balance = Type.Object({ available: Type.Integer(), escrow: Type.Integer() });
const Wallet = Type.Object({
  walletId: Type.String(),
  kind: Type.Union([Type.Literal('agent'), Type.Literal('sponsor')]),
  balances: Type.Record(Type.String(), Balance),
  createdAt: Timestamp,
});
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
const EntriesQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500 })),
  cursor: Type.Optional(Type.String({ maxLength: 400 })),
});

export function walletView(w: WalletDoc, balances: Balances): Static<typeof Wallet> {
  return { walletId: w._id, kind: w.kind, balances, createdAt: w.createdAt.toISOString() };
}

export async function walletRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { ledger, agents, tenants } = opts.runtime.stores;
  const tags = ['wallets'];

  app.post<{ Params: Static<typeof WalletParams>; Body: Static<typeof Credit> }>('/ops/wallets/:walletId/credit', {
    config: { access: 'admin' },
    schema: { tags, summary: 'Fund a wallet (agent wallet = agent id; any other id is a sponsor wallet)', params: WalletParams, body: Credit, response: { 201: Type.Intersect([Wallet, Type.Object({ entryId: Type.String() })]), ...errorResponses(400, 401, 403, 404) } },
  }, async (request, reply) => {
    const { walletId } = request.params;
    const { amount, currency, reference } = request.body;
    const agent = await agents.getAny(walletId);
    let wallet = await ledger.getWallet(walletId);
    if (!wallet) {
      const tenantId = agent?.tenantId ?? request.body.tenantId;
      if (!tenantId) throw errors.validation('a new sponsor wallet needs tenantId', { errors: [{ path: 'body.tenantId', message: 'required for a new sponsor wallet' }] });
      if (!agent && !(await tenants.get(tenantId))) throw errors.notFound('tenant');
      wallet = await ledger.ensureWallet(walletId, tenantId, agent ? 'agent' : 'sponsor');
    }
    const entryId = `credit:${walletId}:${reference ?? newId('crd')}`;
    const entry = await ledger.apply({ _id: entryId, tenantId: wallet.tenantId, kind: 'credit', currency, legs: [{ walletId, bucket: 'available', delta: amount }], ref: { walletId } });
    if (entry.legs[0]!.delta !== amount || entry.currency !== currency) {
      throw errors.conflict('TRANSITION_ILLEGAL', `reference ${reference} was already used for another credit`, { status: 'applied' });
    }
    return reply.status(201).send({ ...walletView(wallet, await ledger.balances(walletId)), entryId });
  });

  app.get<{ Params: Static<typeof WalletParams> }>('/v1/wallets/:walletId', {
    config: { access: 'wallets:write' },
    schema: { tags, summary: 'Balances per currency: available and in escrow', params: WalletParams, response: { 200: Wallet, ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const wallet = await ledger.getWallet(request.params.walletId);
    if (!wallet || wallet.tenantId !== tenantOf(request)) throw errors.notFound('wallet');
    return walletView(wallet, await ledger.balances(wallet._id));
  });

  app.get<{ Params: Static<typeof WalletParams>; Querystring: Static<typeof EntriesQuery> }>('/v1/wallets/:walletId/entries', {
    config: { access: 'wallets:write' },
    schema: {
      tags,
      summary: 'Every balance change of the wallet, newest first (paged)',
      params: WalletParams,
      querystring: EntriesQuery,
      response: { 200: Type.Object({ items: Type.Array(Posting), nextCursor: Type.Union([Type.String(), Type.Null()]) }), ...errorResponses(400, 401, 403, 404) },
    },
  }, async (request) => {
    const wallet = await ledger.getWallet(request.params.walletId);
    if (!wallet || wallet.tenantId !== tenantOf(request)) throw errors.notFound('wallet');
    const limit = request.query.limit ?? 50;
    let cursor: { at: Date; id: string } | undefined;
    if (request.query.cursor) {
      const [ms, ...id] = Buffer.from(request.query.cursor, 'base64url').toString('utf8').split(' ');
      if (!ms || !/^\d+$/.test(ms) || id.length === 0) throw errors.validation('cursor is not one this API issued', { errors: [{ path: 'querystring.cursor', message: 'invalid' }] });
      cursor = { at: new Date(Number(ms)), id: id.join(' ') };
    }
    const page = await ledger.listPostings(wallet._id, limit + 1, cursor);
    const items = page.slice(0, limit);
    const last = items.at(-1);
    return {
      items: items.map((p) => ({ postingId: p._id, entryId: p.entryId, kind: p.kind, currency: p.currency, bucket: p.bucket, delta: p.delta, balanceAfter: p.balanceAfter, at: p.at.toISOString() })),
      nextCursor: page.length > limit && last ? Buffer.from(`${last.at.getTime()} ${last._id}`).toString('base64url') : null,
    };
  });
}
