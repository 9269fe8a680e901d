import { createHash } from 'node:crypto';

// Agent ids are `<namespace>:agent:<name>`. They are global (a wallet is keyed by its agent's id), so that an id
// tells no tenant whether another tenant holds it, a namespace belongs to the first tenant that registers an agent
// in it, and the one shared namespace holds only names the service generates (which nobody can guess).

/** Where `POST /v1/agents` without a namespace or name puts an agent: a generated name, never a chosen one. */
export const SHARED_NAMESPACE = 'agents';

export function namespaceOf(agentId: string): string {
  return agentId.slice(0, agentId.indexOf(':agent:'));
}

/**
 * A tenant's own default namespace, for a chosen name given without one: derived from the tenant id, which only the
 * tenant and the operators see, so no other tenant can claim it first.
 */
export function tenantNamespace(tenantId: string): string {
  return `t-${createHash('sha256').update(`agent-namespace\n${tenantId}`).digest('hex').slice(0, 20)}`;
}
