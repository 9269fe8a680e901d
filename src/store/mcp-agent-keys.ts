import type { Collection, Db } from 'mongodb';
import { insertFirst } from './mongo.ts';

/**
 * The signing key of an agent registered through the service's own MCP endpoint (/mcp), sealed with the at-rest key:
 * one document per agent, `_id` = `<tenantId>|<agentId>`, so every lookup is by `_id` and a tenant's id can never
 * name another tenant's key.
 */
export interface McpAgentKeyDoc {
  _id: string;
  tenantId: string;
  agentId: string;
  keyId: string;
  /** The PKCS#8 PEM, AES-GCM sealed and bound to `_id`. */
  sealed: string;
  createdAt: Date;
}

export function mcpAgentKeyId(tenantId: string, agentId: string): string {
  return `${tenantId}|${agentId}`;
}

export class McpAgentKeyStore {
  private readonly keys: Collection<McpAgentKeyDoc>;

  constructor(db: Db) {
    this.keys = db.collection<McpAgentKeyDoc>('mcp_agent_keys');
  }

  /** Records an agent's key once; false when one is already recorded (an agent id is registered once). */
  record(doc: McpAgentKeyDoc): Promise<boolean> {
    return insertFirst(this.keys, doc);
  }

  get(tenantId: string, agentId: string): Promise<McpAgentKeyDoc | null> {
    return this.keys.findOne({ _id: mcpAgentKeyId(tenantId, agentId) });
  }
}
