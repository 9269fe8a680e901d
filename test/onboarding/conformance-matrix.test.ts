// The conformance matrix runs bootstrap, smoke test and first paid call once and hands out each runtime's snippet;
// it has its own per-tenant budget (default 12 an hour) in the one rate limiter.
import { resolve } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { testEnv, type TestApp } from '../helpers/context.ts';
import { onboardingTenant, startListeningApp } from './helpers.ts';

type Env = Record<string, string>;

const FIXTURE = resolve(import.meta.dirname, '../fixtures/mcp-misbehaving.mjs');

/** The server each runtime's snippet configures, read back in that runtime's own format. */
function serverOf(target: string, content: string): Record<string, any> {
  switch (target) {
    case 'codex':
      return (parseToml(content) as any).mcp_servers['agent-settlement'];
    case 'openhands': {
      const servers = (parseToml(content) as any).mcp.stdio_servers;
      expect(servers).toHaveLength(1);
      expect(servers[0].name).toBe('agent-settlement');
      return servers[0];
    }
    case 'openclaw':
      return JSON.parse(content).mcp.servers['agent-settlement'];
    default:
      return JSON.parse(content).mcpServers['agent-settlement'];
  }
}

describe('conformance matrix', () => {
  let t: TestApp & { baseUrl: string };

  beforeAll(async () => {
    t = await startListeningApp({ workers: ['smoke-test', 'x402-verify', 'settle'] });
  });
  afterAll(() => t?.close());

  const matrix = (tenantId: string, headers: Record<string, string>, payload: Record<string, unknown> = {}) =>
    t.app.inject({ method: 'POST', url: `/v1/tenants/${tenantId}/onboarding/conformance-matrix`, headers, payload });

  it('budgets 12 calls per tenant and hour by default, configurable', () => {
    expect(loadConfig(testEnv().vars).onboarding.conformanceRateLimit).toEqual({ limit: 12, windowSeconds: 3600 });
    expect(
      loadConfig({ ...testEnv().vars, CONFORMANCE_RATE_LIMIT_MAX: '3', CONFORMANCE_RATE_LIMIT_WINDOW_SECONDS: '60' })
        .onboarding.conformanceRateLimit,
    ).toEqual({ limit: 3, windowSeconds: 60 });
  });

  it('the 13th call of a tenant in an hour is 429 RATE_LIMITED with RateLimit headers, whichever credential makes it', async () => {
    const tenant = await onboardingTenant(t);
    // Invalid bodies are refused after the budget is drawn, so these are cheap calls that still count.
    for (let i = 1; i <= 12; i++) {
      const res = await matrix(tenant.tenantId, tenant.headers, { targets: ['nope'] });
      expect(res.statusCode, `call ${i}`).toBe(400);
      expect(res.headers['ratelimit-policy']).toContain('"conformance-matrix";q=12;w=3600');
      expect(res.headers['ratelimit']).toContain(`"conformance-matrix";r=${12 - i};t=`);
    }
    const cookie = String(
      (await t.app.inject({ method: 'POST', url: `/ops/tenants/${tenant.tenantId}/buyer-sessions`, headers: t.admin }))
        .headers['set-cookie'],
    ).split(';')[0]!;
    const thirteenth = await matrix(tenant.tenantId, { cookie });
    expect(thirteenth.statusCode).toBe(429);
    expect(thirteenth.json()).toMatchObject({
      code: 'RATE_LIMITED',
      details: { policy: 'conformance-matrix', limit: 12, windowSeconds: 3600 },
    });
    expect(Number(thirteenth.headers['retry-after'])).toBeGreaterThan(3000);
    expect(thirteenth.headers['ratelimit']).toMatch(/"conformance-matrix";r=0;t=\d+/);
    expect(thirteenth.headers['ratelimit-policy']).toContain('"default";q=');
    // Other onboarding routes of the tenant keep their own budget.
    expect(
      (
        await t.app.inject({
          method: 'POST',
          url: `/v1/tenants/${tenant.tenantId}/onboarding/runtime-bootstrap`,
          headers: tenant.headers,
        })
      ).statusCode,
    ).toBe(201);
  });

  it(
    "reports every runtime's snippet in its own format: stdio ones the absolute command, URL ones /mcp with the key as bearer, each started",
    { timeout: 120_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const res = await matrix(tenant.tenantId, tenant.headers);
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json();
      expect(body.targets.map((x: { target: string }) => x.target)).toEqual([
        'codex',
        'claude',
        'cursor',
        'openclaw',
        'openhands',
      ]);
      expect(body.targets.map((x: { format: string }) => x.format)).toEqual(['toml', 'json', 'json', 'json', 'toml']);
      expect(body.targets.map((x: { transport: string }) => x.transport)).toEqual([
        'http',
        'stdio',
        'http',
        'stdio',
        'stdio',
      ]);
      const servers = body.targets.map((x: { target: string; content: string }) => serverOf(x.target, x.content));
      const token: string = servers[1].env.SERVICE_API_KEY;
      expect(token).toMatch(new RegExp(`^sk_${body.apiKey.keyId}\\.`));
      // stdio runtimes: this Node and this installation's launcher by absolute path, with exactly the three variables.
      for (const server of [servers[1], servers[3], servers[4]]) {
        expect(server).toMatchObject({
          command: process.execPath,
          args: [resolve(import.meta.dirname, '../../bin/agent-settlement.js'), 'mcp'],
        });
        expect(server.env).toEqual({
          SERVICE_BASE_URL: t.baseUrl,
          SERVICE_TENANT_ID: tenant.tenantId,
          SERVICE_API_KEY: token,
        } satisfies Env);
      }
      // URL runtimes: this service's /mcp with the same key as bearer (Codex: http_headers; Cursor: headers).
      expect(servers[0]).toEqual({ url: `${t.baseUrl}/mcp`, http_headers: { Authorization: `Bearer ${token}` } });
      expect(servers[2]).toEqual({ url: `${t.baseUrl}/mcp`, headers: { Authorization: `Bearer ${token}` } });
      // The matrix's key is for its own checks: it expires by itself within the hour, and says so.
      expect(body.apiKey.keyId).toMatch(/^ak_/);
      const expiresIn = Date.parse(body.apiKey.expiresAt) - Date.now();
      expect(expiresIn).toBeGreaterThan(50 * 60_000);
      expect(expiresIn).toBeLessThanOrEqual(3_600_000);
      const stored = await t.runtime.stores.apiKeys.get(body.apiKey.keyId);
      expect(stored?.expiresAt?.toISOString()).toBe(body.apiKey.expiresAt);

      // Both configurations were started with that very key: the stdio command by the smoke test, the URL here.
      expect(body.checks.bootstrap.status).toBe('passed');
      expect(body.checks.smokeTest).toMatchObject({
        status: 'passed',
        step: null,
        smokeTestId: expect.stringMatching(/^smk_/),
      });
      expect(body.checks.mcpHttp).toEqual({ status: 'passed', step: null, toolCount: 15 });
      expect(body.checks.firstPaidCall).toMatchObject({
        status: 'passed',
        step: null,
        result: { result: 'passed', ids: { gateId: expect.stringMatching(/^gate_/) } },
      });
      expect(body.ready).toBe(true);
      for (const target of body.targets) expect(target.ready).toBe(true);
    },
  );

  it(
    'a runtime whose configuration cannot start is not ready, even with the first paid call passed; one whose can is',
    { timeout: 120_000 },
    async () => {
      // The same service, but its stdio command is broken: the launcher is a fixture that exits at once.
      const broken = await startListeningApp({
        workers: ['smoke-test', 'x402-verify', 'settle'],
        overrides: { SMOKE_TEST_MCP_ENTRY_FOR_TESTS: FIXTURE, SMOKE_TEST_TIMEOUT_MS: '3000' },
      });
      try {
        const tenant = await onboardingTenant(broken);
        const res = await broken.app.inject({
          method: 'POST',
          url: `/v1/tenants/${tenant.tenantId}/onboarding/conformance-matrix`,
          headers: tenant.headers,
          payload: { targets: ['claude', 'cursor'] },
        });
        expect(res.statusCode, res.body).toBe(200);
        const body = res.json();
        // The snippet hands out the broken command, and the matrix started exactly that.
        expect(serverOf('claude', body.targets[0].content).args).toEqual([FIXTURE, 'mcp']);
        expect(body.checks.smokeTest).toMatchObject({ status: 'failed', step: 'spawn' });
        expect(body.checks.mcpHttp).toMatchObject({ status: 'passed' });
        expect(body.checks.firstPaidCall.status).toBe('passed');
        expect(body.ready).toBe(false);
        expect(body.targets).toEqual([
          expect.objectContaining({ target: 'claude', transport: 'stdio', ready: false }),
          expect.objectContaining({ target: 'cursor', transport: 'http', ready: true }),
        ]);
      } finally {
        await broken.close();
      }
    },
  );

  it('reports only the targets asked for', { timeout: 120_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const res = await matrix(tenant.tenantId, tenant.headers, { targets: ['codex'] });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json().targets.map((x: { target: string }) => x.target)).toEqual(['codex']);
  });
});
