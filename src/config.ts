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
  redisUrl: string;
  /** Prefix for every Redis key (queues, idempotency, rate limits); lets several deployments share one Redis. */
  redisPrefix: string;
  adminKey: string;
  idempotencyTtlSeconds: number;
  rateLimit: RateLimitPolicy;
  metricsPublic: boolean;
  shutdownTimeoutMs: number;
  workerConcurrency: number;
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

export function loadConfig(env: Env = process.env): Config {
  const nodeEnv = str(env, 'NODE_ENV', 'development');
  if (nodeEnv !== 'development' && nodeEnv !== 'test' && nodeEnv !== 'production') {
    throw new ConfigError('NODE_ENV', `must be development, test or production, got "${nodeEnv}"`);
  }
  const mongoUrl = url(env, 'MONGO_URL', 'mongodb://127.0.0.1:27027/agent_settlement', ['mongodb:', 'mongodb+srv:']);
  const dbFromUrl = new URL(mongoUrl).pathname.replace(/^\//, '');
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
  return {
    env: nodeEnv,
    host: str(env, 'HOST', '127.0.0.1'),
    port: int(env, 'PORT', 3000, 0, 65535),
    logLevel,
    mongoUrl,
    mongoDb: str(env, 'MONGO_DB', dbFromUrl || 'agent_settlement'),
    mongoServerSelectionTimeoutMs: int(env, 'MONGO_SERVER_SELECTION_TIMEOUT_MS', 800, 100, 60_000),
    redisUrl: url(env, 'REDIS_URL', 'redis://127.0.0.1:6390', ['redis:', 'rediss:']),
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
  };
}
