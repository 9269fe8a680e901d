// Shared pieces of the webhook tests: an app + runtime whose log lines are captured, optional in-process
// webhook-dispatch workers, and a real HTTP receiver on 127.0.0.1 whose answers each test scripts.
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { loadConfig, type Config } from '../../src/config.ts';
import type { Scope } from '../../src/domain/scopes.ts';
import { buildApp } from '../../src/http/app.ts';
import { REDACT_PATHS } from '../../src/logger.ts';
import { connectRuntime, createRuntime, type Runtime } from '../../src/runtime.ts';
import { startWorkers, type RunningWorkers } from '../../src/workers/runner.ts';
import { createWebhookDispatchProcessor, type WebhookDispatchOptions } from '../../src/workers/webhook-dispatch.ts';
import { testEnv, type TestEnv } from '../helpers/context.ts';

/** Local receivers and fast retries: what every delivery test runs with unless it says otherwise. */
export const DELIVERY_OVERRIDES = {
  WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
  WEBHOOK_ALLOW_INSECURE_URLS: 'true',
  WEBHOOK_RETRY_SCALE: '0.001',
  WEBHOOK_TIMEOUT_MS: '2000',
  SWEEP_INTERVAL_MS: '2000',
  SWEEP_STALE_AFTER_MS: '1000',
  SHUTDOWN_TIMEOUT_MS: '3000',
};

export interface Harness {
  app: FastifyInstance;
  runtime: Runtime;
  config: Config;
  env: TestEnv;
  /** Every log line the app and the in-process workers wrote (level debug and up). */
  logs(): string;
  tenantWithKey(scopes?: Scope[]): Promise<{ tenantId: string; auth: Record<string, string> }>;
  createEndpoint(auth: Record<string, string>, url: string, events?: string[]): Promise<{ id: string; secret: string }>;
  startWorkers(options?: WebhookDispatchOptions): RunningWorkers;
  close(): Promise<void>;
}

export async function startHarness(
  options: { overrides?: Record<string, string>; workers?: boolean } = {},
): Promise<Harness> {
  const env = testEnv({ LOG_LEVEL: 'debug', ...options.overrides });
  const config = loadConfig(env.vars);
  let captured = '';
  const sink = new Writable({
    write(chunk, _enc, done) {
      captured += chunk.toString();
      done();
    },
  });
  const logger = pino({ level: 'debug', redact: { paths: REDACT_PATHS, censor: '[redacted]' } }, sink);
  const runtime = createRuntime(config, logger);
  // Before connecting: the driver's connections emit commandStarted/commandSucceeded only when created with it.
  await connectRuntime(runtime, 10_000);
  const app = await buildApp(runtime, { bullBoard: false });
  await app.ready();
  const admin = { authorization: `Bearer ${env.adminKey}` };
  const running: RunningWorkers[] = [];

  const harness: Harness = {
    app,
    runtime,
    config,
    env,
    logs: () => captured,
    async tenantWithKey(scopes = ['webhooks:write']) {
      const tenant = await setupCall(
        () => app.inject({ method: 'POST', url: '/ops/tenants', headers: admin, payload: { name: 't' } }),
        201,
      );
      const tenantId = tenant.tenantId as string;
      const key = await setupCall(
        () => app.inject({ method: 'POST', url: '/ops/api-keys', headers: admin, payload: { tenantId, scopes } }),
        201,
      );
      return { tenantId, auth: { authorization: `Bearer ${key.token}` } };
    },
    async createEndpoint(auth, url, events = ['run.finalized', 'settlement.completed']) {
      return (await setupCall(
        () => app.inject({ method: 'POST', url: '/v1/webhooks', headers: auth, payload: { url, events } }),
        201,
      )) as { id: string; secret: string };
    },
    startWorkers(workerOptions = {}) {
      const workers = startWorkers(
        config,
        logger,
        { 'webhook-dispatch': createWebhookDispatchProcessor(runtime, workerOptions) },
        ['webhook-dispatch'],
      );
      running.push(workers);
      return workers;
    },
    async close() {
      for (const w of running) await w.close().catch(() => undefined);
      await app.close();
      await runtime.db.dropDatabase().catch(() => undefined);
      let cursor = '0';
      do {
        const [next, keys] = await runtime.redis.scan(cursor, 'MATCH', `${env.redisPrefix}:*`, 'COUNT', 500);
        if (keys.length > 0) await runtime.redis.del(...keys);
        cursor = next;
      } while (cursor !== '0');
      await runtime.close();
    },
  };
  if (options.workers) harness.startWorkers();
  return harness;
}

/**
 * A setup request that must succeed; retried on 503, which a heavily loaded shared test server can answer (the
 * service answers 503 fast rather than hanging when MongoDB is slow to respond).
 */
async function setupCall(
  send: () => Promise<{ statusCode: number; body: string; json(): any }>,
  expected: number,
): Promise<any> {
  for (let attempt = 1; ; attempt++) {
    const res = await send();
    if (res.statusCode === expected) return res.json();
    if (res.statusCode !== 503 || attempt === 5) throw new Error(`test setup failed: ${res.statusCode} ${res.body}`);
    await new Promise((resolve) => setTimeout(resolve, 200 * attempt));
  }
}

export interface ReceivedRequest {
  n: number;
  at: number;
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}

/** What the receiver does with a request: a status (and headers), or 'hold' to keep it open without answering. */
export type Respond = (
  req: ReceivedRequest,
) =>
  | Promise<number | { status: number; headers?: Record<string, string> } | 'hold'>
  | number
  | { status: number; headers?: Record<string, string> }
  | 'hold';

export interface Receiver {
  url: string;
  port: number;
  received: ReceivedRequest[];
  held: ServerResponse[];
  respond: Respond;
  waitFor(count: number, timeoutMs?: number): Promise<ReceivedRequest[]>;
  close(): Promise<void>;
}

export async function startReceiver(respond: Respond = () => 204, port = 0): Promise<Receiver> {
  const received: ReceivedRequest[] = [];
  const held: ServerResponse[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', async () => {
      const entry: ReceivedRequest = {
        n: received.length + 1,
        at: Date.now(),
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      };
      received.push(entry);
      try {
        const answer = await receiver.respond(entry);
        if (answer === 'hold') {
          held.push(res);
          return;
        }
        const { status, headers } = typeof answer === 'number' ? { status: answer, headers: {} } : answer;
        res.writeHead(status, headers).end();
      } catch {
        res.writeHead(500).end();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  const actual = (server.address() as AddressInfo).port;
  const receiver: Receiver = {
    url: `http://127.0.0.1:${actual}/hook`,
    port: actual,
    received,
    held,
    respond,
    async waitFor(count, timeoutMs = 15_000) {
      await waitUntil(
        () => received.length >= count,
        timeoutMs,
        `receiver to get ${count} requests (has ${received.length})`,
      );
      return received;
    },
    async close() {
      for (const res of held) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return receiver;
}

/** A port nothing listens on (yet): the receiver is "down" until started on it. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Polls `check`; keep `everyMs` generous for checks that scan a collection (FerretDB scans are not cheap). */
export async function waitUntil(
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string,
  everyMs = 100,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export function signatureHeaders(req: ReceivedRequest): Record<string, string> {
  return {
    'webhook-id': String(req.headers['webhook-id']),
    'webhook-timestamp': String(req.headers['webhook-timestamp']),
    'webhook-signature': String(req.headers['webhook-signature']),
  };
}
