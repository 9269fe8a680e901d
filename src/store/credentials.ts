import { errors } from '../domain/errors.ts';
import { unreachableDependency, watchRedis, type DependencyOutages } from '../outages.ts';
import { createRedisClient, type RedisClient } from '../redis.ts';
import type { Logger } from 'pino';
import type { AgentDoc, AgentStore } from './agents.ts';
import { isActiveKey, isLiveKey, parseToken, type ApiKeyDoc, type ApiKeyStore } from './api-keys.ts';

/** Longest an entry is trusted even without an invalidation (a safety net; invalidations are the real mechanism). */
const ENTRY_TTL_MS = 60_000;
const MAX_ENTRIES = 10_000;

interface Entry<T> {
  value: T;
  until: number;
}

/** An agent as cached: its document, and whether it is wound down (null until a lifecycle check has read the fact). */
interface CachedAgent {
  doc: AgentDoc | null;
  woundDown: boolean | null;
}

/** What an x402 lifecycle check needs of an agent. */
export interface AgentLifecycle {
  agent: AgentDoc | null;
  woundDown: boolean;
}

/**
 * In-process caches of what every request and every append reads: API keys (authentication) and agents with their
 * keys (event signatures) and, once an x402 check has asked, whether they are wound down. A revocation, rotation,
 * key change or wind-down is published on Redis and every process drops the entry at once, so it takes effect
 * everywhere within the pub/sub latency (well under a second). While the subscription is not live, nothing is served
 * from the cache (fail closed: every read goes to MongoDB), and the cache is emptied when it comes back, since
 * invalidations may have been missed meanwhile.
 */
export class CredentialCache {
  private readonly apiKeys = new Map<string, Entry<ApiKeyDoc | null>>();
  private readonly agents = new Map<string, Entry<CachedAgent>>();
  /** x402 wallet policies in force: no credential, but read on every authorization and changed as rarely. */
  private readonly policies = new Map<string, Entry<unknown>>();
  private subscriber: RedisClient | null = null;
  private live = false;
  /** Bumped by every drop: a load that started before an invalidation must not be cached after it. */
  private generation = 0;
  private readonly channel: string;

  constructor(
    private readonly publisher: RedisClient,
    private readonly redisUrl: string,
    redisPrefix: string,
    private readonly logger: Logger,
    /** The process's outage log: the subscriber is one of its Redis connections (one line per outage, not per attempt). */
    private readonly outages: DependencyOutages,
  ) {
    this.channel = `${redisPrefix}:credentials:invalidate`;
  }

  /**
   * Subscribes to invalidations; until this succeeds the cache stays bypassed. Redis down at start is no failure: the
   * subscriber keeps reconnecting and the cache goes live once it has subscribed.
   */
  async start(): Promise<void> {
    const subscriber = createRedisClient(this.redisUrl, {
      lazyConnect: true,
      maxRetriesPerRequest: null,
      retryStrategy: (n) => Math.min(n * 200, 2_000),
    });
    this.subscriber = subscriber;
    // Its errors and reconnects count into the process's Redis outage, which lasts until this connection is back too.
    watchRedis(subscriber, this.outages);
    subscriber.on('close', () => this.goDark());
    subscriber.on('ready', () => {
      // ioredis re-subscribes on reconnect; until it confirms, stay dark (see the subscribe callback).
      void subscriber
        .subscribe(this.channel)
        .then(() => this.goLive())
        .catch((err: unknown) => {
          this.goDark();
          if (!this.outages.absorb(err))
            this.logger.warn(
              { err: (err as Error).message },
              'credential cache: could not subscribe to invalidations; caching off',
            );
        });
    });
    subscriber.on('message', (_channel: string, message: string) => this.drop(message));
    await subscriber.connect().catch((err: unknown) => {
      // A connection failure is counted already (watchRedis saw its 'error'); anything else is worth a line.
      if (!unreachableDependency(err))
        this.logger.warn(
          { err: (err as Error).message },
          'credential cache: invalidation channel unavailable; caching off until it is back',
        );
    });
  }

  async close(): Promise<void> {
    this.goDark();
    this.subscriber?.disconnect();
    this.subscriber = null;
  }

  /** Whether entries are served from memory (the invalidation channel is subscribed). */
  isLive(): boolean {
    return this.live;
  }

  private goLive(): void {
    this.clear();
    this.live = true;
  }

  private goDark(): void {
    this.live = false;
    this.clear();
  }

  private clear(): void {
    this.generation++;
    this.apiKeys.clear();
    this.agents.clear();
    this.policies.clear();
  }

  private drop(message: string): void {
    this.generation++;
    const [kind, id] = [message.slice(0, message.indexOf(':')), message.slice(message.indexOf(':') + 1)];
    if (kind === 'key') this.apiKeys.delete(id);
    else if (kind === 'agent') this.agents.delete(id);
    else if (kind === 'policy') this.policies.delete(id);
    else this.clear();
  }

  /**
   * Drops the entry here at once and in every other process through Redis. `required`: a failed publish throws (503)
   * instead of only alerting, for changes that must not be served stale by another process (a wind-down).
   */
  async invalidate(kind: 'key' | 'agent' | 'policy', id: string, options: { required?: boolean } = {}): Promise<void> {
    this.drop(`${kind}:${id}`);
    await this.publisher.publish(this.channel, `${kind}:${id}`).catch((err: Error) => {
      // Another process may now serve the old entry until its TTL; say so loudly.
      this.logger.error(
        { alert: 'credential_invalidation_failed', kind, id, err: err.message },
        'could not publish a credential invalidation',
      );
      if (options.required) throw errors.unavailable('could not tell the other processes of the change; retry');
    });
  }

  private async cached<T>(
    map: Map<string, Entry<T>>,
    id: string,
    load: () => Promise<T>,
    usable: (value: T) => boolean = () => true,
  ): Promise<T> {
    if (!this.live) return load();
    const now = Date.now();
    const hit = map.get(id);
    if (hit && hit.until > now && usable(hit.value)) return hit.value;
    const generation = this.generation;
    const value = await load();
    if (this.live && generation === this.generation) {
      if (map.size >= MAX_ENTRIES) map.delete(map.keys().next().value!);
      map.set(id, { value, until: now + ENTRY_TTL_MS });
    }
    return value;
  }

  /** The key a bearer token names, if its secret matches and the key is live (ApiKeyStore.authenticate, cached). */
  async authenticate(store: ApiKeyStore, token: string, now = new Date()): Promise<ApiKeyDoc | null> {
    const parsed = parseToken(token);
    if (!parsed) return null;
    const key = await this.cached(this.apiKeys, parsed.keyId, () => store.get(parsed.keyId));
    return key && isLiveKey(key, parsed.secret, now) ? key : null;
  }

  /**
   * The key with this id if it is live now (not revoked, not expired), cached like `authenticate`: for a console
   * session, which holds the key id of its sign-in and never the secret, so a revocation ends the session at once.
   */
  async liveKeyById(store: ApiKeyStore, keyId: string, now = new Date()): Promise<ApiKeyDoc | null> {
    const key = await this.cached(this.apiKeys, keyId, () => store.get(keyId));
    return key && isActiveKey(key, now) ? key : null;
  }

  /** The policy in force for a wallet, as `load` reads it; every new version invalidates it (x402 putPolicy). */
  policy<T>(walletId: string, load: () => Promise<T>): Promise<T> {
    return this.cached(this.policies as Map<string, Entry<T>>, walletId, load);
  }

  /** Any tenant's agent with its keys' revocations applied; the caller checks the tenant. */
  async agent(store: AgentStore, agentId: string): Promise<AgentDoc | null> {
    return (
      await this.cached(this.agents, agentId, async () => ({ doc: await store.getAny(agentId), woundDown: null }))
    ).doc;
  }

  /**
   * Any tenant's agent and whether it is wound down (`isWoundDown` reads the wind-down fact), both cached in one
   * entry: the wind-down publishes the agent's invalidation right after recording its fact, so every process drops
   * the entry and reads the fact afresh. An entry cached without the fact (by `agent`) is read again here.
   */
  async agentLifecycle(
    store: AgentStore,
    agentId: string,
    isWoundDown: (agentId: string) => Promise<boolean>,
  ): Promise<AgentLifecycle> {
    const entry = await this.cached(
      this.agents,
      agentId,
      async () => {
        const [doc, woundDown] = await Promise.all([store.getAny(agentId), isWoundDown(agentId)]);
        return { doc, woundDown };
      },
      (cachedAgent) => cachedAgent.woundDown !== null,
    );
    return { agent: entry.doc, woundDown: entry.woundDown === true };
  }
}
