// The service as the benchmarks run it, which is as production does: compiled JavaScript (`node dist/main.js api` and
// `worker`, NODE_ENV=production) in child processes, on a database and Redis prefix of the benchmark's own, beside a
// bare Fastify process for the framework's ceiling. Shared by bench/growth.ts and bench/x402.ts.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import type { MongoClient } from 'mongodb';
import { generateEd25519KeyPair, privateKeyToPem } from '../src/domain/crypto.ts';
import { HttpClient } from './growth/http-client.ts';
import { killAllChildren, startChild, waitHealthy, type Child } from './growth/processes.ts';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const MONGO_BASE = 'mongodb://127.0.0.1:27027';
export const REDIS_URL = 'redis://127.0.0.1:6390';

/** One benchmark's own database, Redis prefix, admin key, log directory, and the environment its service runs with. */
export interface BenchService {
  dbName: string;
  redisPrefix: string;
  adminKey: string;
  logDir: string;
  /** What the API and worker are started with (PORT and PUBLIC_BASE_URL are added per start). */
  env: Record<string, string>;
}

export function benchService(name: string, extraEnv: Record<string, string> = {}): BenchService {
  const suffix = randomBytes(4).toString('hex');
  const dbName = `bench_${name}_${suffix}`;
  const redisPrefix = `bench${name}${suffix}`;
  const adminKey = randomBytes(32).toString('base64url');
  return {
    dbName,
    redisPrefix,
    adminKey,
    logDir: mkdtempSync(join(tmpdir(), `bench-${name}-`)),
    env: {
      NODE_ENV: 'production',
      HOST: '127.0.0.1',
      MONGO_URL: `${MONGO_BASE}/${dbName}`,
      REDIS_URL,
      REDIS_PREFIX: redisPrefix,
      SERVICE_ADMIN_KEY: adminKey,
      SERVICE_SIGNING_KEY: privateKeyToPem(generateEd25519KeyPair().privateKey),
      // Required in production, like the signing key.
      WEBHOOK_SECRET_KEY: randomBytes(32).toString('base64'),
      BUYER_SESSION_SECRET: randomBytes(32).toString('base64'),
      RATE_LIMIT_MAX: '10000000',
      ...extraEnv,
    },
  };
}

/** `npm run build`'s two steps (the client package, then `tsc -p tsconfig.build.json`): the benchmarks run what production runs. */
export function buildService(): void {
  execFileSync(process.execPath, ['packages/client/scripts/build.mjs'], { cwd: ROOT, stdio: 'inherit' });
  execFileSync(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], {
    cwd: ROOT,
    stdio: 'inherit',
  });
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolvePort(port));
    });
  });
}

/** BENCH_CPU_PROF=<dir>: the service processes the benches start write .cpuprofile files there. */
export const CPU_PROF_DIR = process.env.BENCH_CPU_PROF ? resolve(process.env.BENCH_CPU_PROF) : null;

/** Node flags (for startServiceProcesses) that make each process write its profile as `<label>-<name>-…`, if asked. */
export function cpuProfileFlags(label: string): (name: string) => string[] {
  return (name) =>
    CPU_PROF_DIR
      ? ['--cpu-prof', `--cpu-prof-dir=${CPU_PROF_DIR}`, `--cpu-prof-name=${label}-${name}-${Date.now()}.cpuprofile`]
      : [];
}

/**
 * The node flags production starts the service with (the Dockerfile's ENTRYPOINT, `npm run start:prod`, `npm start`;
 * test/node-flags.test.ts keeps them the same): V8's young generation capped at 8 MB a semi-space instead of 16, and
 * its old generation let grow to 1.5x what the last full GC kept before the next one starts (V8's own factor was about
 * 2.2x here), which keep the API's peak RSS under load down with no loss of throughput (see docs/performance.md,
 * "Growth with stored data"); and no allocation-site pretenuring: after a burst, when many requests were in flight, V8
 * had marked the sites of per-request objects (headers, request, reply) long-lived and allocated them in the old
 * generation from then on, which filled it at about 6 MB/s and brought a full GC every 4 s, each a stall of every call
 * in flight (docs/performance.md, "Paid calls through sessions").
 */
export const PRODUCTION_NODE_FLAGS = [
  '--max-semi-space-size=8',
  '--heap-growing-percent=50',
  '--no-allocation-site-pretenuring',
];

/**
 * Starts `node dist/main.js api` and `worker` (with PRODUCTION_NODE_FLAGS); resolves once the API is ready and the
 * worker has had the time its start takes (it has no HTTP port). `nodeArgs` adds flags per process (say --cpu-prof);
 * logs go to `<label>-*.log`. `root` is the checkout whose dist/ runs (its working directory): this one unless a
 * bench compares with another build (bench/money-side-by-side.ts runs a baseline commit's from a worktree of its own).
 */
export async function startServiceProcesses(
  service: BenchService,
  label: string,
  nodeArgs: (name: 'api' | 'worker') => string[] = () => [],
  root: string = ROOT,
): Promise<{ api: Child; worker: Child; http: HttpClient; port: number }> {
  const port = await freePort();
  const env = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? '/tmp',
    ...service.env,
    PORT: String(port),
    PUBLIC_BASE_URL: `http://127.0.0.1:${port}`,
  };
  const api = startChild(
    'api',
    [...PRODUCTION_NODE_FLAGS, ...nodeArgs('api'), 'dist/main.js', 'api'],
    env,
    join(service.logDir, `${label}-api.log`),
    root,
  );
  const worker = startChild(
    'worker',
    [...PRODUCTION_NODE_FLAGS, ...nodeArgs('worker'), 'dist/main.js', 'worker'],
    env,
    join(service.logDir, `${label}-worker.log`),
    root,
  );
  await waitHealthy(api, `http://127.0.0.1:${port}/readyz`);
  await new Promise((r) => setTimeout(r, 2_000));
  if (worker.proc.exitCode !== null) throw new Error(`worker exited; see ${worker.logFile}`);
  return { api, worker, http: new HttpClient(port), port };
}

/** The framework's own ceiling: one route, no plugins, no logging, in a process of its own like the API. */
export async function startBareFastify(logDir: string): Promise<{ child: Child; http: HttpClient }> {
  const port = await freePort();
  const code = `import Fastify from 'fastify';
const app = Fastify({ logger: false });
app.get('/ok', async () => ({ ok: true }));
await app.listen({ host: '127.0.0.1', port: ${port} });
process.on('SIGTERM', () => app.close().then(() => process.exit(0)));`;
  const child = startChild(
    'bare-fastify',
    ['--input-type=module', '-e', code],
    { PATH: process.env.PATH ?? '' },
    join(logDir, 'bare-fastify.log'),
    ROOT,
  );
  await waitHealthy(child, `http://127.0.0.1:${port}/ok`);
  return { child, http: new HttpClient(port) };
}

/** Drops the benchmark's database and Redis keys (stop the children first); failures are logged, not thrown. */
export async function dropBenchData(
  service: BenchService,
  mongo: MongoClient | null,
  log: (line: string) => void,
): Promise<void> {
  const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
  try {
    await redis.connect();
    let cursor = '0';
    for (let rounds = 0; rounds < 100_000; rounds++) {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${service.redisPrefix}*`, 'COUNT', 1_000);
      if (keys.length) await redis.del(...keys);
      cursor = next;
      if (cursor === '0') break;
    }
  } catch (err) {
    log(`could not delete Redis keys ${service.redisPrefix}*: ${(err as Error).message}`);
  } finally {
    redis.disconnect();
  }
  await mongo
    ?.db(service.dbName)
    .dropDatabase()
    .catch((err: Error) => log(`could not drop ${service.dbName}: ${err.message}`));
}

/** On SIGINT or SIGTERM: `cleanup` (stop children, drop data), then exit 130, within 10 s; children die with us. */
export function cleanUpOnSignals(cleanup: () => Promise<void>, log: (line: string) => void): void {
  const onSignal = (signal: string) => {
    log(`${signal}: stopping children and dropping the benchmark's data`);
    void cleanup().finally(() => process.exit(130));
    setTimeout(() => process.exit(130), 10_000).unref();
  };
  process.once('SIGINT', () => onSignal('SIGINT'));
  process.once('SIGTERM', () => onSignal('SIGTERM'));
  process.once('exit', killAllChildren);
}
