import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { creditWallet, getWallet, listWalletEntries } from '../../services/wallets.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses } from '../schemas/common.ts';
import {
  CreditBody,
  CreditedWallet,
  EntriesPage,
  EntriesQuery,
  postingView,
  Wallet,
  WalletParams,
  walletView,
} from '../schemas/wallets.ts';

export async function walletRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { runtime } = opts;
  const tags = ['wallets'];

  app.post<{ Params: Static<typeof WalletParams>; Body: Static<typeof CreditBody> }>(
    '/ops/wallets/:walletId/credit',
    {
      config: { access: 'admin' },
      schema: {
        tags,
        operationId: 'creditWallet',
        summary: 'Fund a wallet (agent wallet = agent id; any other id is a sponsor wallet)',
        params: WalletParams,
        body: CreditBody,
        response: {
          201: CreditedWallet,
          ...errorResponses(400, 401, 403, 404, { 409: ['BALANCE_LIMIT', 'TRANSITION_ILLEGAL'] }),
        },
      },
    },
    async (request, reply) => {
      const { wallet, balances, entryId } = await creditWallet(runtime, {
        walletId: request.params.walletId,
        ...request.body,
      });
      return reply.status(201).send({ ...walletView(wallet, balances), entryId });
    },
  );

  app.get<{ Params: Static<typeof WalletParams> }>(
    '/v1/wallets/:walletId',
    {
      config: { access: 'wallets:read' },
      schema: {
        tags,
        operationId: 'getWallet',
        summary: 'Balances per currency: available and in escrow',
        params: WalletParams,
        response: { 200: Wallet, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => {
      const { wallet, balances } = await getWallet(runtime, tenantOf(request), request.params.walletId);
      return walletView(wallet, balances);
    },
  );

  app.get<{ Params: Static<typeof WalletParams>; Querystring: Static<typeof EntriesQuery> }>(
    '/v1/wallets/:walletId/entries',
    {
      config: { access: 'wallets:read' },
      schema: {
        tags,
        operationId: 'listWalletEntries',
        summary: 'Every balance change of the wallet, newest first (paged)',
        params: WalletParams,
        querystring: EntriesQuery,
        response: { 200: EntriesPage, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const page = await listWalletEntries(runtime, tenantOf(request), request.params.walletId, {
        limit: request.query.limit ?? 50,
        cursor: request.query.cursor,
      });
      return { items: page.items.map(postingView), nextCursor: page.nextCursor };
    },
  );
}
