import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { KeyFormatError, newId, parsePublicKey } from '../../domain/crypto.ts';
import { errors } from '../../domain/errors.ts';
import type { Runtime } from '../../runtime.ts';
import type { AgentDoc, AgentKeyDoc } from '../../store/agents.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses, Timestamp } from '../schemas.ts';

export const AGENT_ID_PATTERN = '^[a-z0-9][a-z0-9._-]{0,63}:agent:[A-Za-z0-9._-]{1,128}$';
const NAMESPACE = Type.String({ pattern: '^[a-z0-9][a-z0-9._-]{0,63}$' });
const KEY_ID = Type.String({ pattern: '^key_[0-9a-f]{24}$' });
const PublicKey = Type.String({ minLength: 43, maxLength: 2_000, description: 'Ed25519 public key: SPKI PEM, or base64url of the raw 32 bytes' });

const RegisterAgent = Type.Object(
  {
    agentId: Type.Optional(Type.String({ pattern: AGENT_ID_PATTERN })),
    namespace: Type.Optional(NAMESPACE),
    name: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9._-]{1,128}$' })),
    publicKey: PublicKey,
    displayName: Type.Optional(Type.String({ maxLength: 200 })),
    metadata: Type.Optional(Type.Record(Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$' }), Type.Unknown(), { maxProperties: 50 })),
  },
  { additionalProperties: false },
);
const Registered = Type.Object({ agentId: Type.String(), keyId: Type.String(), status: Type.Literal('active'), createdAt: Timestamp });
const AgentKey = Type.Object({
  keyId: Type.String(),
  publicKey: Type.String({ description: 'base64url of the raw 32-byte key' }),
  status: Type.Union([Type.Literal('active'), Type.Literal('revoked')]),
  createdAt: Timestamp,
  revokedAt: Type.Union([Timestamp, Type.Null()]),
});
const Agent = Type.Object({
  agentId: Type.String(),
  displayName: Type.Union([Type.String(), Type.Null()]),
  metadata: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  status: Type.String(),
  keys: Type.Array(AgentKey),
  createdAt: Timestamp,
});
const AgentParams = Type.Object({ agentId: Type.String({ pattern: AGENT_ID_PATTERN }) });
const KeyParams = Type.Object({ agentId: Type.String({ pattern: AGENT_ID_PATTERN }), keyId: KEY_ID });
const AddKey = Type.Object({ publicKey: PublicKey }, { additionalProperties: false });

function parseKey(publicKey: string, now: Date): AgentKeyDoc {
  try {
    const parsed = parsePublicKey(publicKey);
    return { keyId: parsed.keyId, publicKey: Buffer.from(parsed.raw).toString('base64url'), status: 'active', createdAt: now, revokedAt: null };
  } catch (err) {
    if (err instanceof KeyFormatError) {
      throw errors.validation(`publicKey: ${err.message}`, { errors: [{ path: 'body.publicKey', message: err.message }] });
    }
    throw err;
  }
}

function keyView(k: AgentKeyDoc) {
  return { keyId: k.keyId, publicKey: k.publicKey, status: k.status, createdAt: k.createdAt.toISOString(), revokedAt: k.revokedAt?.toISOString() ?? null };
}

function agentView(a: AgentDoc): Static<typeof Agent> {
  return {
    agentId: a._id,
    displayName: a.displayName,
    metadata: a.metadata,
    status: a.status,
    keys: Object.values(a.keys).sort((x, y) => x.createdAt.getTime() - y.createdAt.getTime()).map(keyView),
    createdAt: a.createdAt.toISOString(),
  };
}

export async function agentRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { agents } = opts.runtime.stores;
  const tags = ['agents'];

  const register = async (tenantId: string, body: Static<typeof RegisterAgent>) => {
    if (body.agentId && (body.namespace || body.name)) {
      throw errors.validation('give agentId, or namespace and name, not both', { errors: [{ path: 'body.agentId', message: 'conflicts with namespace/name' }] });
    }
    const now = new Date();
    const key = parseKey(body.publicKey, now);
    const agentId = body.agentId ?? `${body.namespace ?? 'agents'}:agent:${body.name ?? newId('agt')}`;
    await agents.create(tenantId, {
      _id: agentId,
      displayName: body.displayName ?? null,
      metadata: body.metadata ?? null,
      status: 'active',
      keys: { [key.keyId]: key },
      createdAt: now,
    });
    return { agentId, keyId: key.keyId, status: 'active' as const, createdAt: now.toISOString() };
  };

  const registerSchema = {
    tags,
    summary: 'Register an agent identity with its first Ed25519 key',
    body: RegisterAgent,
    response: { 201: Registered, ...errorResponses(400, 401, 403, 409) },
  };
  for (const url of ['/v1/agents', '/agents/register']) {
    app.post<{ Body: Static<typeof RegisterAgent> }>(url, { config: { access: 'agents:write' }, schema: registerSchema }, async (request, reply) =>
      reply.status(201).send(await register(tenantOf(request), request.body)),
    );
  }

  app.get<{ Params: Static<typeof AgentParams> }>('/v1/agents/:agentId', {
    config: { access: 'runs:read' },
    schema: { tags, summary: 'An agent with all its keys', params: AgentParams, response: { 200: Agent, ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const agent = await agents.get(tenantOf(request), request.params.agentId);
    if (!agent) throw errors.notFound('agent');
    return agentView(agent);
  });

  app.post<{ Params: Static<typeof AgentParams>; Body: Static<typeof AddKey> }>('/v1/agents/:agentId/keys', {
    config: { access: 'agents:write' },
    schema: { tags, summary: 'Add a signing key to an agent', params: AgentParams, body: AddKey, response: { 201: Type.Intersect([Type.Object({ agentId: Type.String() }), AgentKey]), ...errorResponses(400, 401, 403, 404, 409) } },
  }, async (request, reply) => {
    const key = parseKey(request.body.publicKey, new Date());
    await agents.addKey(tenantOf(request), request.params.agentId, key);
    return reply.status(201).send({ agentId: request.params.agentId, ...keyView(key) });
  });

  app.post<{ Params: Static<typeof KeyParams> }>('/v1/agents/:agentId/keys/:keyId/revoke', {
    config: { access: 'agents:write' },
    schema: { tags, summary: 'Revoke an agent key: events it signs are refused from now on', params: KeyParams, response: { 200: Type.Intersect([Type.Object({ agentId: Type.String() }), AgentKey]), ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const key = await agents.revokeKey(tenantOf(request), request.params.agentId, request.params.keyId);
    return { agentId: request.params.agentId, ...keyView(key) };
  });
}
