import type { Collection, Db } from 'mongodb';
import { ServiceError, errors } from '../domain/errors.ts';
import { isDuplicateKey } from './mongo.ts';
import { TenantScopedCollection } from './tenant-scope.ts';

export interface AgentKeyDoc {
  keyId: string;
  /** base64url of the raw 32-byte Ed25519 public key. */
  publicKey: string;
  status: 'active' | 'revoked';
  createdAt: Date;
  revokedAt: Date | null;
}

export interface AgentDoc {
  _id: string;
  tenantId: string;
  displayName: string | null;
  metadata: Record<string, unknown> | null;
  /** x402 wind-down and freezes stop new work; runs and evidence stay readable. */
  status: 'active' | 'wound_down' | 'frozen';
  /** Keyed by keyId (`key_` + hex, safe as a field name): FerretDB has no positional array updates. */
  keys: Record<string, AgentKeyDoc>;
  createdAt: Date;
}

export class AgentStore {
  readonly agents: Collection<AgentDoc>;

  constructor(db: Db) {
    this.agents = db.collection<AgentDoc>('agents');
  }

  forTenant(tenantId: string) {
    return new TenantScopedCollection(this.agents, tenantId);
  }

  /** Agent ids are global (wallets are keyed by them), so a taken id is a conflict whoever holds it. */
  async create(tenantId: string, agent: Omit<AgentDoc, 'tenantId'>): Promise<AgentDoc> {
    try {
      await this.forTenant(tenantId).insertOne(agent);
    } catch (err) {
      if (isDuplicateKey(err)) throw new ServiceError(409, 'AGENT_EXISTS', `agent ${agent._id} already exists`);
      throw err;
    }
    return { ...agent, tenantId };
  }

  get(tenantId: string, agentId: string): Promise<AgentDoc | null> {
    return this.forTenant(tenantId).findOne({ _id: agentId });
  }

  /** Any tenant's agent: for evidence that names agents outside the caller's tenant (artifacts, payers). */
  getAny(agentId: string): Promise<AgentDoc | null> {
    return this.agents.findOne({ _id: agentId });
  }

  async addKey(tenantId: string, agentId: string, key: AgentKeyDoc): Promise<AgentDoc> {
    const updated = await this.forTenant(tenantId).findOneAndUpdate(
      { _id: agentId, [`keys.${key.keyId}`]: { $exists: false } },
      { $set: { [`keys.${key.keyId}`]: key } },
    );
    if (updated) return updated;
    const agent = await this.get(tenantId, agentId);
    if (!agent) throw errors.notFound('agent');
    throw new ServiceError(409, 'KEY_EXISTS', `key ${key.keyId} is already registered for this agent`, { keyId: key.keyId });
  }

  async revokeKey(tenantId: string, agentId: string, keyId: string, now = new Date()): Promise<AgentKeyDoc> {
    const agent = await this.get(tenantId, agentId);
    const key = agent && Object.hasOwn(agent.keys, keyId) ? agent.keys[keyId] : undefined;
    if (!key) throw errors.notFound('agent key');
    if (key.status === 'revoked') return key;
    const updated = await this.forTenant(tenantId).findOneAndUpdate(
      { _id: agentId, [`keys.${keyId}.status`]: 'active' },
      { $set: { [`keys.${keyId}.status`]: 'revoked', [`keys.${keyId}.revokedAt`]: now } },
    );
    const after = (updated ?? (await this.get(tenantId, agentId)))?.keys[keyId];
    if (!after) throw errors.notFound('agent key');
    return after;
  }
}
