import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';

/** Either a single Redis or a Redis Cluster; every Redis client of the service is built by `createRedisClient`. */
export type RedisClient = Redis | Cluster;

const CLUSTER_SCHEME = 'redis+cluster:';

/** `redis+cluster://host:port,host:port` names a cluster by some of its nodes; `redis://` / `rediss://` one server. */
export function isClusterUrl(url: string): boolean {
  return url.startsWith(`${CLUSTER_SCHEME}//`);
}

/** The seed nodes of a cluster URL, or null when the URL is not one (or names no node). */
export function clusterNodes(url: string): Array<{ host: string; port: number }> | null {
  if (!isClusterUrl(url)) return null;
  const list = url.slice(CLUSTER_SCHEME.length + 2).split('/')[0]!;
  const nodes = list.split(',').map((item) => {
    const match = /^([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\]):(\d{1,5})$/.exec(item.trim());
    return match ? { host: match[1]!.replace(/^\[|\]$/g, ''), port: Number(match[2]) } : null;
  });
  if (nodes.length === 0 || nodes.some((n) => n === null || n.port < 1 || n.port > 65535)) return null;
  return nodes as Array<{ host: string; port: number }>;
}

/**
 * A client for `url`. For a cluster, `options` apply to every node connection, and `enableOfflineQueue` and
 * `lazyConnect` to the cluster client itself (where ioredis reads them); the retry strategy also reconnects the
 * cluster as a whole, so a client rides out a failover and a restart by itself.
 */
export function createRedisClient(url: string, options: RedisOptions): RedisClient {
  const nodes = clusterNodes(url);
  if (!nodes) return new Redis(url, options);
  const { enableOfflineQueue, lazyConnect, retryStrategy, ...nodeOptions } = options;
  const clusterOptions: ClusterOptions = {
    redisOptions: nodeOptions,
    ...(enableOfflineQueue !== undefined ? { enableOfflineQueue } : {}),
    ...(lazyConnect !== undefined ? { lazyConnect } : {}),
    ...(retryStrategy ? { clusterRetryStrategy: (attempts: number) => retryStrategy(attempts) } : {}),
    // After a failover the slots move. A command timeout (the API's) fails a command sent to the dead master before
    // ioredis sees the error that would make it ask the cluster again, so it asks every second regardless.
    slotsRefreshInterval: 1_000,
    slotsRefreshTimeout: 1_000,
    retryDelayOnFailover: 200,
    retryDelayOnClusterDown: 200,
  };
  return new Cluster(nodes, clusterOptions);
}
