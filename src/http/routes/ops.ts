import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import type { Scope } from '../../domain/scopes.ts';
import type { Runtime } from '../../runtime.ts';
import { BUYER_SESSION_COOKIE } from '../../domain/buyer-session.ts';
import { ServiceError } from '../../domain/errors.ts';
import { auditLedger } from '../../services/ledger-audit.ts';
import { issueBuyerSession } from '../../services/onboarding.ts';
import {
  createTenant,
  issueApiKey,
  listApiKeys,
  listTenants,
  revokeApiKey,
  rotateApiKey,
} from '../../services/tenants.ts';
import { emptyBodyIsObject, errorResponses } from '../schemas/common.ts';
import { BuyerSession, TenantParams } from '../schemas/onboarding.ts';
import {
  ApiKey,
  ApiKeyParams,
  CreateApiKey,
  CreateTenant,
  IssuedApiKey,
  keyView,
  LedgerAudit,
  LedgerAuditQuery,
  ListQuery,
  Rotate,
  Tenant,
  tenantView,
} from '../schemas/ops.ts';

/** How long the audit route waits for another process's audit before answering 409. */
const AUDIT_WAIT_MS = 5_000;

export async function opsRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const admin = { access: 'admin' } as const;
  const tags = ['ops'];

  app.post<{ Body: Static<typeof CreateTenant> }>(
    '/ops/tenants',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'createTenant',
        summary: 'Create a tenant',
        body: CreateTenant,
        response: { 201: Tenant, ...errorResponses(400, 401, 403) },
      },
    },
    async (request, reply) => reply.status(201).send(tenantView(await createTenant(runtime, request.body))),
  );

  app.get<{ Querystring: Static<typeof ListQuery> }>(
    '/ops/tenants',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'listTenants',
        summary: 'List tenants, newest first',
        querystring: ListQuery,
        response: { 200: Type.Object({ items: Type.Array(Tenant) }) },
      },
    },
    async (request) => ({ items: (await listTenants(runtime, request.query.limit ?? 100)).map(tenantView) }),
  );

  app.post<{ Body: Static<typeof CreateApiKey> }>(
    '/ops/api-keys',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'issueApiKey',
        summary: 'Issue an API key for a tenant (token shown once)',
        body: CreateApiKey,
        response: { 201: IssuedApiKey, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request, reply) => {
      const { tenantId, scopes, description, expiresAt } = request.body;
      const { key, token } = await issueApiKey(runtime, {
        tenantId,
        scopes: scopes as Scope[],
        description,
        expiresAt: expiresAt ? new Date(expiresAt) : null,
      });
      return reply.status(201).send({ ...keyView(key), token });
    },
  );

  app.get<{ Querystring: Static<typeof ListQuery> }>(
    '/ops/api-keys',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'listApiKeys',
        summary: 'List API keys (never their secrets)',
        querystring: ListQuery,
        response: { 200: Type.Object({ items: Type.Array(ApiKey) }) },
      },
    },
    async (request) => ({
      items: (await listApiKeys(runtime, { tenantId: request.query.tenantId }, request.query.limit ?? 100)).map((k) =>
        keyView(k),
      ),
    }),
  );

  app.post<{ Params: Static<typeof ApiKeyParams>; Body: Static<typeof Rotate> }>(
    '/ops/api-keys/:keyId/rotate',
    {
      config: admin,
      preValidation: emptyBodyIsObject,
      schema: {
        tags,
        operationId: 'rotateApiKey',
        summary:
          'Issue a successor key; the old one keeps working for gracePeriodSeconds (default 0). The body is optional.',
        params: ApiKeyParams,
        body: Rotate,
        response: {
          201: Type.Object({ previous: ApiKey, current: IssuedApiKey }),
          ...errorResponses(400, 401, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }),
        },
      },
    },
    async (request, reply) => {
      const { old, issued } = await rotateApiKey(runtime, request.params.keyId, request.body.gracePeriodSeconds ?? 0);
      return reply
        .status(201)
        .send({ previous: keyView(old), current: { ...keyView(issued.key), token: issued.token } });
    },
  );

  app.post<{ Params: Static<typeof ApiKeyParams> }>(
    '/ops/api-keys/:keyId/revoke',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'revokeApiKey',
        summary: 'Revoke an API key now, on every API process',
        params: ApiKeyParams,
        response: { 200: ApiKey, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => keyView(await revokeApiKey(runtime, request.params.keyId)),
  );

  app.get<{ Querystring: Static<typeof LedgerAuditQuery> }>(
    '/ops/ledger/audit',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'auditLedger',
        summary:
          'Audit the money invariants per currency (contract section 11); incremental from the last audit, or `full=true` from scratch',
        querystring: LedgerAuditQuery,
        response: { 200: LedgerAudit, ...errorResponses(400, 401, 403, { 409: ['AUDIT_IN_PROGRESS'] }) },
      },
    },
    async (request, reply) => {
      try {
        return await auditLedger(runtime, { full: request.query.full === true, waitMs: AUDIT_WAIT_MS });
      } catch (err) {
        if (err instanceof ServiceError && err.code === 'AUDIT_IN_PROGRESS') reply.header('retry-after', '5');
        throw err;
      }
    },
  );

  app.post<{ Params: Static<typeof TenantParams> }>(
    '/ops/tenants/:tenantId/buyer-sessions',
    {
      config: admin,
      schema: {
        tags,
        operationId: 'createBuyerSession',
        summary:
          "Start a buyer session for the tenant's onboarding routes: Set-Cookie ml_buyer_session (HttpOnly, Secure, SameSite=Strict)",
        params: TenantParams,
        response: { 201: BuyerSession, ...errorResponses(401, 403, 404) },
      },
    },
    async (request, reply) => {
      const { tenantId } = request.params;
      const { value, session } = await issueBuyerSession(runtime, tenantId);
      // Sent only to this tenant's onboarding routes; Strict keeps it off every cross-site request (these POSTs issue keys).
      const path = `/v1/tenants/${tenantId}/onboarding`;
      const maxAge = Math.max(0, Math.floor((session.expiresAt.getTime() - Date.now()) / 1000));
      reply.header(
        'set-cookie',
        `${BUYER_SESSION_COOKIE}=${value}; Path=${path}; Max-Age=${maxAge}; Expires=${session.expiresAt.toUTCString()}; HttpOnly; Secure; SameSite=Strict`,
      );
      reply.header('cache-control', 'no-store');
      return reply.status(201).send({
        tenantId,
        expiresAt: session.expiresAt.toISOString(),
        cookie: { name: BUYER_SESSION_COOKIE, path, sameSite: 'Strict' as const },
      });
    },
  );
}
