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

/** The env of each runtime's snippet, read back in that runtime's own format. */
function envOf(target: string, content: string): Env {
  switch (target) {
    case 'codex':
      return (parseToml(content) as any).mcp_servers['agent-settlement'].env;
    case 'openhands': {
      const servers = (parseToml(content) as any).mcp.stdio_servers;
      expect(servers).toHaveLength(1);
      expect(servers[0]).toMatchObject({ name: 'agent-settlement', command: 'npx', args: ['agent-settlement', 'mcp'] });
      return servers[0].env;
    }
    case 'openclaw':
      return JSON.parse(content).mcp.servers['agent-settlement'].env;
    default:
      return JSON.parse(content).mcpServers['agent-settlement'].env;
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
    expect(loadConfig({ ...testEnv().vars, CONFORMANCE_RATE_LIMIT_MAX: '3', CONFORMANCE_RATE_LIMIT_WINDOW_SECONDS: '60' }).onboarding.conformanceRateLimit).toEqual({ limit: 3, windowSeconds: 60 });
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
    const cookie = String((await t.app.inject({ method: 'POST', url: `/ops/tenants/${tenant.tenantId}/buyer-sessions`, headers: t.admin })).headers['set-cookie']).split(';')[0]!;
    const thirteenth = await matrix(tenant.tenantId, { cookie });
    expect(thirteenth.statusCode).toBe(429);
    expect(thirteenth.json()).toMatchObject({ code: 'RATE_LIMITED', details: { policy: 'conformance-matrix', limit: 12, windowSeconds: 3600 } });
    expect(Number(thirteenth.headers['retry-after'])).toBeGreaterThan(3000);
    expect(thirteenth.headers['ratelimit']).toMatch(/"conformance-matrix";r=0;t=\d+/);
    expect(thirteenth.headers['ratelimit-policy']).toContain('"default";q=');
    // Other onboarding routes of the tenant keep their own budget.
    expect((await t.app.inject({ method: 'POST', url: `/v1/tenants/${tenant.tenantId}/onboarding/runtime-bootstrap`, headers: tenant.headers })).statusCode).toBe(201);
  });

  it('reports every runtime\'s snippet in its own format, naming the same three variables, with the checks', { timeout: 120_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const res = await matrix(tenant.tenantId, tenant.headers);
    expect(res.statusCode, res.body).toBe(200);
    const body = res.json();
    expect(body.targets.map((x: { target: string }) => x.target)).toEqual(['codex', 'claude', 'cursor', 'openclaw', 'openhands']);
    expect(body.targets.map((x: { format: string }) => x.format)).toEqual(['toml', 'json', 'json', 'json', 'toml']);
    const envs = body.targets.map((x: { target: string; content: string }) => envOf(x.target, x.content));
    for (const env of envs) {
      expect(Object.keys(env).sort()).toEqual(['SERVICE_API_KEY', 'SERVICE_BASE_URL', 'SERVICE_TENANT_ID']);
      expect(env).toEqual(envs[0]);
    }
    expect(envs[0]).toMatchObject({ SERVICE_BASE_URL: t.baseUrl, SERVICE_TENANT_ID: tenant.tenantId, SERVICE_API_KEY: expect.stringMatching(new RegExp(`^sk_${body.apiKey.keyId}\\.`)) });
    // The matrix's key is for its own checks: it expires by itself within the hour, and says so.
    expect(body.apiKey.keyId).toMatch(/^ak_/);
    const expiresIn = Date.parse(body.apiKey.expiresAt) - Date.now();
    expect(expiresIn).toBeGreaterThan(50 * 60_000);
    expect(expiresIn).toBeLessThanOrEqual(3_600_000);
    const stored = await t.runtime.stores.apiKeys.get(body.apiKey.keyId);
    expect(stored?.expiresAt?.toISOString()).toBe(body.apiKey.expiresAt);

    // The smoke test ran that very key through the real MCP server.
    expect(body.checks.bootstrap.status).toBe('passed');
    expect(body.checks.smokeTest).toMatchObject({ status: 'passed', step: null, smokeTestId: expect.stringMatching(/^smk_/) });
    expect(body.checks.firstPaidCall).toMatchObject({ status: 'passed', step: null, result: { result: 'passed', ids: { gateId: expect.stringMatching(/^gate_/) } } });
    expect(body.ready).toBe(true);
    for (const target of body.targets) expect(target.ready).toBe(true);
  });

  it('is not ready when one check fails, even with the first paid call passed', { timeout: 120_000 }, async () => {
    // The same service, but the smoke test starts a fixture that exits at once in place of the MCP server.
    const broken = await startListeningApp({ workers: ['smoke-test', 'x402-verify', 'settle'], overrides: { SMOKE_TEST_MCP_ENTRY_FOR_TESTS: FIXTURE, SMOKE_TEST_TIMEOUT_MS: '3000' } });
    try {
      const tenant = await onboardingTenant(broken);
      const res = await broken.app.inject({ method: 'POST', url: `/v1/tenants/${tenant.tenantId}/onboarding/conformance-matrix`, headers: tenant.headers, payload: { targets: ['claude'] } });
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json();
      expect(body.checks.smokeTest).toMatchObject({ status: 'failed', step: 'spawn' });
      expect(body.checks.firstPaidCall.status).toBe('passed');
      expect(body.ready).toBe(false);
      expect(body.targets).toEqual([expect.objectContaining({ target: 'claude', ready: false })]);
    } finally {
      await broken.close();
    }
  });

  it('reports only the targets asked for', { timeout: 120_000 }, async () => {
    const tenant = await onboardingTenant(t);
    const res = await matrix(tenant.tenantId, tenant.headers, { targets: ['codex'] });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json().targets.map((x: { target: string }) => x.target)).toEqual(['codex']);
  });
});
