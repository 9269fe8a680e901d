import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import type { DestinationStream } from 'pino';
import { inject } from 'vitest';
import { loadConfig, type Config } from '../../src/config.ts';
import { buildApp } from '../../src/http/app.ts';
import { createLogger } from '../../src/logger.ts';
import { connectRuntime, createRuntime, type Runtime } from '../../src/runtime.ts';
import type { Scope } from '../../src/domain/scopes.ts';
import type { QueueName } from '../../src/queues/index.ts';
import { createProcessors } from '../../src/workers/index.ts';
import { startWorkers } from '../../src/workers/runner.ts';
import { generateEd25519KeyPair, privateKeyToPem } from '../../src/domain/crypto.ts';

export interface TestEnv {
  /** Environment for loadConfig(): this file's own database and Redis prefix on the shared test servers. */
  vars: Record<string, string>;
  adminKey: string;
  dbName: string;
  redisPrefix: string;
}

/** A fresh database name and Redis key prefix, so test files can run in parallel on the same servers. */
export function testEnv(overrides: Record<string, string> = {}): TestEnv {
  const suffix = randomBytes(5).toString('hex');
  const dbName = `t_${suffix}`;
  const redisPrefix = `t${suffix}`;
  const adminKey = `admin_${randomBytes(24).toString('base64url')}`;
  const mongoUrl = new URL(inject('mongoUrl'));
  mongoUrl.pathname = `/${dbName}`;
  return {
    dbName,
    redisPrefix,
    adminKey,
    vars: {
      NODE_ENV: 'test',
      LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent',
      MONGO_URL: mongoUrl.toString(),
      REDIS_URL: inject('redisUrl'),
      REDIS_PREFIX: redisPrefix,
      SERVICE_ADMIN_KEY: adminKey,
      MONGO_SERVER_SELECTION_TIMEOUT_MS: '800',
      // The request deadline answers 503 once a MongoDB command has waited half of it (a stalled server). With every
      // test file on the same FerretDB and two cores, a command can wait 400 ms without anything being stalled; the
      // deadline itself is tested against real outages in test/faults/, whose services keep the default.
      REQUEST_DEADLINE_MS: '5000',
      // Likewise a Redis command: ioredis's timeout timer runs before the socket is read, so an event loop held for
      // 400 ms by a neighbour (a transform, a GC) times out a reply that had already arrived (seen as a 503 from
      // POST /ops/tenants under load). Outages stay tested with the default in test/faults/.
      REDIS_COMMAND_TIMEOUT_MS: '2000',
      // Tests observe the commands the stores send (test/store/id-lookups.test.ts and others).
      MONGO_COMMAND_MONITORING: 'true',
      SERVICE_SIGNING_KEY: privateKeyToPem(generateEd25519KeyPair().privateKey),
      ...overrides,
    },
  };
}

export interface TestApp {
  app: FastifyInstance;
  runtime: Runtime;
  config: Config;
  env: TestEnv;
  admin: Record<string, string>;
  /** Creates a tenant and a key with these scopes; returns its bearer header. */
  tenantWithKey(
    scopes: Scope[],
    name?: string,
  ): Promise<{ tenantId: string; keyId: string; token: string; auth: Record<string, string> }>;
  close(): Promise<void>;
}

export async function startTestApp(
  options: {
    env?: TestEnv;
    overrides?: Record<string, string>;
    dropOnClose?: boolean;
    workers?: QueueName[];
    /** Where the service's log lines go (the app's request lines included); none: the app logs nothing. */
    logTo?: DestinationStream;
  } = {},
): Promise<TestApp> {
  const env = options.env ?? testEnv(options.overrides);
  const config = loadConfig(env.vars);
  const runtime = createRuntime(config, createLogger(config, 'test', options.logTo));
  await connectRuntime(runtime, 10_000);
  const app = await buildApp(runtime, { logger: options.logTo !== undefined });
  await app.ready();
  const workers = options.workers
    ? startWorkers(config, runtime.logger, createProcessors(runtime), options.workers)
    : null;
  const admin = { authorization: `Bearer ${env.adminKey}` };
  return {
    app,
    runtime,
    config,
    env,
    admin,
    async tenantWithKey(scopes, name = 'tenant') {
      const tenant = await app.inject({ method: 'POST', url: '/ops/tenants', headers: admin, payload: { name } });
      if (tenant.statusCode !== 201) throw new Error(`POST /ops/tenants answered ${tenant.statusCode}: ${tenant.body}`);
      const tenantId = tenant.json().tenantId as string;
      const key = await app.inject({
        method: 'POST',
        url: '/ops/api-keys',
        headers: admin,
        payload: { tenantId, scopes },
      });
      if (key.statusCode !== 201) throw new Error(`POST /ops/api-keys answered ${key.statusCode}: ${key.body}`);
      const { keyId, token } = key.json() as { keyId: string; token: string };
      return { tenantId, keyId, token, auth: { authorization: `Bearer ${token}` } };
    },
    async close() {
      await workers?.close();
      await app.close();
      if (options.dropOnClose !== false) {
        await runtime.db.dropDatabase().catch(() => undefined);
        await deleteRedisPrefix(runtime, env.redisPrefix).catch(() => undefined);
      }
      await runtime.close();
    },
  };
}

async function deleteRedisPrefix(runtime: Runtime, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await runtime.redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 500);
    if (keys.length > 0) await runtime.redis.del(...keys);
    cursor = next;
  } while (cursor !== '0');
}
