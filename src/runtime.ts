import type { Db, MongoClient } from 'mongodb';
import type { Logger } from 'pino';
import type { Config } from './config.ts';
import { DependencyOutages, watchRedis } from './outages.ts';
import { jobsRoutedToUnconsumedPartition } from './metrics.ts';
import { Producers } from './queues/index.ts';
import { createRedisClient, isClusterUrl, type RedisClient } from './redis.ts';
import { CredentialCache } from './store/credentials.ts';
import { loadServiceKeys, type ServiceKeyRing } from './signing.ts';
import { AgentStore } from './store/agents.ts';
import { ConsoleSessionStore } from './store/console-sessions.ts';
import { ApiKeyStore } from './store/api-keys.ts';
import { ensureIndexes } from './store/indexes.ts';
import { createMongoClient, MongoHealthWatch } from './store/mongo.ts';
import { McpAgentKeyStore } from './store/mcp-agent-keys.ts';
import { OnboardingStore } from './store/onboarding.ts';
import { OutboxStore } from './store/outbox.ts';
import { RunStore } from './store/runs.ts';
import { LedgerStore } from './store/ledger.ts';
import { ListIndex } from './store/list-index.ts';
import { LedgerDueIndex } from './store/ledger-due.ts';
import { SettlementStore } from './store/settlements.ts';
import { ReserveStore } from './store/reserves.ts';
import { LedgerAuditStore } from './store/ledger-audit.ts';
import { SweepParkedIndex } from './store/sweep-parked.ts';
import { TenantStore } from './store/tenants.ts';
import { WebhookDeliveryStore } from './store/webhook-deliveries.ts';
import { WebhookRetentionIndex } from './store/webhook-retention.ts';
import { WebhookDueIndex } from './store/webhook-due.ts';
import { WebhookEndpointStore } from './store/webhook-endpoints.ts';
import { X402Store } from './store/x402.ts';
import { X402SessionStore } from './store/x402-sessions.ts';
import { RedisLineageStore } from './store/redis-lineage.ts';

/** Everything a process shares: connections, producers and stores, each built once here (main.ts or a test builds the runtime). */
export interface Runtime {
  config: Config;
  logger: Logger;
  /** One line when Redis or MongoDB goes away and one when it is back, with the failures counted in between. */
  outages: DependencyOutages;
  mongo: MongoClient;
  /** Whether MongoDB is reachable and how long its oldest command in flight has waited (the request deadline reads it). */
  mongoWatch: MongoHealthWatch;
  db: Db;
  /** Commands fail at once while Redis is unreachable, so HTTP requests answer 503 instead of hanging. */
  redis: RedisClient;
  producers: Producers;
  stores: {
    tenants: TenantStore;
    apiKeys: ApiKeyStore;
    consoleSessions: ConsoleSessionStore;
    outbox: OutboxStore;
    agents: AgentStore;
    runs: RunStore;
    ledger: LedgerStore;
    settlements: SettlementStore;
    reserves: ReserveStore;
    ledgerAudit: LedgerAuditStore;
    sweepParked: SweepParkedIndex;
    webhookEndpoints: WebhookEndpointStore;
    webhookDeliveries: WebhookDeliveryStore;
    webhookDue: WebhookDueIndex;
    onboarding: OnboardingStore;
    mcpAgentKeys: McpAgentKeyStore;
    x402: X402Store;
    x402Sessions: X402SessionStore;
    /** Which Redis processes hold the keys, so a restart or failover (which may lose writes) is noticed. */
    redisLineage: RedisLineageStore;
    /** The list index every "newest first" list pages through (store/list-index.ts). */
    lists: ListIndex;
  };
  keys: ServiceKeyRing;
  /** Cached API keys and agents, invalidated across processes through Redis. */
  credentials: CredentialCache;
  close(): Promise<void>;
}

/**
 * Connects at once (not lazily) and keeps reconnecting for ever. BullMQ's queues share this client, and a BullMQ
 * queue handed a client that has not started connecting calls `connect()` itself: if Redis is down at that moment,
 * that queue stays broken ("Connection is closed") for the life of the process, even once Redis is back. A client
 * already connecting or reconnecting is waited for instead.
 */
export function createApiRedis(config: Config, outages: DependencyOutages): RedisClient {
  const redis = createRedisClient(config.redisUrl, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    // A hung Redis (the socket open, nothing answering) fails each command instead of leaving it waiting for ever.
    commandTimeout: config.redisCommandTimeoutMs,
    connectTimeout: 2_000,
    // Keep trying to reconnect for ever: the API recovers by itself when Redis returns.
    retryStrategy: (attempt) => Math.min(attempt * 200, 2_000),
  });
  watchRedis(redis, outages);
  return redis;
}

/**
 * Reports MongoDB's reachability to the process's outage log from the driver's monitoring and pool events (always
 * emitted, unlike command monitoring). A busy process learns of a lost server from its pool (a connection cannot be
 * made) before the monitor's next heartbeat (every 10 s), and of its return from the first connection made again.
 */
export function watchMongo(mongo: MongoClient, outages: DependencyOutages): void {
  mongo.on('serverHeartbeatFailed', (e) => outages.lost('mongodb', mongo, e.failure));
  mongo.on('connectionCheckOutFailed', (e) => {
    if (e.reason === 'connectionError') outages.lost('mongodb', mongo, 'no connection could be made');
  });
  mongo.on('connectionReady', () => outages.reached('mongodb', mongo));
  mongo.on('serverHeartbeatSucceeded', () => outages.reached('mongodb', mongo));
  mongo.on('topologyDescriptionChanged', (e) => {
    if (e.newDescription.hasDataBearingServers) outages.reached('mongodb', mongo);
    else if (e.previousDescription.hasDataBearingServers)
      outages.lost('mongodb', mongo, e.newDescription.error ?? undefined);
  });
}

/** Builds the runtime; Redis starts connecting here (createApiRedis), `connectRuntime` then opens MongoDB. */
export function createRuntime(config: Config, logger: Logger): Runtime {
  const outages = new DependencyOutages(logger);
  const mongo = createMongoClient(config);
  watchMongo(mongo, outages);
  const db = mongo.db(config.mongoDb);
  const redis = createApiRedis(config, outages);
  const producers = new Producers(
    redis,
    config.redisPrefix,
    isClusterUrl(config.redisUrl),
    (cause) => {
      if (!outages.countIfDown('redis')) logger.warn({ cause }, 'job queue unavailable: answering 503');
    },
    {
      partitions: config.queues.partitions,
      readPartitions: config.queues.readPartitions,
      // A partition no worker consumes keeps its jobs (nothing is lost) but runs none: one line when found, a count.
      onCoverage: ({ kind, queue, partition, name }) => {
        if (kind === 'routed') jobsRoutedToUnconsumedPartition.inc({ queue, partition: String(partition) });
        else if (kind === 'unconsumed')
          logger.error(
            { alert: 'partition_unconsumed', queue, partition, name },
            'jobs are routed to a queue partition no worker consumes; they wait there (check WORKER_PARTITIONS)',
          );
        else logger.info({ queue, partition, name }, 'queue partition has a worker again');
      },
    },
  );
  // Producers' queues share `redis`; their own `error` events repeat what its listener above already counted.
  for (const queue of Object.values(producers.partitions).flat()) queue.on('error', (err) => outages.absorb(err));
  // The due indexes are split like the hot queues, each entry in its job's partition (docs/queues.md).
  const duePartitions = { partitions: config.queues.partitions, readPartitions: config.queues.readPartitions };
  const webhookDue = new WebhookDueIndex(db, redis, config.redisPrefix, duePartitions);
  // One list index for every store that lists its rows (runs, settlements, gates, sessions, ...).
  // Spread over the cluster (a hash tag per set) once the hot queues are split: see list-index.ts.
  const lists = new ListIndex(
    redis,
    config.redisPrefix,
    config.lists.retentionDays * 86_400_000,
    isClusterUrl(config.redisUrl) && config.queues.partitions > 1,
  );
  const ledgerDue = new LedgerDueIndex(redis, config.redisPrefix, duePartitions);
  const ledger = new LedgerStore(db, ledgerDue);
  return {
    config,
    logger,
    outages,
    mongo,
    mongoWatch: new MongoHealthWatch(mongo),
    db,
    redis,
    producers,
    stores: {
      tenants: new TenantStore(db),
      apiKeys: new ApiKeyStore(db),
      consoleSessions: new ConsoleSessionStore(redis, config.redisPrefix),
      outbox: new OutboxStore(db, webhookDue, redis, config.redisPrefix),
      agents: new AgentStore(db),
      runs: new RunStore(db, redis, config.redisPrefix, lists, duePartitions),
      ledger,
      settlements: new SettlementStore(db, redis, config.redisPrefix, lists, duePartitions),
      reserves: new ReserveStore(db),
      ledgerAudit: new LedgerAuditStore(db, redis, config.redisPrefix, ledger, ledgerDue),
      sweepParked: new SweepParkedIndex(redis, config.redisPrefix),
      webhookEndpoints: new WebhookEndpointStore(db, redis, config.redisPrefix, config.atRestKey),
      webhookDeliveries: new WebhookDeliveryStore(
        db,
        redis,
        config.redisPrefix,
        webhookDue,
        new WebhookRetentionIndex(redis, config.redisPrefix),
      ),
      webhookDue,
      onboarding: new OnboardingStore(db),
      mcpAgentKeys: new McpAgentKeyStore(db),
      x402: new X402Store(db, redis, config.redisPrefix, lists, duePartitions),
      x402Sessions: new X402SessionStore(db, redis, config.redisPrefix, lists, duePartitions),
      redisLineage: new RedisLineageStore(db, redis),
      lists,
    },
    keys: loadServiceKeys(config),
    credentials: new CredentialCache(redis, config.redisUrl, config.redisPrefix, logger, outages),
    async close() {
      await this.credentials.close();
      await producers.close().catch(() => undefined);
      redis.disconnect();
      await mongo.close().catch(() => undefined);
    },
  };
}

/** How long start-up waits for Redis before going on without it (it reconnects by itself; see connectRuntime). */
const REDIS_START_WAIT_MS = 5_000;

/**
 * Opens MongoDB and ensures indexes, retrying until it answers or `timeoutMs` passes. Redis is waited for only
 * briefly: a process started while Redis is down comes up without it (requests that need it answer 503, workers
 * wait) and every Redis client of the process reconnects by itself when it is back.
 */
export async function connectRuntime(runtime: Runtime, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  await redisReady(runtime.redis, Math.min(REDIS_START_WAIT_MS, timeoutMs));
  for (let attempt = 1; ; attempt++) {
    try {
      await runtime.mongo.connect();
      await ensureIndexes(runtime.db, {
        webhookRetentionDays: runtime.config.webhooks.retentionDays,
        logger: runtime.logger,
      });
      await runtime.credentials.start();
      return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      // The first attempts are the common case (the services still starting); then a line every few seconds.
      if (attempt === 1 || attempt % 10 === 0)
        runtime.logger.warn({ attempt, err: (err as Error).message }, 'waiting for MongoDB');
      await new Promise((resolve) => setTimeout(resolve, Math.min(attempt * 250, 2_000)));
    }
  }
}

/** Resolves true once `client` is ready, false when `ms` passes first or it was closed (it keeps reconnecting). */
function redisReady(client: RedisClient, ms: number): Promise<boolean> {
  // A cluster client reports 'connect' once it has its slots (BullMQ treats it as ready too).
  const isReady = () => client.status === 'ready' || (client.status === 'connect' && client.isCluster);
  if (isReady()) return Promise.resolve(true);
  if (client.status === 'end') return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (ready: boolean) => {
      clearTimeout(timer);
      client.off('ready', onReady);
      client.off('end', onEnd);
      resolve(ready);
    };
    const onReady = () => done(true);
    const onEnd = () => done(false);
    const timer = setTimeout(() => done(false), ms);
    client.once('ready', onReady);
    client.once('end', onEnd);
  });
}
