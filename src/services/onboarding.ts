// Onboarding an agent runtime (contract section 10): a buyer session for the browser, the runtime bootstrap (a key
// and the MCP configuration), the smoke test that starts the MCP server with that configuration, and the
// conformance matrix that runs everything once and reports each runtime's snippet.
import { fileURLToPath } from 'node:url';
import { signBuyerSession, type BuyerSession } from '../domain/buyer-session.ts';
import { decryptAtRest, encryptAtRest, newId } from '../domain/crypto.ts';
import { errors, ServiceError, serviceError } from '../domain/errors.ts';
import {
  mcpHttpConfig,
  mcpLaunch,
  mcpServersJson,
  RUNTIME_SCOPES,
  RUNTIME_TRANSPORT,
  runtimeSnippet,
  type McpEnv,
  type McpHttpConfig,
  type McpLaunch,
  type RuntimeSnippet,
  type RuntimeTarget,
} from '../domain/onboarding.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { SmokeTestDoc } from '../store/onboarding.ts';
import { paidCallAttemptId, runFirstPaidCall, type FirstPaidCallResult } from './first-paid-call.ts';
import { probeMcpServer } from './mcp-probe.ts';
import { issueApiKey } from './tenants.ts';

/** The shipped launcher (the package's bin), from src/services or dist/services alike. */
const MCP_LAUNCHER = fileURLToPath(new URL('../../bin/agent-settlement.js', import.meta.url));

/** The stdio command by absolute paths: this Node binary and this installation's launcher (a test may swap the launcher). */
function launchFrom(runtime: Runtime): { nodePath: string; launcherPath: string } {
  return { nodePath: process.execPath, launcherPath: runtime.config.onboarding.smokeTestEntryForTests ?? MCP_LAUNCHER };
}
/** How long the API waits for a worker beyond the smoke test's own limit (queue latency, process start). */
const SMOKE_WAIT_MARGIN_MS = 15_000;
const SMOKE_POLL_MS = 150;
/** The tool the smoke test calls: it reaches the API with the key and proves the tenant. */
const SMOKE_TOOL = 'whoami';

async function requireTenant(runtime: Runtime, tenantId: string): Promise<void> {
  if (!(await runtime.stores.tenants.get(tenantId))) throw errors.notFound('tenant');
}

/** A signed, expiring session bound to one tenant; the caller sets it as the `ml_buyer_session` cookie. */
export async function issueBuyerSession(
  runtime: Runtime,
  tenantId: string,
): Promise<{ value: string; session: BuyerSession }> {
  await requireTenant(runtime, tenantId);
  return signBuyerSession(
    runtime.config.onboarding.sessionSecret,
    tenantId,
    runtime.config.onboarding.buyerSessionTtlSeconds,
  );
}

export interface RuntimeBootstrap {
  tenantId: string;
  apiKey: { keyId: string; scopes: string[]; expiresAt: string | null };
  mcp: McpLaunch;
  /** The same server by URL (this service's /mcp), for clients that take one. */
  mcpHttp: McpHttpConfig;
  mcpConfigJson: string;
}

/** The conformance matrix's runtime key is for its own checks: it stops working by itself after this long. */
const CONFORMANCE_KEY_TTL_MS = 3_600_000;

/** Issues a runtime key (shown once, in mcp.env; expiring at `expiresAt` if given) and the MCP configuration that carries it. */
export async function bootstrapRuntime(
  runtime: Runtime,
  tenantId: string,
  options: { expiresAt?: Date; description?: string } = {},
): Promise<RuntimeBootstrap> {
  await requireTenant(runtime, tenantId);
  const { key, token } = await issueApiKey(runtime, {
    tenantId,
    scopes: RUNTIME_SCOPES,
    description: options.description ?? 'agent runtime (runtime bootstrap)',
    expiresAt: options.expiresAt ?? null,
  });
  const launch = mcpLaunch(
    { SERVICE_BASE_URL: runtime.config.publicBaseUrl, SERVICE_TENANT_ID: tenantId, SERVICE_API_KEY: token },
    launchFrom(runtime),
  );
  return {
    tenantId,
    apiKey: { keyId: key._id, scopes: key.scopes, expiresAt: key.expiresAt?.toISOString() ?? null },
    mcp: launch,
    mcpHttp: mcpHttpConfig(runtime.config.publicBaseUrl, token),
    mcpConfigJson: mcpServersJson(launch),
  };
}

/** Where a smoke test's env waits for its worker: sealed (AES-GCM, bound to this key name), expiring, deleted after use. */
function sealedEnvKey(runtime: Runtime, smokeTestId: string): string {
  return `${runtime.config.redisPrefix}:onboarding:smoke-env:${smokeTestId}`;
}

/**
 * Starts a smoke test on the `smoke-test` queue and waits for its outcome. The job carries ids only; the env (with
 * its API key) waits for the worker sealed in Redis, never in clear. The base URL must be this service's own: the
 * worker would otherwise make requests wherever a caller points it.
 */
export async function runSmokeTest(runtime: Runtime, tenantId: string, env: McpEnv): Promise<SmokeTestDoc> {
  await requireTenant(runtime, tenantId);
  let origin: string;
  try {
    origin = new URL(env.SERVICE_BASE_URL).origin;
  } catch {
    origin = '';
  }
  if (origin !== new URL(runtime.config.publicBaseUrl).origin) {
    throw errors.unprocessable("env.SERVICE_BASE_URL must point at this service's base URL", {
      errors: [{ path: 'body.env.SERVICE_BASE_URL', message: `must start with ${runtime.config.publicBaseUrl}` }],
    });
  }
  // A wrong tenant or key is the caller's mistake (422), found before any server starts; 502 is left for a runtime
  // that was given good settings and still failed.
  if (env.SERVICE_TENANT_ID !== tenantId) {
    throw errors.unprocessable('env.SERVICE_TENANT_ID must be the tenant of the path', {
      errors: [{ path: 'body.env.SERVICE_TENANT_ID', message: 'differs from the path tenantId' }],
    });
  }
  const runtimeKey = await runtime.credentials.authenticate(runtime.stores.apiKeys, env.SERVICE_API_KEY);
  if (runtimeKey?.tenantId !== tenantId) {
    throw errors.unprocessable('env.SERVICE_API_KEY must be a live API key of this tenant', {
      errors: [{ path: 'body.env.SERVICE_API_KEY', message: 'not a live key of this tenant' }],
    });
  }
  const smokeTestId = newId('smk');
  const key = sealedEnvKey(runtime, smokeTestId);
  const waitMs = runtime.config.onboarding.smokeTestTimeoutMs + SMOKE_WAIT_MARGIN_MS;
  await runtime.redis.set(key, encryptAtRest(runtime.config.atRestKey, JSON.stringify(env), key), 'PX', waitMs);
  try {
    await runtime.producers.enqueue('smoke-test', { tenantId, smokeTestId }, jobIdFor('smoke-test', smokeTestId), {
      attempts: 2,
    });
    const deadline = Date.now() + waitMs;
    while (Date.now() < deadline) {
      const done = await runtime.stores.onboarding.smokeTest(smokeTestId);
      if (done) return done;
      await new Promise((resolve) => setTimeout(resolve, SMOKE_POLL_MS));
    }
    throw serviceError('MCP_SMOKE_TEST_FAILED', 'no worker finished the smoke test in time', {
      step: 'timeout',
      smokeTestId,
      waitedMs: waitMs,
    });
  } finally {
    await runtime.redis.del(key).catch(() => undefined); // the worker deletes it too; whoever is first
  }
}

/** The smoke test's answer for the route: the outcome, or 502 MCP_SMOKE_TEST_FAILED naming the failing step. */
export async function smokeTest(runtime: Runtime, tenantId: string, env: McpEnv): Promise<SmokeTestDoc> {
  const doc = await runSmokeTest(runtime, tenantId, env);
  if (!doc.outcome.passed) {
    throw serviceError(
      'MCP_SMOKE_TEST_FAILED',
      `the MCP smoke test failed at ${doc.outcome.failedStep}: ${doc.outcome.error?.message ?? 'unknown'}`,
      {
        step: doc.outcome.failedStep,
        smokeTestId: doc._id,
        ...(doc.outcome.error?.details ?? {}),
      },
    );
  }
  return doc;
}

/**
 * The `smoke-test` job: starts the MCP server with the sealed env, and records what it saw once (a repeated job
 * returns the first record). The env is deleted once the outcome is recorded, not before: a job that fails
 * unexpectedly is retried and needs it again (else it expires, and the waiting request deletes it when it ends).
 */
export async function smokeTestJob(
  runtime: Runtime,
  payload: { tenantId: string; smokeTestId: string },
): Promise<SmokeTestDoc> {
  const store = runtime.stores.onboarding;
  const recorded = await store.smokeTest(payload.smokeTestId);
  if (recorded) return recorded;
  const key = sealedEnvKey(runtime, payload.smokeTestId);
  const sealed = await runtime.redis.get(key);
  const record = (outcome: SmokeTestDoc['outcome'], pid: number | null) =>
    store.recordSmokeTest({
      _id: payload.smokeTestId,
      tenantId: payload.tenantId,
      outcome,
      pid,
      createdAt: new Date(),
    });
  if (sealed === null) {
    return record(
      {
        passed: false,
        failedStep: 'spawn',
        serverInfo: null,
        toolNames: [],
        call: null,
        error: { message: 'the smoke test expired before a worker took it', details: {} },
        durationMs: 0,
      },
      null,
    );
  }
  const env = JSON.parse(decryptAtRest(runtime.config.atRestKey, sealed, key)) as McpEnv;
  // The very command the runtime bootstrap hands out for this env.
  const launch = mcpLaunch(env, launchFrom(runtime));
  const { outcome, pid } = await probeMcpServer({
    server: { command: launch.command, args: launch.args, env: { ...launch.env } },
    timeoutMs: runtime.config.onboarding.smokeTestTimeoutMs,
    tool: SMOKE_TOOL,
    secrets: [env.SERVICE_API_KEY],
  });
  const doc = await record(outcome, pid);
  await runtime.redis.del(key).catch(() => undefined);
  return doc;
}

export type CheckStatus = 'passed' | 'degraded' | 'failed';

export interface ConformanceMatrix {
  tenantId: string;
  ready: boolean;
  apiKey: RuntimeBootstrap['apiKey'];
  checks: {
    bootstrap: { status: CheckStatus };
    smokeTest: { status: CheckStatus; smokeTestId: string | null; step: string | null };
    /** The URL configuration (this service's /mcp) connected to, its tools listed and whoami called. */
    mcpHttp: { status: CheckStatus; step: string | null; toolCount: number };
    firstPaidCall: { status: CheckStatus; attemptId: string; step: string | null; result: FirstPaidCallResult | null };
  };
  targets: Array<RuntimeSnippet & { ready: boolean }>;
}

/**
 * Runs bootstrap, the two MCP configurations and the first paid call once each, and reports every requested
 * runtime's snippet with the checks. Each distinct configuration is started once, however many runtimes use it: the
 * stdio command by the smoke test (on its queue, spawning exactly `mcp.command` with `mcp.env`), the URL by
 * connecting to it here with the SDK's Streamable HTTP client. A runtime is ready when its own configuration
 * started and listed its tools and the first paid call passed; the matrix is ready when every requested one is.
 */
export async function conformanceMatrix(
  runtime: Runtime,
  tenantId: string,
  targets: RuntimeTarget[],
): Promise<ConformanceMatrix> {
  const bootstrap = await bootstrapRuntime(runtime, tenantId, {
    expiresAt: new Date(Date.now() + CONFORMANCE_KEY_TTL_MS),
    description: 'conformance matrix (expires by itself)',
  });
  let smoke: ConformanceMatrix['checks']['smokeTest'];
  try {
    const doc = await runSmokeTest(runtime, tenantId, bootstrap.mcp.env);
    smoke = { status: doc.outcome.passed ? 'passed' : 'failed', smokeTestId: doc._id, step: doc.outcome.failedStep };
  } catch (err) {
    if (!(err instanceof ServiceError) || err.status !== 502) throw err;
    smoke = {
      status: 'failed',
      smokeTestId: String(err.details?.smokeTestId ?? '') || null,
      step: String(err.details?.step ?? 'timeout'),
    };
  }
  const probe = await probeMcpServer({
    server: { url: bootstrap.mcpHttp.url, headers: { ...bootstrap.mcpHttp.headers } },
    timeoutMs: runtime.config.onboarding.smokeTestTimeoutMs,
    tool: SMOKE_TOOL,
    secrets: [bootstrap.mcp.env.SERVICE_API_KEY],
  });
  const http: ConformanceMatrix['checks']['mcpHttp'] = {
    status: probe.outcome.passed ? 'passed' : 'failed',
    step: probe.outcome.failedStep,
    toolCount: probe.outcome.toolNames.length,
  };
  const attemptId = paidCallAttemptId(tenantId, null);
  let paid: ConformanceMatrix['checks']['firstPaidCall'];
  try {
    const result = await runFirstPaidCall(runtime, tenantId, { attemptId });
    paid = { status: result.result, attemptId, step: null, result };
  } catch (err) {
    if (!(err instanceof ServiceError) || err.code !== 'SETTLD_API_CALL_FAILED') throw err;
    paid = { status: 'failed', attemptId, step: String(err.details?.step ?? ''), result: null };
  }
  const configReady = { stdio: smoke.status === 'passed', http: http.status === 'passed' };
  const snippets = targets.map((target) => ({
    ...runtimeSnippet(target, bootstrap.mcp, bootstrap.mcpHttp),
    ready: paid.status === 'passed' && configReady[RUNTIME_TRANSPORT[target]],
  }));
  return {
    tenantId,
    ready: snippets.every((s) => s.ready),
    apiKey: bootstrap.apiKey,
    checks: { bootstrap: { status: 'passed' }, smokeTest: smoke, mcpHttp: http, firstPaidCall: paid },
    targets: snippets,
  };
}
