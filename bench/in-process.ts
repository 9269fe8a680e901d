// The service as the in-process benchmarks run it: API and the given workers in this process, on a fresh database
// and Redis prefix of the local servers (or MONGO_URL / REDIS_URL), listening on 127.0.0.1 at a free port.
import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { loadConfig, type Config } from '../src/config.ts';
import { generateEd25519KeyPair, privateKeyToPem } from '../src/domain/crypto.ts';
import { buildApp } from '../src/http/app.ts';
import { createLogger } from '../src/logger.ts';
import type { QueueName } from '../src/queues/index.ts';
import { connectRuntime, createRuntime, type Runtime } from '../src/runtime.ts';
import { createProcessors } from '../src/workers/index.ts';
import { startWorkers } from '../src/workers/runner.ts';

export interface InProcessService {
  config: Config;
  runtime: Runtime;
  app: FastifyInstance;
  /** http://127.0.0.1:<port> */
  base: string;
  adminKey: string;
  /** Stops workers and app, drops the benchmark's database, closes connections. */
  close(): Promise<void>;
}

/** The configuration the in-process benches run with: a fresh database and Redis prefix, an admin key of their own. */
export function inProcessConfig(rateLimitMax = 10_000_000): { config: Config; adminKey: string } {
  const suffix = randomBytes(4).toString('hex');
  const adminKey = randomBytes(32).toString('base64url');
  const config = loadConfig({
    ...process.env,
    NODE_ENV: 'test',
    LOG_LEVEL: 'warn',
    MONGO_URL: process.env.MONGO_URL ?? `mongodb://127.0.0.1:27027/bench_${suffix}`,
    MONGO_DB: `bench_${suffix}`,
    REDIS_PREFIX: `bench${suffix}`,
    SERVICE_ADMIN_KEY: adminKey,
    SERVICE_SIGNING_KEY: privateKeyToPem(generateEd25519KeyPair().privateKey),
    RATE_LIMIT_MAX: String(rateLimitMax),
  });
  return { config, adminKey };
}

export async function startInProcessService(queues: QueueName[], rateLimitMax = 10_000_000): Promise<InProcessService> {
  const { config, adminKey } = inProcessConfig(rateLimitMax);
  const runtime = createRuntime(config, createLogger(config, 'bench'));
  await connectRuntime(runtime);
  const app = await buildApp(runtime, { logger: false, bullBoard: false });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const workers = startWorkers(config, runtime.logger, createProcessors(runtime), queues);
  return {
    config,
    runtime,
    app,
    base,
    adminKey,
    async close() {
      await workers.close();
      await app.close();
      await runtime.db.dropDatabase().catch(() => undefined);
      await runtime.close();
    },
  };
}
