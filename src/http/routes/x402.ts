import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { x402Service } from '../../services/x402/service.ts';
import { tenantOf } from '../plugins/auth.ts';
import type { FastifyRequest } from 'fastify';
import type { Decider } from '../../store/x402.ts';
import { emptyBodyIsObject, errorResponses, type ErrorCodes } from '../schemas/common.ts';
import {
  AgentParams,
  Authorization,
  authorizationView,
  AuthorizePaymentBody,
  BulkResolveBody,
  BulkResolved,
  bulkResolvedView,
  CreateGateBody,
  EscalationPage,
  EscalationParams,
  EscalationQuery,
  escalationView,
  Gate,
  GateParams,
  gateView,
  Policy,
  PolicyBody,
  policyView,
  Quote,
  QuoteBody,
  quoteView,
  ResolveBody,
  Resolved,
  VerifyBody,
  VerifyResult,
  WalletAuthorizeBody,
  WalletDecision,
  WalletParams,
  WindDownBody,
  WindDownSummary,
  windDownView,
} from '../schemas/x402.ts';

/** x402 errors a call can meet, beside the platform's own. */
const x402Errors = (...statuses: Array<number | ErrorCodes>) => errorResponses(400, 401, 403, 404, ...statuses);
/** What a quote can be refused for when a call names it (services/x402/quotes.ts). */
const QUOTE_CODES = [
  'X402_GATE_TERMINAL',
  'X402_QUOTE_NOT_FOUND',
  'X402_QUOTE_EXPIRED',
  'X402_QUOTE_MISMATCH',
  'X402_REQUEST_BINDING_MISMATCH',
];

/** Who is deciding: the calling API key, or the operator's admin credential. */
function deciderOf(request: FastifyRequest): Decider {
  const principal = request.principal;
  return principal?.kind === 'key' ? { kind: 'api-key', keyId: principal.credentialId } : { kind: 'admin' };
}

export async function x402Routes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const service = x402Service(opts.runtime);
  app.addHook('onClose', () => service.close());
  const tags = ['x402'];

  app.post<{ Body: Static<typeof CreateGateBody> }>(
    '/x402/gate/create',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'createGate',
        summary:
          "Create a payment gate: locks the amount in the payer's (or the sponsor wallet's) escrow; a retry with the same Idempotency-Key resumes the same gate",
        body: CreateGateBody,
        response: { 201: Gate, ...x402Errors(402, 410, 422, { 409: ['X402_WALLET_POLICY_VIOLATION'] }) },
      },
    },
    async (request, reply) =>
      reply
        .status(201)
        .send(gateView(await service.gates.createGate(tenantOf(request), request.body, request.idempotencyScope))),
  );

  app.post<{ Body: Static<typeof QuoteBody> }>(
    '/x402/gate/quote',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'quoteGate',
        summary:
          'Quote a gate for one request: x402 v2 payment requirements; a live identical quote is returned unchanged',
        body: QuoteBody,
        response: { 200: Quote, ...x402Errors(410, { 409: ['X402_GATE_TERMINAL'] }) },
      },
    },
    async (request) => quoteView(await service.quotes.quote(tenantOf(request), request.body)),
  );

  app.get<{ Querystring: Static<typeof EscalationQuery> }>(
    '/x402/gate/escalations',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'listEscalations',
        summary: 'Escalations of the tenant, newest first (paged)',
        querystring: EscalationQuery,
        response: { 200: EscalationPage, ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => {
      const { cursor, ...query } = request.query;
      const page = await service.escalations.listEscalations(tenantOf(request), {
        ...query,
        ...(cursor ? { cursor: Number(cursor) } : {}),
      });
      return {
        items: page.items.map(escalationView),
        nextCursor: page.nextCursor === null ? null : String(page.nextCursor),
      };
    },
  );

  app.get<{ Params: Static<typeof GateParams> }>(
    '/x402/gate/:gateId',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'getGate',
        summary: 'The gate with its current quote, authorization, decision and receipt',
        params: GateParams,
        response: { 200: Gate, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => gateView(await service.gates.getGate(tenantOf(request), request.params.gateId)),
  );

  app.put<{ Params: Static<typeof WalletParams>; Body: Static<typeof PolicyBody> }>(
    '/x402/wallets/:walletId/policy',
    {
      config: { access: 'wallets:write' },
      schema: {
        tags,
        operationId: 'setWalletPolicy',
        summary: "Set a wallet's x402 spending policy (a new version; the last one is in force)",
        params: WalletParams,
        body: PolicyBody,
        response: { 200: Policy, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const b = request.body;
      const policy = {
        currency: b.currency,
        perCallLimit: b.perCallLimit ?? null,
        dailyLimit: b.dailyLimit ?? null,
        allowedPayeeAgentIds: b.allowedPayeeAgentIds ?? null,
        allowedToolIds: b.allowedToolIds ?? null,
        escalationTimeoutSeconds: b.escalationTimeoutSeconds ?? null,
        onBreach: b.onBreach ?? null,
      };
      return policyView(await service.policies.putPolicy(tenantOf(request), request.params.walletId, policy));
    },
  );

  app.get<{ Params: Static<typeof WalletParams> }>(
    '/x402/wallets/:walletId/policy',
    {
      config: { access: 'wallets:read' },
      schema: {
        tags,
        operationId: 'getWalletPolicy',
        summary: "The wallet's policy in force",
        params: WalletParams,
        response: { 200: Policy, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => policyView(await service.policies.getPolicy(tenantOf(request), request.params.walletId)),
  );

  app.post<{ Params: Static<typeof WalletParams>; Body: Static<typeof WalletAuthorizeBody> }>(
    '/x402/wallets/:walletId/authorize',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'authorizeWalletPayment',
        summary: "A sponsor wallet's decision on one quoted call, under its policy (daily limit included)",
        params: WalletParams,
        body: WalletAuthorizeBody,
        response: {
          200: WalletDecision,
          ...x402Errors(410, {
            409: [...QUOTE_CODES, 'X402_WALLET_POLICY_VIOLATION', 'X402_AUTHORIZATION_ESCALATION_REQUIRED'],
          }),
        },
      },
    },
    async (request) => {
      const d = await service.policies.authorizeWallet(tenantOf(request), request.params.walletId, request.body);
      return { walletDecisionToken: d.walletDecisionToken, expiresAt: d.expiresAt.toISOString() };
    },
  );

  app.post<{ Body: Static<typeof AuthorizePaymentBody> }>(
    '/x402/gate/authorize-payment',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'authorizePayment',
        summary: 'Authorize the payment of a quoted call: a signed token for the provider; repeats get the same token',
        body: AuthorizePaymentBody,
        response: {
          200: Authorization,
          ...x402Errors(410, {
            409: [
              ...QUOTE_CODES,
              'X402_WALLET_DECISION_REQUIRED',
              'X402_WALLET_POLICY_VIOLATION',
              'X402_AUTHORIZATION_ESCALATION_REQUIRED',
              'X402_OVERRIDE_INVALID',
              'X402_OVERRIDE_REPLAYED',
            ],
          }),
        },
      },
    },
    async (request) => authorizationView(await service.authorization.authorizePayment(tenantOf(request), request.body)),
  );

  app.post<{ Body: Static<typeof VerifyBody> }>(
    '/x402/gate/verify',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'verifyGate',
        summary:
          "Report the provider's response and, metered, what the call cost: releases that (minus holdback) and returns the rest, or refunds; 202 with statusUrl while still deciding",
        body: VerifyBody,
        response: {
          200: VerifyResult,
          202: VerifyResult,
          ...x402Errors(410, {
            409: [
              'X402_GATE_TERMINAL',
              'X402_PAYMENT_NOT_AUTHORIZED',
              'X402_AUTHORIZATION_EXPIRED',
              'X402_REQUEST_BINDING_MISMATCH',
            ],
            422: ['X402_CAPTURE_EXCEEDS_AUTHORIZATION'],
          }),
        },
      },
    },
    async (request, reply) => {
      const { state, decided } = await service.verification.verify(tenantOf(request), request.body);
      return reply.status(decided ? 200 : 202).send({ ...gateView(state), statusUrl: `/x402/gate/${state.gate._id}` });
    },
  );

  app.post<{ Params: Static<typeof EscalationParams>; Body: Static<typeof ResolveBody> }>(
    '/x402/gate/escalations/:escalationId/resolve',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'resolveEscalation',
        summary:
          "Approve (a single-use override token) or deny an escalation, with a reason; the caller's key is recorded as who decided",
        params: EscalationParams,
        body: ResolveBody,
        response: {
          200: Resolved,
          ...x402Errors({ 409: ['X402_ESCALATION_TERMINAL', 'X402_ESCALATION_DEADLINE_PASSED'] }),
        },
      },
    },
    async (request) => {
      const r = await service.escalations.resolveEscalation(
        tenantOf(request),
        request.params.escalationId,
        request.body,
        deciderOf(request),
      );
      return {
        ...escalationView(r),
        escalationOverrideToken: r.escalationOverrideToken,
        overrideExpiresAt: r.overrideExpiresAt?.toISOString() ?? null,
      };
    },
  );

  app.post<{ Body: Static<typeof BulkResolveBody> }>(
    '/x402/gate/escalations/resolve',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'resolveEscalations',
        summary:
          'Approve or deny up to 100 escalations of the tenant at once (the ids a console selected under a filter), with one reason; answers per id what happened',
        body: BulkResolveBody,
        response: { 200: BulkResolved, ...errorResponses(400, 401, 403, 422) },
      },
    },
    async (request) =>
      bulkResolvedView(
        await service.escalations.resolveEscalations(
          tenantOf(request),
          request.body.escalationIds,
          request.body,
          deciderOf(request),
        ),
      ),
  );

  app.post<{ Body: Static<typeof BulkResolveBody> }>(
    '/ops/x402/escalations/resolve',
    {
      config: { access: 'admin' },
      schema: {
        tags: ['ops'],
        operationId: 'resolveEscalationsAsOperator',
        summary:
          'The operator approves or denies up to 100 escalations of any tenant (decided by admin); answers per id what happened',
        body: BulkResolveBody,
        response: { 200: BulkResolved, ...errorResponses(400, 401, 403, 422) },
      },
    },
    async (request) =>
      bulkResolvedView(
        await service.escalations.resolveEscalations(
          null,
          request.body.escalationIds,
          request.body,
          deciderOf(request),
        ),
      ),
  );

  app.post<{ Params: Static<typeof AgentParams>; Body: Static<typeof WindDownBody> }>(
    '/x402/gate/agents/:agentId/wind-down',
    {
      config: { access: 'x402:write' },
      preValidation: emptyBodyIsObject,
      schema: {
        tags,
        operationId: 'windDownAgent',
        summary:
          'Wind an agent down: no new gates or authorizations; unauthorized gates cancelled and their escrow returned',
        params: AgentParams,
        body: WindDownBody,
        response: { 200: WindDownSummary, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) =>
      windDownView(await service.windDowns.windDown(tenantOf(request), request.params.agentId, request.body)),
  );
}
