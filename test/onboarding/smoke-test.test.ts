// The smoke test starts the real MCP server (node bin/agent-settlement.js mcp) on a worker of the smoke-test queue,
// against the real API listening on loopback, and reports what it saw or the step that failed.
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { resolve } from 'node:path';
import type { TestApp } from '../helpers/context.ts';
import { bootstrap, isAlive, onboardingTenant, startListeningApp } from './helpers.ts';

const FIXTURE = resolve(import.meta.dirname, '../fixtures/mcp-misbehaving.mjs');

describe('runtime-bootstrap smoke test', () => {
  let t: TestApp & { baseUrl: string };
  let broken: TestApp & { baseUrl: string };
  let tenant: Awaited<ReturnType<typeof onboardingTenant>>;
  let env: Record<string, string>;

  beforeAll(async () => {
    t = await startListeningApp({ workers: ['smoke-test'] });
    // Same service, but the worker starts a fixture in place of the MCP server, with a short limit.
    broken = await startListeningApp({
      workers: ['smoke-test'],
      overrides: { SMOKE_TEST_MCP_ENTRY_FOR_TESTS: FIXTURE, SMOKE_TEST_TIMEOUT_MS: '3000' },
    });
    tenant = await onboardingTenant(t);
    env = (await bootstrap(t, tenant.tenantId, tenant.headers)).mcp.env;
  });

  afterAll(async () => {
    await t?.close();
    await broken?.close();
  });

  const run = (app: TestApp, tenantId: string, body: Record<string, unknown>, headers: Record<string, string>) =>
    app.app.inject({
      method: 'POST',
      url: `/v1/tenants/${tenantId}/onboarding/runtime-bootstrap/smoke-test`,
      headers,
      payload: body,
    });

  const pidOf = async (app: TestApp, smokeTestId: string) =>
    (await app.runtime.stores.onboarding.smokeTest(smokeTestId))!.pid;

  it(
    'passes with the bootstrap env: server info, every tool, and a real whoami; the server is gone afterwards',
    { timeout: 60_000 },
    async () => {
      const res = await run(t, tenant.tenantId, { env }, tenant.headers);
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json();
      expect(body).toMatchObject({
        passed: true,
        serverInfo: { name: 'agent-settlement' },
        call: { tool: 'whoami', isError: false },
      });
      expect(body.toolNames).toEqual(expect.arrayContaining(['whoami', 'register_agent', 'gate_create']));
      expect(body.call.result).toMatchObject({
        tenantId: tenant.tenantId,
        keyId: expect.stringMatching(/^ak_/),
        health: { status: 'ready' },
      });
      expect(res.body).not.toContain(env.SERVICE_API_KEY!.split('.')[1]);
      const pid = await pidOf(t, body.smokeTestId);
      expect(pid).toBeTypeOf('number');
      expect(isAlive(pid!)).toBe(false);
    },
  );

  it('keeps the API key out of Redis in clear and deletes its sealed copy after use', { timeout: 60_000 }, async () => {
    const res = await run(t, tenant.tenantId, { env }, tenant.headers);
    expect(res.statusCode, res.body).toBe(200);
    const secret = env.SERVICE_API_KEY!.split('.')[1]!;
    const keys = await t.runtime.redis.keys(`${t.env.redisPrefix}:*`);
    for (const key of keys) {
      const type = await t.runtime.redis.type(key);
      const dump =
        type === 'string'
          ? await t.runtime.redis.get(key)
          : type === 'hash'
            ? JSON.stringify(await t.runtime.redis.hgetall(key))
            : '';
      expect(dump ?? '', key).not.toContain(secret);
    }
    expect(keys.filter((k) => k.includes(':onboarding:smoke-env:'))).toEqual([]);
  });

  it(
    'a job that fails unexpectedly is retried with the env still sealed, and passes',
    { timeout: 60_000 },
    async () => {
      const store = t.runtime.stores.onboarding;
      // The first run's recording fails (as if its worker lost MongoDB); the queue retries the job.
      const recordOnce = vi.spyOn(store, 'recordSmokeTest').mockRejectedValueOnce(new Error('lost the database'));
      try {
        const res = await run(t, tenant.tenantId, { env }, tenant.headers);
        expect(res.statusCode, res.body).toBe(200);
        expect(res.json()).toMatchObject({ passed: true, call: { tool: 'whoami', isError: false } });
        expect(recordOnce).toHaveBeenCalledTimes(2);
      } finally {
        recordOnce.mockRestore();
      }
      expect(await t.runtime.redis.keys(`${t.env.redisPrefix}:onboarding:smoke-env:*`)).toEqual([]);
    },
  );

  it(
    "a wrong API key or tenant is the caller's mistake: 422 before any server starts, the key never echoed",
    { timeout: 60_000 },
    async () => {
      const wrongKey = env.SERVICE_API_KEY!.replace(/\.[^.]+$/, `.${'x'.repeat(43)}`);
      const res = await run(t, tenant.tenantId, { env: { ...env, SERVICE_API_KEY: wrongKey } }, tenant.headers);
      expect(res.statusCode, res.body).toBe(422);
      expect(res.json()).toMatchObject({
        code: 'VALIDATION_FAILED',
        details: { errors: [{ path: 'body.env.SERVICE_API_KEY' }] },
      });
      expect(res.body).not.toContain('x'.repeat(43));
      // Another tenant's live key is refused the same way, and so is another tenant's id.
      const other = await onboardingTenant(t);
      const foreignKey = await run(
        t,
        tenant.tenantId,
        { env: { ...env, SERVICE_API_KEY: other.token } },
        tenant.headers,
      );
      expect(foreignKey.statusCode, foreignKey.body).toBe(422);
      const foreignTenant = await run(
        t,
        tenant.tenantId,
        { env: { ...env, SERVICE_TENANT_ID: other.tenantId } },
        tenant.headers,
      );
      expect(foreignTenant.json()).toMatchObject({
        code: 'VALIDATION_FAILED',
        details: { errors: [{ path: 'body.env.SERVICE_TENANT_ID' }] },
      });
      expect(await t.runtime.redis.keys(`${t.env.redisPrefix}:onboarding:smoke-env:*`)).toEqual([]);
    },
  );

  it(
    'a wrong base URL (a path where the API is not) fails at tools/call; another origin is refused outright',
    { timeout: 60_000 },
    async () => {
      const res = await run(
        t,
        tenant.tenantId,
        { env: { ...env, SERVICE_BASE_URL: `${t.baseUrl}/not-the-api` } },
        tenant.headers,
      );
      expect(res.statusCode, res.body).toBe(502);
      expect(res.json()).toMatchObject({
        code: 'MCP_SMOKE_TEST_FAILED',
        details: { step: 'tools/call', error: { code: 'NOT_FOUND', status: 404 } },
      });
      expect(isAlive((await pidOf(t, res.json().details.smokeTestId))!)).toBe(false);

      const elsewhere = await run(
        t,
        tenant.tenantId,
        { env: { ...env, SERVICE_BASE_URL: 'http://169.254.169.254/latest' } },
        tenant.headers,
      );
      expect(elsewhere.statusCode, elsewhere.body).toBe(422);
      expect(elsewhere.json()).toMatchObject({
        code: 'VALIDATION_FAILED',
        details: { errors: [{ path: 'body.env.SERVICE_BASE_URL' }] },
      });
    },
  );

  it(
    'a server that crashes at start fails at spawn, with its stderr and no process left',
    { timeout: 60_000 },
    async () => {
      const other = await onboardingTenant(broken);
      const res = await run(
        broken,
        other.tenantId,
        {
          env: {
            SERVICE_BASE_URL: `${broken.baseUrl}/crash`,
            SERVICE_TENANT_ID: other.tenantId,
            SERVICE_API_KEY: other.token,
          },
        },
        other.headers,
      );
      expect(res.statusCode, res.body).toBe(502);
      expect(res.json()).toMatchObject({
        code: 'MCP_SMOKE_TEST_FAILED',
        details: { step: 'spawn', stderr: expect.stringContaining('crashing at start') },
      });
      expect(isAlive((await pidOf(broken, res.json().details.smokeTestId))!)).toBe(false);
    },
  );

  it('a server that never answers is killed at the time limit: step timeout', { timeout: 60_000 }, async () => {
    const other = await onboardingTenant(broken);
    const started = Date.now();
    const res = await run(
      broken,
      other.tenantId,
      {
        env: {
          SERVICE_BASE_URL: `${broken.baseUrl}/hang`,
          SERVICE_TENANT_ID: other.tenantId,
          SERVICE_API_KEY: other.token,
        },
      },
      other.headers,
    );
    expect(res.statusCode, res.body).toBe(502);
    expect(res.json()).toMatchObject({
      code: 'MCP_SMOKE_TEST_FAILED',
      details: { step: 'timeout', during: 'initialize' },
    });
    expect(Date.now() - started).toBeLessThan(15_000);
    const pid = await pidOf(broken, res.json().details.smokeTestId);
    expect(pid).toBeTypeOf('number');
    expect(isAlive(pid!)).toBe(false);
  });

  it('refuses an env with other variables than the three, and callers without credentials', async () => {
    const extra = await run(
      t,
      tenant.tenantId,
      { env: { ...env, NODE_OPTIONS: '--require /tmp/x.js' } },
      tenant.headers,
    );
    expect(extra.statusCode).toBe(400);
    const none = await run(t, tenant.tenantId, { env }, {});
    expect(none.statusCode).toBe(401);
  });
});
