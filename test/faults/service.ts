// The service as it runs in production, for the fault tests: `src/main.ts api | worker | all` as child processes on
// loopback, driven over real HTTP, with every log line kept. Plus the client side of the end-to-end flow (tenant,
// agents, funding, run, signed events, finalize, settle) and the checks that follow a fault.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';
import { generateEd25519KeyPair, newId, privateKeyToPem } from '../../src/domain/crypto.ts';
import { signEvents } from '../../src/domain/event-chain.ts';
import type { KeyObject } from 'node:crypto';
import { freePort, killAndWait, track } from './servers.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));

/** Environment of one service deployment under test: its own database, Redis prefix, keys and fast sweeps. */
export function serviceEnv(
  mongoUrl: string,
  redisUrl: string,
  overrides: Record<string, string> = {},
): Record<string, string> {
  return {
    NODE_ENV: 'test',
    LOG_LEVEL: 'warn',
    MONGO_URL: mongoUrl,
    REDIS_URL: redisUrl,
    REDIS_PREFIX: `f${randomBytes(4).toString('hex')}`,
    SERVICE_ADMIN_KEY: `admin_${randomBytes(24).toString('base64url')}`,
    SERVICE_SIGNING_KEY: privateKeyToPem(generateEd25519KeyPair().privateKey),
    WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
    WEBHOOK_ALLOW_INSECURE_URLS: 'true',
    WEBHOOK_RETRY_SCALE: '0.001',
    WEBHOOK_TIMEOUT_MS: '2000',
    SWEEP_INTERVAL_MS: '1000',
    SWEEP_STALE_AFTER_MS: '2000',
    SHUTDOWN_TIMEOUT_MS: '3000',
    ...overrides,
  };
}

export class ServiceProcess {
  readonly child: ChildProcess;
  logs = '';
  private constructor(
    readonly mode: string,
    readonly env: Record<string, string>,
    readonly port: number | null,
    args: string[],
  ) {
    this.child = track(
      spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', mode, ...args], {
        cwd: root,
        env: {
          ...process.env,
          ...env,
          ...(port ? { PORT: String(port), PUBLIC_BASE_URL: `http://127.0.0.1:${port}` } : {}),
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      }),
    );
    this.child.stdout!.on('data', (d) => (this.logs += d));
    this.child.stderr!.on('data', (d) => (this.logs += d));
  }

  /** Starts `api` or `all` and waits until /healthz answers; `worker` is returned at once. */
  static async start(
    mode: 'api' | 'worker' | 'all',
    env: Record<string, string>,
    args: string[] = [],
    startTimeoutMs = 30_000,
  ): Promise<ServiceProcess> {
    const port = mode === 'worker' ? null : await freePort();
    const service = new ServiceProcess(mode, env, port, args);
    if (port) {
      const deadline = Date.now() + startTimeoutMs;
      for (;;) {
        if (service.child.exitCode !== null) throw new Error(`${mode} exited: ${service.logs.slice(-2000)}`);
        const ok = await fetch(`${service.url}/healthz`).then(
          (r) => r.ok,
          () => false,
        );
        if (ok) break;
        if (Date.now() > deadline) throw new Error(`${mode} did not answer /healthz: ${service.logs.slice(-2000)}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    return service;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    return killAndWait(this.child, signal);
  }

  /** SIGTERM (graceful), then SIGKILL if it does not leave within 10 s. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

export interface Answer {
  status: number;
  body: any;
  headers: Headers;
  ms: number;
}

/** One HTTP call to the service, timed; a network error is status 0. Never waits more than `timeoutMs`. */
export async function call(
  base: string,
  method: string,
  path: string,
  options: { body?: unknown; headers?: Record<string, string>; timeoutMs?: number } = {},
): Promise<Answer> {
  const started = performance.now();
  try {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { ...(options.body !== undefined ? { 'content-type': 'application/json' } : {}), ...options.headers },
      body: options.body !== undefined ? JSON.stringify(options.body) : undefined,
      signal: AbortSignal.timeout(options.timeoutMs ?? 30_000),
    });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // not JSON; kept as text
    }
    return { status: res.status, body, headers: res.headers, ms: performance.now() - started };
  } catch {
    return { status: 0, body: null, headers: new Headers(), ms: performance.now() - started };
  }
}

/** A call that must answer `expected`; retried on 503 (a loaded machine) a few times, bounded. */
export async function must(
  base: string,
  method: string,
  path: string,
  expected: number,
  options: { body?: unknown; headers?: Record<string, string> } = {},
): Promise<any> {
  let last: Answer | null = null;
  const seen: string[] = [];
  for (let attempt = 1; attempt <= 8; attempt++) {
    last = await call(base, method, path, options);
    if (last.status === expected) return last.body;
    seen.push(`${last.status} ${last.body?.code ?? ''} ${Math.round(last.ms)}ms`);
    if (last.status !== 503 && last.status !== 0 && last.status !== 409) break;
    await new Promise((r) => setTimeout(r, 250 * attempt));
  }
  throw new Error(
    `${method} ${path}: expected ${expected}, got ${last?.status} ${JSON.stringify(last?.body)} (attempts: ${seen.join('; ')})`,
  );
}

export interface Agent {
  agentId: string;
  keyId: string;
  privateKey: KeyObject;
}

export interface Tenant {
  tenantId: string;
  token: string;
  auth: Record<string, string>;
}

export async function createTenant(base: string, adminKey: string): Promise<Tenant> {
  const admin = { authorization: `Bearer ${adminKey}` };
  const { tenantId } = await must(base, 'POST', '/ops/tenants', 201, {
    headers: { ...admin, 'idempotency-key': newId('k') },
    body: { name: 'faults' },
  });
  const { token } = await must(base, 'POST', '/ops/api-keys', 201, {
    headers: { ...admin, 'idempotency-key': newId('k') },
    body: { tenantId, scopes: ['agents:write', 'runs:write', 'wallets:write', 'webhooks:write'] },
  });
  return { tenantId, token, auth: { authorization: `Bearer ${token}` } };
}

export async function registerAgent(base: string, tenant: Tenant): Promise<Agent & { privateKeyPem: string }> {
  const pair = generateEd25519KeyPair();
  const publicKey = pair.keyObject.export({ type: 'spki', format: 'pem' }).toString();
  const body = await must(base, 'POST', '/v1/agents', 201, {
    headers: { ...tenant.auth, 'idempotency-key': newId('k') },
    body: { name: newId('a'), publicKey },
  });
  return {
    agentId: body.agentId,
    keyId: body.keyId,
    privateKey: pair.privateKey,
    privateKeyPem: privateKeyToPem(pair.privateKey),
  };
}

export async function credit(
  base: string,
  adminKey: string,
  walletId: string,
  amount: number,
  currency = 'USD',
): Promise<void> {
  await must(base, 'POST', `/ops/wallets/${encodeURIComponent(walletId)}/credit`, 201, {
    headers: { authorization: `Bearer ${adminKey}`, 'idempotency-key': newId('k') },
    body: { amount, currency },
  });
}

/**
 * A run with settlement terms and one metric event that passes (`accuracy` 1) or fails (0) `accuracy >= 0.9`; every
 * POST carries an idempotency key and is retried on 503, so the flow survives an outage in its middle.
 */
export async function createRunWithEvidence(
  base: string,
  tenant: Tenant,
  payer: Agent,
  worker: Agent,
  opts: { pass: boolean; amount: number; holdbackBps?: number; currency?: string },
): Promise<string> {
  const headers = () => ({ ...tenant.auth, 'idempotency-key': newId('k') });
  const { runId } = await must(base, 'POST', '/v1/runs', 201, {
    headers: headers(),
    body: {
      agentId: worker.agentId,
      terms: { accuracy: { min: 0.9 } },
      settlement: {
        payerAgentId: payer.agentId,
        amount: opts.amount,
        currency: opts.currency ?? 'USD',
        holdbackBps: opts.holdbackBps ?? 0,
        disputeWindowSeconds: 3600,
      },
    },
  });
  const [event] = signEvents(
    [
      {
        id: newId('evt'),
        runId,
        type: 'metric',
        at: new Date().toISOString(),
        payload: { name: 'accuracy', value: opts.pass ? 1 : 0 },
      },
    ],
    { seq: 0, chainHash: null },
    worker.privateKey,
    worker.keyId,
  );
  await must(base, 'POST', `/v1/runs/${runId}/events`, 201, { headers: headers(), body: { event } });
  return runId;
}

/** Polls until `check` holds, at most `timeoutMs`. */
export async function eventually(
  check: () => Promise<boolean> | boolean,
  timeoutMs: number,
  what: string,
  everyMs = 200,
): Promise<number> {
  const started = Date.now();
  while (!(await check())) {
    if (Date.now() - started > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
  return Date.now() - started;
}

export function expectErrorShape(answer: Answer, status: number, code: string): void {
  expect(answer.status, JSON.stringify(answer.body)).toBe(status);
  expect(answer.body).toMatchObject({ code, message: expect.any(String), requestId: expect.any(String) });
  expect(answer.headers.get('x-request-id')).toBe(answer.body.requestId);
}
