import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import { AGENT_READ_WITH_RUNS_READ } from '../../domain/scopes.ts';
import type { Runtime } from '../../runtime.ts';
import { addAgentKey, getAgent, registerAgent, revokeAgentKey } from '../../services/agents.ts';
import { tenantOf } from '../plugins/auth.ts';
import {
  AddKey,
  Agent,
  AgentKeyOfAgent,
  AgentParams,
  agentView,
  KeyParams,
  keyView,
  RegisterAgent,
  Registered,
} from '../schemas/agents.ts';
import { errorResponses } from '../schemas/common.ts';

export async function agentRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const tags = ['agents'];

  const registerSchema = {
    tags,
    summary: 'Register an agent identity with its first Ed25519 key',
    description:
      'Agent ids are `<namespace>:agent:<name>`. A namespace belongs to the first tenant that registers an agent in it; ' +
      'another tenant gets 409 `AGENT_NAMESPACE_TAKEN` whatever the name, so no id tells it which agents exist. A name ' +
      "without a namespace goes to the tenant's own namespace; no name at all gives a generated one in the shared " +
      'namespace `agents`, which takes no chosen names (422). 409 `AGENT_EXISTS`: the tenant already has this id.',
    body: RegisterAgent,
    response: { 201: Registered, ...errorResponses(400, 401, 403, { 409: ['AGENT_EXISTS', 'AGENT_NAMESPACE_TAKEN'] }) },
  };
  // One operation under two paths; each needs its own operationId.
  for (const [url, operationId] of [
    ['/v1/agents', 'registerAgent'],
    ['/agents/register', 'registerAgentAtContractPath'],
  ] as const) {
    app.post<{ Body: Static<typeof RegisterAgent> }>(
      url,
      { config: { access: 'agents:write' }, schema: { ...registerSchema, operationId } },
      async (request, reply) => {
        const { agent, key } = await registerAgent(runtime, tenantOf(request), request.body);
        return reply.status(201).send({
          agentId: agent._id,
          keyId: key.keyId,
          status: 'active' as const,
          createdAt: agent.createdAt.toISOString(),
        });
      },
    );
  }

  app.get<{ Params: Static<typeof AgentParams> }>(
    '/v1/agents/:agentId',
    {
      // Every read of a kind needs that kind's read scope; runs:read (the old rule) passes until the window ends.
      config: { access: 'agents:read', deprecatedAccess: AGENT_READ_WITH_RUNS_READ },
      schema: {
        tags,
        operationId: 'getAgent',
        summary: 'An agent with all its keys',
        params: AgentParams,
        response: { 200: Agent, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => agentView(await getAgent(runtime, tenantOf(request), request.params.agentId)),
  );

  app.post<{ Params: Static<typeof AgentParams>; Body: Static<typeof AddKey> }>(
    '/v1/agents/:agentId/keys',
    {
      config: { access: 'agents:write' },
      schema: {
        tags,
        operationId: 'addAgentKey',
        summary: 'Add a signing key to an agent',
        params: AgentParams,
        body: AddKey,
        response: { 201: AgentKeyOfAgent, ...errorResponses(400, 401, 403, 404, { 409: ['KEY_EXISTS'] }) },
      },
    },
    async (request, reply) => {
      const key = await addAgentKey(runtime, tenantOf(request), request.params.agentId, request.body.publicKey);
      return reply.status(201).send({ agentId: request.params.agentId, ...keyView(key) });
    },
  );

  app.post<{ Params: Static<typeof KeyParams> }>(
    '/v1/agents/:agentId/keys/:keyId/revoke',
    {
      config: { access: 'agents:write' },
      schema: {
        tags,
        operationId: 'revokeAgentKey',
        summary: 'Revoke an agent key: events it signs are refused from now on',
        params: KeyParams,
        response: { 200: AgentKeyOfAgent, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => {
      const key = await revokeAgentKey(runtime, tenantOf(request), request.params.agentId, request.params.keyId);
      return { agentId: request.params.agentId, ...keyView(key) };
    },
  );
}
