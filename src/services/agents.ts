import { assertClientJsonDepth, toStoredJson } from '../domain/client-json.ts';
import { namespaceOf, SHARED_NAMESPACE, tenantNamespace } from '../domain/agent-ids.ts';
import { KeyFormatError, newId, parsePublicKey } from '../domain/crypto.ts';
import { errors } from '../domain/errors.ts';
import type { Runtime } from '../runtime.ts';
import type { AgentDoc, AgentKeyDoc } from '../store/agents.ts';

export interface RegisterAgentInput {
  agentId?: string;
  namespace?: string;
  name?: string;
  publicKey: string;
  displayName?: string;
  metadata?: Record<string, unknown>;
}

/** An Ed25519 public key as the API takes it (SPKI PEM or base64url raw), as an active key record. */
export function agentKeyFrom(publicKey: string, now: Date): AgentKeyDoc {
  try {
    const parsed = parsePublicKey(publicKey);
    return {
      keyId: parsed.keyId,
      publicKey: Buffer.from(parsed.raw).toString('base64url'),
      status: 'active',
      createdAt: now,
      revokedAt: null,
    };
  } catch (err) {
    if (err instanceof KeyFormatError) {
      throw errors.unprocessable(`publicKey: ${err.message}`, {
        errors: [{ path: 'body.publicKey', message: err.message }],
      });
    }
    throw err;
  }
}

/**
 * No namespace and no name: a generated name in the shared namespace. A name without a namespace: the tenant's own
 * default namespace. Both: as given (the namespace becomes the tenant's if nobody holds it).
 */
function agentIdFor(tenantId: string, namespace: string | undefined, name: string | undefined): string {
  if (name === undefined) return `${namespace ?? SHARED_NAMESPACE}:agent:${newId('agt')}`;
  return `${namespace ?? tenantNamespace(tenantId)}:agent:${name}`;
}

/** Registers an agent identity with its first key; its metadata is kept as the client sent it (canonical JSON). */
export async function registerAgent(
  runtime: Runtime,
  tenantId: string,
  input: RegisterAgentInput,
): Promise<{ agent: AgentDoc; key: AgentKeyDoc }> {
  if (input.agentId && (input.namespace || input.name)) {
    throw errors.unprocessable('give agentId, or namespace and name, not both', {
      errors: [{ path: 'body.agentId', message: 'conflicts with namespace/name' }],
    });
  }
  if (input.metadata !== undefined) assertClientJsonDepth(input.metadata, 'body.metadata');
  const now = new Date();
  const key = agentKeyFrom(input.publicKey, now);
  const agentId = input.agentId ?? agentIdFor(tenantId, input.namespace, input.name);
  if (namespaceOf(agentId) === SHARED_NAMESPACE && !(input.agentId === undefined && input.name === undefined)) {
    throw errors.unprocessable(
      `the namespace "${SHARED_NAMESPACE}" holds only names the service generates; choose a namespace of your own, or leave the name out`,
      {
        errors: [
          {
            path: input.agentId ? 'body.agentId' : 'body.namespace',
            message: `chosen name in the shared namespace "${SHARED_NAMESPACE}"`,
          },
        ],
      },
    );
  }
  // Listed before it is stored (see store/list-index.ts); a refused duplicate's entry matches no agent and is skipped.
  await runtime.stores.lists.add({ kind: 'agents', id: agentId, tenantId, at: now, agentIds: [agentId] });
  const agent = await runtime.stores.agents.create(tenantId, {
    _id: agentId,
    displayName: input.displayName ?? null,
    metadataJson: input.metadata === undefined ? null : toStoredJson(input.metadata),
    status: 'active',
    keys: { [key.keyId]: key },
    createdAt: now,
  });
  return { agent, key };
}

export async function getAgent(runtime: Runtime, tenantId: string, agentId: string): Promise<AgentDoc> {
  const agent = await runtime.stores.agents.get(tenantId, agentId);
  if (!agent) throw errors.notFound('agent');
  return agent;
}

export async function addAgentKey(
  runtime: Runtime,
  tenantId: string,
  agentId: string,
  publicKey: string,
): Promise<AgentKeyDoc> {
  const key = agentKeyFrom(publicKey, new Date());
  await runtime.stores.agents.addKey(tenantId, agentId, key);
  await runtime.credentials.invalidate('agent', agentId);
  return key;
}

/** Revokes an agent key: events it signs are refused from now on, on every process. */
export async function revokeAgentKey(
  runtime: Runtime,
  tenantId: string,
  agentId: string,
  keyId: string,
): Promise<AgentKeyDoc> {
  const key = await runtime.stores.agents.revokeKey(tenantId, agentId, keyId);
  await runtime.credentials.invalidate('agent', agentId);
  return key;
}

/** The tenant's agent as the signature checks see it (cached across requests; see CredentialCache). */
export async function signingAgent(runtime: Runtime, tenantId: string, agentId: string): Promise<AgentDoc> {
  const agent = await runtime.credentials.agent(runtime.stores.agents, agentId);
  if (!agent || agent.tenantId !== tenantId) throw errors.notFound('agent');
  return agent;
}
