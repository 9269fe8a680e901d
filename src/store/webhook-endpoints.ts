import type { RedisClient } from '../redis.ts';
import type { Collection, Db } from 'mongodb';
import { decryptAtRest, encryptAtRest, newId } from '../domain/crypto.ts';
import type { EventType } from '../domain/events.ts';
import { generateWebhookSecret } from '../domain/webhook-signing.ts';
import { RevisionLog } from './revisions.ts';
import { Sequence } from './sequence.ts';

// Webhook endpoints (the registry). Every lookup is by exact `_id`:
// - an endpoint is `webhook_endpoints/<endpointId>`, a cache of its latest revision (RevisionLog): rotation,
//   disabling, enabling and deletion are each an inserted revision, so a delivery worker disabling an endpoint can
//   never undo a rotation or revive a deleted endpoint;
// - a tenant's endpoints are `webhook_index/endpoints:<tenantId>#<n>` (a Sequence, n in registration order), read
//   in order at fan-out and listing; a tenant has few endpoints, deleted ones included;
// - delivery health (failing since, last success) is `webhook_endpoint_activity/<endpointId>`, a cache written by
//   whichever worker saw the latest attempt (a lost write only shifts the 5-day failure clock).

export type EndpointStatus = 'active' | 'disabled' | 'revoked';

export interface SealedSecret {
  /** AES-256-GCM, bound to the endpoint id; never the plaintext. */
  sealed: string;
  createdAt: Date;
  /** null for the current secret; when a previous one stops signing deliveries after a rotation. */
  expiresAt: Date | null;
}

export type EndpointDelivery = 'push' | 'pull';

export interface WebhookEndpointDoc {
  _id: string;
  tenantId: string;
  /** Position in the tenant's endpoint index. */
  seq: number;
  /** Where deliveries are POSTed; null for a pull endpoint (`delivery: 'pull'`), which is only read through its feed. */
  url: string | null;
  /** `pull`: nothing is ever sent; its deliveries are stored for the pull feed. Absent on old records: `push`. */
  delivery?: EndpointDelivery;
  events: EventType[];
  description: string | null;
  /** Also receives test traffic (events marked `test: true`, e.g. onboarding's first paid call); absent on old records. */
  includeTestEvents?: boolean;
  createdAt: Date;
  rev: number;
  status: EndpointStatus;
  disabledReason: string | null;
  disabledAt: Date | null;
  revokedAt: Date | null;
  /** secrets[0] is the current secret; the others are previous ones still inside their grace period. */
  secrets: SealedSecret[];
  updatedAt: Date;
}

interface ActivityDoc {
  _id: string;
  /** First failed attempt since the last success; null while the endpoint is healthy. */
  failingSince: Date | null;
  lastSuccessAt: Date | null;
  /** Parked deliveries up to this position have been replayed (see WebhookDeliveryStore.parked). */
  replayedThrough: number;
}

export type WebhookEndpoint = WebhookEndpointDoc &
  Pick<ActivityDoc, 'failingSince' | 'lastSuccessAt' | 'replayedThrough'>;

/** Never more than this many secrets sign a delivery (the current one plus previous ones in their grace period). */
const MAX_SECRETS = 5;

export class WebhookEndpointStore {
  readonly log: RevisionLog<WebhookEndpointDoc>;
  readonly byTenant: Sequence<{ endpointId: string }>;
  readonly activity: Collection<ActivityDoc>;

  constructor(
    db: Db,
    redis: RedisClient,
    counterPrefix: string,
    private readonly encryptionKey: Buffer,
  ) {
    this.log = new RevisionLog<WebhookEndpointDoc>(db, 'webhook_endpoints', 'webhook_endpoint_revisions');
    this.byTenant = new Sequence<{ endpointId: string }>(db, 'webhook_index', redis, counterPrefix);
    this.activity = db.collection<ActivityDoc>('webhook_endpoint_activity');
  }

  /**
   * Registers an endpoint; the plaintext secret is returned once and only its sealed form is stored. The index
   * entry comes first: a crash before the endpoint's insert leaves an entry pointing at nothing, which readers skip.
   */
  async create(
    tenantId: string,
    input: {
      url: string | null;
      delivery: EndpointDelivery;
      events: EventType[];
      description: string | null;
      includeTestEvents: boolean;
    },
  ) {
    const _id = newId('whe');
    const secret = generateWebhookSecret();
    const seq = await this.byTenant.append(tenantOwner(tenantId), { endpointId: _id });
    // Taken after the index position exists: an event emitted before it may have found no endpoint (emitEvent).
    const now = new Date();
    const doc: WebhookEndpointDoc = {
      _id,
      tenantId,
      seq,
      url: input.url,
      delivery: input.delivery,
      events: input.events,
      description: input.description,
      includeTestEvents: input.includeTestEvents,
      createdAt: now,
      rev: 0,
      status: 'active',
      disabledReason: null,
      disabledAt: null,
      revokedAt: null,
      secrets: [{ sealed: encryptAtRest(this.encryptionKey, secret, _id), createdAt: now, expiresAt: null }],
      updatedAt: now,
    };
    const activity: ActivityDoc = { _id, failingSince: null, lastSuccessAt: null, replayedThrough: 0 };
    await this.activity.insertOne(activity);
    await this.log.create(doc);
    return { endpoint: withActivity(doc, activity), secret };
  }

  /** Any endpoint by id, deleted ones included (the caller checks the tenant and the status). */
  async get(id: string): Promise<WebhookEndpoint | null> {
    const [doc, activity] = await Promise.all([this.log.get(id), this.activity.findOne({ _id: id })]);
    return doc ? withActivity(doc, activity) : null;
  }

  /** Whether the tenant ever started to register an endpoint (deleted ones included): whether its events fan out. */
  async anyRegistered(tenantId: string): Promise<boolean> {
    return !(await this.byTenant.isEmpty(tenantOwner(tenantId)));
  }

  /** Every endpoint the tenant ever registered, oldest first, deleted ones included. */
  async allOfTenant(tenantId: string): Promise<WebhookEndpoint[]> {
    const owner = tenantOwner(tenantId);
    const head = await this.byTenant.head(owner);
    const entries = await Promise.all(Array.from({ length: head }, (_, i) => this.byTenant.get(owner, i + 1)));
    const endpoints = await Promise.all(entries.map((e) => (e ? this.get(e.endpointId) : null)));
    // An entry counts only if the endpoint was created with its position (see create()).
    return endpoints.filter(
      (e, i): e is WebhookEndpoint => e !== null && e.tenantId === tenantId && e.seq === entries[i]!.n,
    );
  }

  /** Applies one change as the endpoint's next revision; null when another change got there first. */
  async change(current: WebhookEndpointDoc, changes: Partial<WebhookEndpointDoc>): Promise<WebhookEndpointDoc | null> {
    return this.log.commit(stripActivity(current), { ...changes, updatedAt: new Date() });
  }

  /** The secrets after a rotation: new current one; the old current keeps signing until now + grace (0 drops it). */
  rotatedSecrets(
    current: WebhookEndpointDoc,
    graceSeconds: number,
    now: Date,
  ): { secrets: SealedSecret[]; secret: string } {
    const secret = generateWebhookSecret();
    const [head, ...older] = current.secrets;
    const previous: SealedSecret[] = [];
    if (head && graceSeconds > 0) previous.push({ ...head, expiresAt: new Date(now.getTime() + graceSeconds * 1000) });
    for (const s of older) if (s.expiresAt && s.expiresAt.getTime() > now.getTime()) previous.push(s);
    const secrets = [
      { sealed: encryptAtRest(this.encryptionKey, secret, current._id), createdAt: now, expiresAt: null },
      ...previous.slice(0, MAX_SECRETS - 1),
    ];
    return { secrets, secret };
  }

  /** Plaintext secrets that sign a delivery made now: the current one, then previous ones still in their grace. */
  signingSecrets(endpoint: WebhookEndpointDoc, now: Date = new Date()): string[] {
    const [current, ...previous] = endpoint.secrets;
    if (!current) throw new Error(`endpoint ${endpoint._id} has no secret`);
    const secrets = [decryptAtRest(this.encryptionKey, current.sealed, endpoint._id)];
    for (const s of previous) {
      if (s.expiresAt === null || s.expiresAt.getTime() <= now.getTime()) continue;
      try {
        secrets.push(decryptAtRest(this.encryptionKey, s.sealed, endpoint._id));
      } catch {
        // An unreadable previous secret only loses its extra signature; the current one still signs.
      }
    }
    return secrets;
  }

  // ---- Activity: a cache, created with the endpoint (read, decide in code, write by _id).

  async markSuccess(id: string, at: Date): Promise<void> {
    await this.activity.updateOne({ _id: id }, { $set: { lastSuccessAt: at, failingSince: null } });
  }

  /** Starts the failure clock (the caller has seen that it is not running). */
  async markFailing(id: string, since: Date): Promise<void> {
    await this.activity.updateOne({ _id: id }, { $set: { failingSince: since } });
  }

  async clearFailing(id: string): Promise<void> {
    await this.activity.updateOne({ _id: id }, { $set: { failingSince: null } });
  }

  async markReplayedThrough(id: string, position: number): Promise<void> {
    await this.activity.updateOne({ _id: id }, { $set: { replayedThrough: position } });
  }
}

function tenantOwner(tenantId: string): string {
  return `endpoints:${tenantId}`;
}

function withActivity(doc: WebhookEndpointDoc, activity: ActivityDoc | null): WebhookEndpoint {
  return {
    ...doc,
    failingSince: activity?.failingSince ?? null,
    lastSuccessAt: activity?.lastSuccessAt ?? null,
    replayedThrough: activity?.replayedThrough ?? 0,
  };
}

function stripActivity(endpoint: WebhookEndpointDoc | WebhookEndpoint): WebhookEndpointDoc {
  const { failingSince: _f, lastSuccessAt: _l, replayedThrough: _r, ...doc } = endpoint as WebhookEndpoint;
  return doc;
}
