import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { errors } from '../../domain/errors.ts';
import { SCOPES, type Scope } from '../../domain/scopes.ts';
import type { Runtime } from '../../runtime.ts';
import type { ApiKeyDoc } from '../../store/api-keys.ts';
import type { TenantDoc } from '../../store/tenants.ts';
import { emptyBodyIsObject, errorResponses, Timestamp } from '../schemas.ts';

const RateLimitPolicy = Type.Object(
  { limit: Type.Integer({ minimum: 1, maximum: 10_000_000 }), windowSeconds: Type.Integer({ minimum: 1, maximum: 86_400 }) },
  { additionalProperties: false },
);
const CreateTenant = Type.Object(
  { name: Type.String({ minLength: 1, maxLength: 200 }), rateLimit: Type.Optional(RateLimitPolicy) },
  { additionalProperties: false },
);
const Tenant = Type.Object({
  tenantId: Type.String(),
  name: Type.String(),
  rateLimit: Type.Union([RateLimitPolicy, Type.Null()]),
  createdAt: Timestamp,
});
const ScopeSchema = Type.Union(SCOPES.map((s) => Type.Literal(s)));
const CreateApiKey = Type.Object(
  {
    tenantId: Type.String({ minLength: 1 }),
    scopes: Type.Array(ScopeSchema, { minItems: 1, maxItems: SCOPES.length }),
    description: Type.Optional(Type.String({ maxLength: 500 })),
    expiresAt: Type.Optional(Timestamp),
  },
  { additionalProperties: false },
);
const ApiKey = Type.Object({
  keyId: Type.String(),
  tenantId: Type.String(),
  scopes: Type.Array(Type.String()),
  description: Type.Union([Type.String(), Type.Null()]),
  status: Type.Union([Type.Literal('active'), Type.Literal('revoked'), Type.Literal('expired')]),
  expiresAt: Type.Union([Timestamp, Type.Null()]),
  createdAt: Timestamp,
  revokedAt: Type.Union([Timestamp, Type.Null()]),
  rotatedTo: Type.Union([Type.String(), Type.Null()]),
});
const IssuedApiKey = Type.Intersect([
  ApiKey,
  Type.Object({ token: Type.String({ description: 'Shown once: `sk_<keyId>.<secret>`' }) }),
]);
const KeyParams = Type.Object({ keyId: Type.String() });
const Rotate = Type.Object(
  { gracePeriodSeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 604_800, default: 0 })) },
  { additionalProperties: false },
);
const ListQuery = Type.Object({
  tenantId: Type.Optional(Type.String()),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500, default: 100 })),
});

function tenantView(t: TenantDoc): Static<typeof Tenant> {
  return { tenantId: t._id, name: t.name, rateLimit: t.rateLimit, createdAt: t.createdAt.toISOString() };
}

function keyView(k: ApiKeyDoc, now = new Date()): Static<typeof ApiKey> {
  const expired = k.expiresAt !== null && k.expiresAt.getTime() <= now.getTime();
  return {
    keyId: k._id,
    tenantId: k.tenantId,
    scopes: k.scopes,
    description: k.description,
    status: k.status === 'revoked' ? 'revoked' : expired ? 'expired' : 'active',
    expiresAt: k.expiresAt?.toISOString() ?? null,
    createdAt: k.createdAt.toISOString(),
    revokedAt: k.revokedAt?.toISOString() ?? null,
    rotatedTo: k.rotatedTo,
  };
}

export async function opsRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { tenants, apiKeys } = opts.runtime.stores;
  const admin = { access: 'admin' } as const;
  const tags = ['ops'];

  app.post<{ Body: Static<typeof CreateTenant> }>('/ops/tenants', {
    config: admin,
    schema: { tags, summary: 'Create a tenant', body: CreateTenant, response: { 201: Tenant, ...errorResponses(400, 401, 403) } },
  }, async (request, reply) => {
    const tenant = await tenants.create(request.body);
    return reply.status(201).send(tenantView(tenant));
  });

  app.get<{ Querystring: Static<typeof ListQuery> }>('/ops/tenants', {
    config: admin,
    schema: { tags, summary: 'List tenants, newest first', querystring: ListQuery, response: { 200: Type.Object({ items: Type.Array(Tenant) }) } },
  }, async (request) => ({ items: (await tenants.list(request.query.limit ?? 100)).map(tenantView) }));

  app.post<{ Body: Static<typeof CreateApiKey> }>('/ops/api-keys', {
    config: admin,
    schema: { tags, summary: 'Issue an API key for a tenant (token shown once)', body: CreateApiKey, response: { 201: IssuedApiKey, ...errorResponses(400, 401, 403, 404) } },
  }, async (request, reply) => {
    const { tenantId, scopes, description, expiresAt } = request.body;
    if (!(await tenants.get(tenantId))) throw errors.notFound('tenant');
    const expiry = expiresAt ? new Date(expiresAt) : null;
    if (expiry && expiry.getTime() <= Date.now()) {
      throw errors.validation('expiresAt must be in the future', { errors: [{ path: 'body.expiresAt', message: 'must be in the future' }] });
    }
    const { key, token } = await apiKeys.issue({ tenantId, scopes: scopes as Scope[], description, expiresAt: expiry });
    return reply.status(201).send({ ...keyView(key), token });
  });

  app.get<{ Querystring: Static<typeof ListQuery> }>('/ops/api-keys', {
    config: admin,
    schema: { tags, summary: 'List API keys (never their secrets)', querystring: ListQuery, response: { 200: Type.Object({ items: Type.Array(ApiKey) }) } },
  }, async (request) => ({
    items: (await apiKeys.list({ tenantId: request.query.tenantId }, request.query.limit ?? 100)).map((k) => keyView(k)),
  }));

  app.post<{ Params: Static<typeof KeyParams>; Body: Static<typeof Rotate> }>('/ops/api-keys/:keyId/rotate', {
    config: admin,
    preValidation: emptyBodyIsObject,
    schema: {
      tags,
      summary: 'Issue a successor key; the old one keeps working for gracePeriodSeconds (default 0). The body is optional.',
      params: KeyParams,
      body: Rotate,
      response: { 201: Type.Object({ previous: ApiKey, current: IssuedApiKey }), ...errorResponses(400, 401, 403, 404) },
    },
  }, async (request, reply) => {
    const rotated = await apiKeys.rotate(request.params.keyId, request.body.gracePeriodSeconds ?? 0);
    if (!rotated) throw errors.notFound('active API key');
    return reply.status(201).send({ previous: keyView(rotated.old), current: { ...keyView(rotated.issued.key), token: rotated.issued.token } });
  });

  app.post<{ Params: Static<typeof KeyParams> }>('/ops/api-keys/:keyId/revoke', {
    config: admin,
    schema: { tags, summary: 'Revoke an API key now', params: KeyParams, response: { 200: ApiKey, ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const key = await apiKeys.revoke(request.params.keyId);
    if (!key) throw errors.notFound('API key');
    return keyView(key);
  });
}
