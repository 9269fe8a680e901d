import { hkdfSync } from 'node:crypto';
import { MongoClient } from 'mongodb';
import {
  DEFAULT_LEGACY_NETWORKS_UNTIL,
  DEFAULT_X402_NETWORK,
  LEGACY_X402_NETWORK_NAMESPACE,
  LEGACY_X402_NETWORK_PATTERN,
  X402_NETWORK_PATTERN,
} from './domain/x402.ts';
import { clusterNodes, isClusterUrl } from './redis.ts';

// The only place that reads process.env: the environment becomes one typed, validated object at start-up, and a
// bad value stops the process with a message naming the variable.

export interface RateLimitPolicy {
  limit: number;
  windowSeconds: number;
}

export interface Config {
  env: 'development' | 'test' | 'production';
  host: string;
  port: number;
  logLevel: string;
  mongoUrl: string;
  mongoDb: string;
  /** How long a MongoDB operation may wait for a server before the API answers 503. */
  mongoServerSelectionTimeoutMs: number;
  /** The driver's command monitoring (commandStarted/Succeeded events): for tests and diagnostics; it costs CPU per command. */
  mongoCommandMonitoring: boolean;
  /**
   * How long a request may wait on a stalled backend: at this point, a request still unanswered while MongoDB has a
   * command pending for more than half of it (or is unreachable), or Redis is unreachable, answers 503.
   */
  requestDeadlineMs: number;
  redisUrl: string;
  /** Bound on each Redis command of the API connection, so a hung Redis makes a request answer 503, not hang. */
  redisCommandTimeoutMs: number;
  /** Prefix for every Redis key (queues, idempotency, rate limits); lets several deployments share one Redis. */
  redisPrefix: string;
  adminKey: string;
  idempotencyTtlSeconds: number;
  rateLimit: RateLimitPolicy;
  metricsPublic: boolean;
  shutdownTimeoutMs: number;
  workerConcurrency: number;
  /** Where links to this service point (the JWKS URL in verification answers). */
  publicBaseUrl: string;
  signing: {
    /** Active Ed25519 private key (PEM or a path to one); null in development means "generate once into keyFile". */
    activeKey: string | null;
    /** Retired keys (PEM or paths), still published in the JWKS so old artifacts keep verifying. */
    retiredKeys: string[];
    keyFile: string;
  };
  /**
   * The at-rest key (32 bytes, `WEBHOOK_SECRET_KEY`): seals webhook endpoint secrets, MCP agent keys, replayable
   * responses and onboarding hand-offs in Redis, and derives the key of event-batch attestations.
   */
  atRestKey: Buffer;
  webhooks: {
    allowInsecureUrls: boolean;
    allowPrivateAddresses: boolean;
    /** Multiplies the retry schedule (tests use a small fraction). */
    retryScale: number;
    timeoutMs: number;
    /** Days deliveries, their attempts and parked records are kept (then a TTL index removes them, on MongoDB). */
    retentionDays: number;
  };
  x402: {
    /** CAIP-2 network id (`agentstl:<deployment>`) this deployment's x402 payment requirements name. */
    network: `${string}:${string}`;
    /** Ids used before CAIP-2, still accepted on payments (never advertised as a kind) until legacyNetworksUntil. */
    legacyNetworks: string[];
    legacyNetworksUntil: Date;
    /** How long a funded gate nobody authorized keeps its reserve (longer while its current quote lives). */
    gateTtlSeconds: number;
    /** How long after an authorization's token expires the call may still be reported; then the payer is refunded. */
    authorizationGraceSeconds: number;
  };
  lists: {
    /**
     * Days a row stays in the lists (`GET /v1/runs` and the others); 0 keeps every row. Each row costs Redis about
     * 180 bytes in each of its 3 to 4 sorted sets; older rows stay readable by id.
     */
    retentionDays: number;
  };
  reserves: {
    /** A run's escrow reserve not captured by its settlement this long after it was locked goes back to the payer. */
    runDeadlineSeconds: number;
  };
  queues: {
    /** K: how many partitions each hot queue (settle, x402-verify, webhook-dispatch, finalize) is split over. */
    partitions: number;
    /** How many partitions workers consume and sweepers read (at least K; the old K while K is being lowered). */
    readPartitions: number;
    /** The partitions of the hot queues this worker process consumes; null: every one. */
    workerPartitions: number[] | null;
  };
  sweeper: {
    intervalMs: number;
    /** Work older than this in a pending state without a live job is re-enqueued. */
    staleAfterMs: number;
  };
  onboarding: {
    /** 32-byte HMAC key of the buyer session cookies; also derives the first paid call's per-attempt credentials. */
    sessionSecret: Buffer;
    buyerSessionTtlSeconds: number;
    /** How long the smoke test's MCP server may take for all its steps before it is killed. */
    smokeTestTimeoutMs: number;
    /**
     * Tests only (refused in production): a script run as `node <script> mcp` instead of the shipped launcher, so a
     * test can start a server that crashes or hangs.
     */
    smokeTestEntryForTests: string | null;
    /** Budget of conformance-matrix calls per tenant. */
    conformanceRateLimit: RateLimitPolicy;
  };
  mcp: {
    /** Origins besides PUBLIC_BASE_URL's that /mcp answers (serialized origins, `https://app.example.com`). */
    allowedOrigins: string[];
    /** Whether /mcp answers loopback Host and Origin names (localhost, 127.0.0.1, [::1]) on any port. */
    allowLoopback: boolean;
  };
  console: {
    /** How long a console sign-in lasts (the session is dropped from Redis then, and the page asks again). */
    sessionTtlSeconds: number;
    /** The session cookie's Secure attribute: on everywhere but development (browsers accept it on localhost too). */
    secureCookie: boolean;
  };
}

export class ConfigError extends Error {
  constructor(variable: string, problem: string) {
    super(`configuration: ${variable} ${problem}`);
    this.name = 'ConfigError';
  }
}

type Env = Record<string, string | undefined>;

function str(env: Env, name: string, fallback?: string): string {
  const value = env[name];
  if (value === undefined || value === '') {
    if (fallback === undefined) throw new ConfigError(name, 'is required');
    return fallback;
  }
  return value;
}

function int(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^-?\d+$/.test(raw)) throw new ConfigError(name, `must be an integer, got "${raw}"`);
  const value = Number(raw);
  if (value < min || value > max) throw new ConfigError(name, `must be between ${min} and ${max}, got ${value}`);
  return value;
}

function num(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || !/^[0-9.eE+-]+$/.test(raw))
    throw new ConfigError(name, `must be a number, got "${raw}"`);
  if (value < min || value > max) throw new ConfigError(name, `must be between ${min} and ${max}, got ${value}`);
  return value;
}

function list(env: Env, name: string): string[] {
  return (env[name] ?? '')
    .split(',')
    .map((item) => item.trim())
    .filter(Boolean);
}

/** QUEUE_PARTITIONS, QUEUE_PARTITIONS_DRAIN and WORKER_PARTITIONS, checked against each other (docs/queues.md). */
function queuePartitions(env: Env): Config['queues'] {
  const partitions = int(env, 'QUEUE_PARTITIONS', 1, 1, 256);
  const readPartitions = int(env, 'QUEUE_PARTITIONS_DRAIN', partitions, 1, 256);
  if (readPartitions < partitions) {
    throw new ConfigError(
      'QUEUE_PARTITIONS_DRAIN',
      `must be at least QUEUE_PARTITIONS (${partitions}), got ${readPartitions}`,
    );
  }
  const raw = list(env, 'WORKER_PARTITIONS');
  if (raw.length === 0) return { partitions, readPartitions, workerPartitions: null };
  const workerPartitions = [...new Set(raw)].map((item) => {
    const n = /^\d+$/.test(item) ? Number(item) : NaN;
    if (!(n < partitions)) {
      throw new ConfigError(
        'WORKER_PARTITIONS',
        `must list partitions 0 to ${partitions - 1} (QUEUE_PARTITIONS - 1), got "${item}"`,
      );
    }
    return n;
  });
  return { partitions, readPartitions, workerPartitions: workerPartitions.sort((a, b) => a - b) };
}

function bool(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (/^(1|true|yes|on)$/i.test(raw)) return true;
  if (/^(0|false|no|off)$/i.test(raw)) return false;
  throw new ConfigError(name, `must be true or false, got "${raw}"`);
}

function url(env: Env, name: string, fallback: string, protocols: string[]): string {
  const value = str(env, name, fallback);
  let parsed: URL;
  try {
    parsed = new URL(value);
  } catch {
    throw new ConfigError(name, 'is not a valid URL');
  }
  if (!protocols.includes(parsed.protocol)) {
    throw new ConfigError(name, `must use ${protocols.join(' or ')}, got ${parsed.protocol}`);
  }
  return value;
}

/** A list of http(s) origins, each reduced to its serialized origin (scheme, host, port); a path is refused. */
function origins(env: Env, name: string): string[] {
  return list(env, name).map((value) => {
    let parsed: URL;
    try {
      parsed = new URL(value);
    } catch {
      throw new ConfigError(name, `must list origins such as https://app.example.com, got "${value}"`);
    }
    if (
      (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') ||
      parsed.pathname !== '/' ||
      parsed.search ||
      value.replace(/\/$/, '') !== parsed.origin
    ) {
      throw new ConfigError(
        name,
        `must list origins (scheme://host[:port], no path) such as https://app.example.com, got "${value}"`,
      );
    }
    return parsed.origin;
  });
}

/**
 * A MongoDB connection string and the database its path names. A replica set's seed list
 * (`mongodb://db1:27017,db2:27017/agent_settlement?replicaSet=rs0`) is no WHATWG URL, so the driver's own parser
 * judges the string (a client built here opens no connection).
 */
function mongoUrl(env: Env): { url: string; db: string } {
  const value = str(env, 'MONGO_URL', 'mongodb://127.0.0.1:27027/agent_settlement');
  if (!/^mongodb(\+srv)?:\/\//.test(value)) throw new ConfigError('MONGO_URL', 'must use mongodb: or mongodb+srv:');
  try {
    new MongoClient(value);
  } catch (err) {
    throw new ConfigError('MONGO_URL', `is not a valid MongoDB connection string (${(err as Error).message})`);
  }
  return { url: value, db: decodeURIComponent(/^[^/]+\/\/[^/]*\/([^?]*)/.exec(value)?.[1] ?? '') };
}

/** One server (`redis://`, `rediss://`) or a cluster by some of its nodes (`redis+cluster://host:port,host:port`). */
function redisUrl(env: Env): string {
  const value = str(env, 'REDIS_URL', 'redis://127.0.0.1:6390');
  if (isClusterUrl(value)) {
    if (!clusterNodes(value))
      throw new ConfigError('REDIS_URL', 'must list cluster nodes as redis+cluster://host:port,host:port');
    return value;
  }
  return url(env, 'REDIS_URL', 'redis://127.0.0.1:6390', ['redis:', 'rediss:', 'redis+cluster:']);
}

export function loadConfig(env: Env = process.env): Config {
  const nodeEnv = str(env, 'NODE_ENV', 'development');
  if (nodeEnv !== 'development' && nodeEnv !== 'test' && nodeEnv !== 'production') {
    throw new ConfigError('NODE_ENV', `must be development, test or production, got "${nodeEnv}"`);
  }
  const { url: mongoUrlValue, db: dbFromUrl } = mongoUrl(env);
  const adminKey = str(env, 'SERVICE_ADMIN_KEY');
  if (adminKey.length < 32) throw new ConfigError('SERVICE_ADMIN_KEY', 'must be at least 32 characters');
  const redisPrefix = str(env, 'REDIS_PREFIX', 'as');
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(redisPrefix)) {
    throw new ConfigError('REDIS_PREFIX', 'must be 1-64 characters of [A-Za-z0-9_-]');
  }
  const logLevel = str(env, 'LOG_LEVEL', nodeEnv === 'test' ? 'warn' : 'info');
  if (!['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].includes(logLevel)) {
    throw new ConfigError('LOG_LEVEL', `must be one of fatal, error, warn, info, debug, trace, silent`);
  }
  const signingKey = env.SERVICE_SIGNING_KEY?.trim() || null;
  if (nodeEnv === 'production' && !signingKey) {
    throw new ConfigError('SERVICE_SIGNING_KEY', 'is required in production (an Ed25519 private key, PEM or a path)');
  }
  const webhookKeyRaw = env.WEBHOOK_SECRET_KEY;
  if (nodeEnv === 'production' && !webhookKeyRaw) {
    throw new ConfigError('WEBHOOK_SECRET_KEY', 'is required in production (32 bytes, base64)');
  }
  let webhookKey: Buffer;
  if (webhookKeyRaw) {
    webhookKey = Buffer.from(webhookKeyRaw, 'base64');
    if (webhookKey.length !== 32) throw new ConfigError('WEBHOOK_SECRET_KEY', 'must be 32 bytes, base64-encoded');
  } else {
    // Development only: every process derives the same key from the admin key, so they can read each other's secrets.
    webhookKey = Buffer.from(hkdfSync('sha256', adminKey, 'agent-settlement', 'webhook-secrets', 32));
  }
  const sessionSecretRaw = env.BUYER_SESSION_SECRET;
  if (nodeEnv === 'production' && !sessionSecretRaw) {
    throw new ConfigError('BUYER_SESSION_SECRET', 'is required in production (32 bytes, base64)');
  }
  let sessionSecret: Buffer;
  if (sessionSecretRaw) {
    sessionSecret = Buffer.from(sessionSecretRaw, 'base64');
    if (sessionSecret.length !== 32) throw new ConfigError('BUYER_SESSION_SECRET', 'must be 32 bytes, base64-encoded');
  } else {
    // Development only, as for the webhook key: every process derives the same secret from the admin key.
    sessionSecret = Buffer.from(hkdfSync('sha256', adminKey, 'agent-settlement', 'buyer-sessions', 32));
  }
  const smokeTestEntryForTests = env.SMOKE_TEST_MCP_ENTRY_FOR_TESTS?.trim() || null;
  if (nodeEnv === 'production' && smokeTestEntryForTests) {
    throw new ConfigError('SMOKE_TEST_MCP_ENTRY_FOR_TESTS', 'is for tests only and refused in production');
  }
  const port = int(env, 'PORT', 3000, 0, 65535);
  const x402Network = str(env, 'X402_NETWORK', DEFAULT_X402_NETWORK);
  if (!new RegExp(X402_NETWORK_PATTERN).test(x402Network)) {
    throw new ConfigError(
      'X402_NETWORK',
      `must be a CAIP-2 id (namespace of 3-8 characters) such as ${DEFAULT_X402_NETWORK}; an older agent-settlement:<deployment> id belongs in X402_LEGACY_NETWORKS`,
    );
  }
  // By default the deployment's old id (same reference, the old namespace) keeps working for the window.
  const legacyRaw = str(
    env,
    'X402_LEGACY_NETWORKS',
    `${LEGACY_X402_NETWORK_NAMESPACE}:${x402Network.slice(x402Network.indexOf(':') + 1)}`,
  );
  const legacyNetworks =
    legacyRaw.trim() === 'none' ? [] : list({ X402_LEGACY_NETWORKS: legacyRaw }, 'X402_LEGACY_NETWORKS');
  for (const legacy of legacyNetworks) {
    if (!new RegExp(LEGACY_X402_NETWORK_PATTERN).test(legacy) || legacy === x402Network) {
      throw new ConfigError(
        'X402_LEGACY_NETWORKS',
        `must list namespace:reference ids other than X402_NETWORK (or be "none"), got "${legacy}"`,
      );
    }
  }
  const legacyUntilRaw = str(env, 'X402_LEGACY_NETWORKS_UNTIL', DEFAULT_LEGACY_NETWORKS_UNTIL);
  const legacyNetworksUntil = new Date(legacyUntilRaw);
  if (!/^\d{4}-\d{2}-\d{2}T/.test(legacyUntilRaw) || Number.isNaN(legacyNetworksUntil.getTime())) {
    throw new ConfigError(
      'X402_LEGACY_NETWORKS_UNTIL',
      `must be an RFC 3339 time such as ${DEFAULT_LEGACY_NETWORKS_UNTIL}, got "${legacyUntilRaw}"`,
    );
  }
  return {
    env: nodeEnv,
    host: str(env, 'HOST', '127.0.0.1'),
    port,
    logLevel,
    mongoUrl: mongoUrlValue,
    mongoDb: str(env, 'MONGO_DB', dbFromUrl || 'agent_settlement'),
    mongoServerSelectionTimeoutMs: int(env, 'MONGO_SERVER_SELECTION_TIMEOUT_MS', 800, 100, 60_000),
    mongoCommandMonitoring: bool(env, 'MONGO_COMMAND_MONITORING', false),
    requestDeadlineMs: int(env, 'REQUEST_DEADLINE_MS', 800, 100, 60_000),
    redisCommandTimeoutMs: int(env, 'REDIS_COMMAND_TIMEOUT_MS', 400, 50, 60_000),
    redisUrl: redisUrl(env),
    redisPrefix,
    adminKey,
    idempotencyTtlSeconds: int(env, 'IDEMPOTENCY_TTL_SECONDS', 86_400, 60, 30 * 86_400),
    rateLimit: {
      limit: int(env, 'RATE_LIMIT_MAX', 1200, 1, 10_000_000),
      windowSeconds: int(env, 'RATE_LIMIT_WINDOW_SECONDS', 60, 1, 86_400),
    },
    metricsPublic: bool(env, 'METRICS_PUBLIC', true),
    shutdownTimeoutMs: int(env, 'SHUTDOWN_TIMEOUT_MS', 15_000, 100, 600_000),
    workerConcurrency: int(env, 'WORKER_CONCURRENCY', 8, 1, 1000),
    publicBaseUrl: url(env, 'PUBLIC_BASE_URL', `http://127.0.0.1:${port}`, ['http:', 'https:']).replace(/\/$/, ''),
    signing: {
      activeKey: signingKey,
      retiredKeys: list(env, 'SERVICE_SIGNING_KEYS_RETIRED'),
      keyFile: str(env, 'SIGNING_KEY_FILE', '.data/service-signing-key.pem'),
    },
    atRestKey: webhookKey,
    webhooks: {
      allowInsecureUrls: bool(env, 'WEBHOOK_ALLOW_INSECURE_URLS', nodeEnv === 'development'),
      allowPrivateAddresses: bool(env, 'WEBHOOK_ALLOW_PRIVATE_ADDRESSES', false),
      retryScale: num(env, 'WEBHOOK_RETRY_SCALE', 1, 0, 100),
      timeoutMs: int(env, 'WEBHOOK_TIMEOUT_MS', 10_000, 100, 60_000),
      retentionDays: int(env, 'WEBHOOK_RETENTION_DAYS', 30, 1, 3650),
    },
    x402: {
      network: x402Network as `${string}:${string}`,
      legacyNetworks,
      legacyNetworksUntil,
      gateTtlSeconds: int(env, 'X402_GATE_TTL_SECONDS', 3600, 1, 30 * 86_400),
      authorizationGraceSeconds: int(env, 'X402_AUTHORIZATION_GRACE_SECONDS', 300, 0, 86_400),
    },
    lists: {
      retentionDays: int(env, 'LIST_RETENTION_DAYS', 0, 0, 36_500),
    },
    reserves: {
      runDeadlineSeconds: int(env, 'RUN_RESERVE_DEADLINE_SECONDS', 30 * 86_400, 1, 365 * 86_400),
    },
    queues: queuePartitions(env),
    sweeper: {
      intervalMs: int(env, 'SWEEP_INTERVAL_MS', 30_000, 100, 3_600_000),
      staleAfterMs: int(env, 'SWEEP_STALE_AFTER_MS', 60_000, 0, 86_400_000),
    },
    onboarding: {
      sessionSecret,
      buyerSessionTtlSeconds: int(env, 'BUYER_SESSION_TTL_SECONDS', 8 * 3600, 60, 30 * 86_400),
      smokeTestTimeoutMs: int(env, 'SMOKE_TEST_TIMEOUT_MS', 20_000, 1_000, 300_000),
      smokeTestEntryForTests,
      conformanceRateLimit: {
        limit: int(env, 'CONFORMANCE_RATE_LIMIT_MAX', 12, 1, 10_000),
        windowSeconds: int(env, 'CONFORMANCE_RATE_LIMIT_WINDOW_SECONDS', 3600, 1, 86_400),
      },
    },
    mcp: {
      allowedOrigins: origins(env, 'MCP_ALLOWED_ORIGINS'),
      allowLoopback: bool(env, 'MCP_ALLOW_LOOPBACK', true),
    },
    console: {
      sessionTtlSeconds: int(env, 'CONSOLE_SESSION_TTL_SECONDS', 8 * 3600, 60, 7 * 86_400),
      secureCookie: bool(env, 'CONSOLE_COOKIE_SECURE', nodeEnv !== 'development'),
    },
  };
}
