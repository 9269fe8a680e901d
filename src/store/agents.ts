import type { Collection, Db } from 'mongodb';
import { errors, ServiceError, serviceError } from '../domain/errors.ts';
import { namespaceOf, SHARED_NAMESPACE } from '../domain/agent-ids.ts';
import { insertFirst } from './mongo.ts';

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
  /** The client's metadata as its canonical JSON text (see domain/client-json.ts), or null. */
  metadataJson: string | null;
  /** x402 wind-down and freezes stop new work; runs and evidence stay readable. */
  status: 'active' | 'wound_down' | 'frozen';
  /** Keyed by keyId (`key_` + hex, safe as a field name): FerretDB has no positional array updates. */
  keys: Record<string, AgentKeyDoc>;
  createdAt: Date;
}

/**
 * A key revocation, recorded by insert: an update of the agent document could be lost to a concurrent one on
 * FerretDB (and would then un-revoke the key), an inserted record cannot. The status inside the agent document is
 * only a cache of these.
 */
interface KeyRevocationDoc {
  _id: string;
  agentId: string;
  keyId: string;
  revokedAt: Date;
}

/** Which tenant a namespace of agent ids belongs to: the first to register an agent in it (by unique insert). */
interface NamespaceClaimDoc {
  _id: string;
  tenantId: string;
  claimedAt: Date;
}

export class AgentStore {
  readonly agents: Collection<AgentDoc>;
  readonly revocations: Collection<KeyRevocationDoc>;
  readonly namespaces: Collection<NamespaceClaimDoc>;

  constructor(db: Db) {
    this.agents = db.collection<AgentDoc>('agents');
    this.revocations = db.collection<KeyRevocationDoc>('agent_key_revocations');
    this.namespaces = db.collection<NamespaceClaimDoc>('agent_namespaces');
  }

  /**
   * Claims the namespace for the tenant, or finds it already theirs. Another tenant's namespace is refused whatever
   * the name, so the answer says nothing about which agents exist in it.
   */
  private async claimNamespace(tenantId: string, namespace: string): Promise<void> {
    // Most registrations land in a namespace already claimed: read first, and insert only for a new one.
    let claim = await this.namespaces.findOne({ _id: namespace });
    if (!claim && !(await insertFirst(this.namespaces, { _id: namespace, tenantId, claimedAt: new Date() }))) {
      claim = await this.namespaces.findOne({ _id: namespace }); // claimed concurrently: the first insert stands
    }
    if (claim && claim.tenantId !== tenantId) throw namespaceTaken(namespace);
  }

  /** The agent with every key's status as its revocation records say. */
  private async withRevocations(agent: AgentDoc | null): Promise<AgentDoc | null> {
    if (!agent) return null;
    const keys = Object.values(agent.keys);
    const records = await Promise.all(keys.map((k) => this.revocations.findOne({ _id: `${agent._id}#${k.keyId}` })));
    const merged: Record<string, AgentKeyDoc> = {};
    keys.forEach((k, i) => {
      const revoked = records[i];
      merged[k.keyId] = revoked ? { ...k, status: 'revoked', revokedAt: revoked.revokedAt } : k;
    });
    return { ...agent, keys: merged };
  }

  /**
   * Agent ids are global (wallets are keyed by them), so a new agent needs its namespace to be the tenant's (see
   * domain/agent-ids.ts); AGENT_EXISTS then only ever names the tenant's own agents.
   */
  async create(tenantId: string, agent: Omit<AgentDoc, 'tenantId'>): Promise<AgentDoc> {
    const namespace = namespaceOf(agent._id);
    if (namespace !== SHARED_NAMESPACE) await this.claimNamespace(tenantId, namespace);
    const doc: AgentDoc = { ...agent, tenantId };
    if (await insertFirst(this.agents, doc)) return doc;
    // An agent registered before namespaces were claimed may be another tenant's: refused as its namespace would be.
    const existing = await this.agents.findOne({ _id: agent._id });
    if (existing && existing.tenantId !== tenantId) throw namespaceTaken(namespace);
    throw serviceError('AGENT_EXISTS', `agent ${agent._id} already exists`);
  }

  /** The agent if it belongs to the tenant (looked up by id alone; another tenant's agent is simply not found). */
  async get(tenantId: string, agentId: string): Promise<AgentDoc | null> {
    const agent = await this.agents.findOne({ _id: agentId });
    return agent?.tenantId === tenantId ? this.withRevocations(agent) : null;
  }

  /** Any tenant's agent: for evidence that names agents outside the caller's tenant (artifacts, payers). */
  async getAny(agentId: string): Promise<AgentDoc | null> {
    return this.withRevocations(await this.agents.findOne({ _id: agentId }));
  }

  /** Whether the agent exists and is the tenant's: one read, keys' revocations left out. */
  async belongsTo(tenantId: string, agentId: string): Promise<boolean> {
    return (await this.agents.findOne({ _id: agentId }, { projection: { tenantId: 1 } }))?.tenantId === tenantId;
  }

  /** Shows the agent as wound down: a cache of its wind-down record (store/x402.ts), which is the truth. */
  async markWoundDown(agentId: string): Promise<void> {
    await this.agents.updateOne({ _id: agentId }, { $set: { status: 'wound_down' } });
  }

  async addKey(tenantId: string, agentId: string, key: AgentKeyDoc): Promise<AgentDoc> {
    const agent = await this.get(tenantId, agentId);
    if (!agent) throw errors.notFound('agent');
    if (Object.hasOwn(agent.keys, key.keyId)) {
      throw serviceError('KEY_EXISTS', `key ${key.keyId} is already registered for this agent`, {
        keyId: key.keyId,
      });
    }
    // A key added concurrently to the same agent can be lost on FerretDB (docs/money.md, "Why unique inserts");
    // events it signs then fail closed with SIGNATURE_INVALID, and the key can be added again.
    await this.agents.updateOne({ _id: agentId }, { $set: { [`keys.${key.keyId}`]: key } });
    return { ...agent, keys: { ...agent.keys, [key.keyId]: key } };
  }

  async revokeKey(tenantId: string, agentId: string, keyId: string, now = new Date()): Promise<AgentKeyDoc> {
    const agent = await this.get(tenantId, agentId);
    const key = agent && Object.hasOwn(agent.keys, keyId) ? agent.keys[keyId] : undefined;
    if (!key) throw errors.notFound('agent key');
    if (key.status === 'revoked') return key;
    // If revoked concurrently, the first record stands.
    await insertFirst(this.revocations, { _id: `${agentId}#${keyId}`, agentId, keyId, revokedAt: now });
    // Cache only (see KeyRevocationDoc); reads overlay the records either way.
    await this.agents.updateOne(
      { _id: agentId },
      { $set: { [`keys.${keyId}.status`]: 'revoked', [`keys.${keyId}.revokedAt`]: now } },
    );
    const after = (await this.get(tenantId, agentId))?.keys[keyId];
    if (!after) throw errors.notFound('agent key');
    return after;
  }
}

function namespaceTaken(namespace: string): ServiceError {
  return serviceError(
    'AGENT_NAMESPACE_TAKEN',
    `the namespace "${namespace}" belongs to another tenant; register agents in a namespace of your own`,
    { namespace },
  );
}
