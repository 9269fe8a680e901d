// Agents' signing keys for the service's own MCP endpoint (/mcp). A remote MCP client has no local key file the
// service could reach, so the tools that register agents and sign their events keep the key here: sealed with the
// at-rest key (bound to tenant and agent), shared by every API process, never returned by any tool or route.
import { decryptAtRest, encryptAtRest } from '../domain/crypto.ts';
import type { Runtime } from '../runtime.ts';
import { mcpAgentKeyId } from '../store/mcp-agent-keys.ts';

/** Records the key of a newly registered agent; false when the agent already has one (it is never replaced). */
export async function keepMcpAgentKey(
  runtime: Runtime,
  tenantId: string,
  agentId: string,
  keyId: string,
  privateKeyPem: string,
): Promise<boolean> {
  const _id = mcpAgentKeyId(tenantId, agentId);
  return runtime.stores.mcpAgentKeys.record({
    _id,
    tenantId,
    agentId,
    keyId,
    sealed: encryptAtRest(runtime.config.atRestKey, privateKeyPem, _id),
    createdAt: new Date(),
  });
}

/** The key of an agent of this tenant, or null when /mcp registered none for it. */
export async function mcpAgentKey(
  runtime: Runtime,
  tenantId: string,
  agentId: string,
): Promise<{ keyId: string; privateKeyPem: string } | null> {
  const doc = await runtime.stores.mcpAgentKeys.get(tenantId, agentId);
  if (doc?.tenantId !== tenantId) return null;
  return { keyId: doc.keyId, privateKeyPem: decryptAtRest(runtime.config.atRestKey, doc.sealed, doc._id) };
}
