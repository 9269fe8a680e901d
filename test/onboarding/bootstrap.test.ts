// Runtime bootstrap and the three onboarding credentials: x-api-key (admin or a tenant key with `onboarding`) and the
// buyer session cookie, each bound to the path's tenant.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BUYER_SESSION_COOKIE, signBuyerSession } from '../../src/domain/buyer-session.ts';
import { loadConfig } from '../../src/config.ts';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';
import { bootstrap, onboardingTenant } from './helpers.ts';

describe('runtime bootstrap', () => {
  let t: TestApp;
  let a: Awaited<ReturnType<typeof onboardingTenant>>;
  let b: Awaited<ReturnType<typeof onboardingTenant>>;

  beforeAll(async () => {
    t = await startTestApp();
    a = await onboardingTenant(t);
    b = await onboardingTenant(t);
  });
  afterAll(() => t?.close());

  const url = (tenantId: string) => `/v1/tenants/${tenantId}/onboarding/runtime-bootstrap`;
  const session = async (tenantId: string) => {
    const res = await t.app.inject({
      method: 'POST',
      url: `/ops/tenants/${tenantId}/buyer-sessions`,
      headers: t.admin,
    });
    expect(res.statusCode, res.body).toBe(201);
    return res;
  };
  const cookieOf = (setCookie: string) => setCookie.split(';')[0]!;

  it('issues a runtime key and an MCP configuration with exactly the three variables (tenant key with `onboarding`)', async () => {
    const body = await bootstrap(t, a.tenantId, a.headers);
    expect(body.tenantId).toBe(a.tenantId);
    expect(Object.keys(body.mcp.env).sort()).toEqual(['SERVICE_API_KEY', 'SERVICE_BASE_URL', 'SERVICE_TENANT_ID']);
    expect(body.mcp).toMatchObject({
      command: process.execPath,
      args: [expect.stringMatching(/\/bin\/agent-settlement\.js$/), 'mcp'],
      env: { SERVICE_BASE_URL: t.config.publicBaseUrl, SERVICE_TENANT_ID: a.tenantId },
    });
    expect(body.apiKey.scopes.sort()).toEqual(['agents:write', 'runs:write', 'wallets:write', 'x402:write']);
    expect(JSON.parse(body.mcpConfigJson)).toEqual({ mcpServers: { 'agent-settlement': body.mcp } });

    // The runtime key works, for this tenant, and cannot onboard or operate.
    const runtimeAuth = { authorization: `Bearer ${body.mcp.env.SERVICE_API_KEY}` };
    const me = await t.app.inject({ method: 'GET', url: '/v1/whoami', headers: runtimeAuth });
    expect(me.json()).toMatchObject({ tenantId: a.tenantId, keyId: body.apiKey.keyId });
    expect(
      (
        await t.app.inject({
          method: 'POST',
          url: url(a.tenantId),
          headers: { 'x-api-key': body.mcp.env.SERVICE_API_KEY! },
        })
      ).statusCode,
    ).toBe(403);
    expect((await t.app.inject({ method: 'GET', url: '/ops/tenants', headers: runtimeAuth })).statusCode).toBe(403);
  });

  it('accepts the admin key as x-api-key, for an existing tenant only', async () => {
    const body = await bootstrap(t, a.tenantId, { 'x-api-key': t.env.adminKey });
    expect(body.mcp.env.SERVICE_TENANT_ID).toBe(a.tenantId);
    expect(
      (await t.app.inject({ method: 'POST', url: url('ten_doesnotexist'), headers: { 'x-api-key': t.env.adminKey } }))
        .statusCode,
    ).toBe(404);
  });

  it('accepts the buyer session cookie the ops route sets: HttpOnly, Secure, SameSite=Strict, scoped to the tenant path', async () => {
    const res = await session(a.tenantId);
    const setCookie = String(res.headers['set-cookie']);
    expect(setCookie).toMatch(new RegExp(`^${BUYER_SESSION_COOKIE}=v1\\.`));
    for (const attribute of [
      'HttpOnly',
      'Secure',
      'SameSite=Strict',
      `Path=/v1/tenants/${a.tenantId}/onboarding`,
      'Max-Age=',
    ])
      expect(setCookie).toContain(attribute);
    expect(res.body).not.toContain(cookieOf(setCookie).split('=')[1]!);
    const body = await bootstrap(t, a.tenantId, { cookie: `theme=dark; ${cookieOf(setCookie)}` });
    expect(body.tenantId).toBe(a.tenantId);
  });

  it('a session replayed by Idempotency-Key sets the same cookie again, sealed in Redis meanwhile', async () => {
    const post = () =>
      t.app.inject({
        method: 'POST',
        url: `/ops/tenants/${a.tenantId}/buyer-sessions`,
        headers: { ...t.admin, 'idempotency-key': 'session-1' },
      });
    const first = await post();
    const replay = await post();
    expect(first.statusCode, first.body).toBe(201);
    expect(replay.statusCode, replay.body).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.headers['set-cookie']).toEqual(first.headers['set-cookie']);
    expect(replay.json()).toEqual(first.json());
    const stored = await t.runtime.redis.keys(`${t.env.redisPrefix}:idem:*session-1`);
    expect(stored).toHaveLength(1);
    const raw = (await t.runtime.redis.get(stored[0]!))!;
    expect(raw).toContain('sealedSetCookie');
    expect(raw).not.toContain(cookieOf(String(first.headers['set-cookie'])).split('=')[1]!);
    // The replayed cookie works.
    expect((await bootstrap(t, a.tenantId, { cookie: cookieOf(String(replay.headers['set-cookie'])) })).tenantId).toBe(
      a.tenantId,
    );
  });

  it("no credential is 401; another tenant's key or session is 404; a key without `onboarding` is 403", async () => {
    const post = (tenantId: string, headers: Record<string, string>) =>
      t.app.inject({ method: 'POST', url: url(tenantId), headers });
    expect((await post(a.tenantId, {})).statusCode).toBe(401);
    expect((await post(a.tenantId, { authorization: `Bearer ${a.token}` })).statusCode).toBe(401); // not one of the three
    expect((await post(a.tenantId, { 'x-api-key': 'sk_key_unknown000000.nope' })).statusCode).toBe(401);

    const foreignKey = await post(a.tenantId, b.headers);
    expect(foreignKey.statusCode).toBe(404);
    expect(foreignKey.json()).toMatchObject({ code: 'NOT_FOUND' });
    expect(foreignKey.body).not.toContain(a.tenantId);
    const foreignSession = cookieOf(String((await session(b.tenantId)).headers['set-cookie']));
    expect((await post(a.tenantId, { cookie: foreignSession })).statusCode).toBe(404);

    const narrow = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: a.tenantId, scopes: ['agents:write'] },
    });
    expect((await post(a.tenantId, { 'x-api-key': narrow.json().token })).statusCode).toBe(403);
  });

  it('refuses a forged, tampered or expired session cookie', async () => {
    const secret = t.config.onboarding.sessionSecret;
    const post = (value: string) =>
      t.app.inject({ method: 'POST', url: url(a.tenantId), headers: { cookie: `${BUYER_SESSION_COOKIE}=${value}` } });
    const expired = signBuyerSession(secret, a.tenantId, 60, new Date(Date.now() - 120_000)).value;
    expect((await post(expired)).statusCode).toBe(401);
    const forged = signBuyerSession(Buffer.alloc(32, 7), a.tenantId, 600).value;
    expect((await post(forged)).statusCode).toBe(401);
    const good = signBuyerSession(secret, b.tenantId, 600).value;
    const [v, payload, mac] = good.split('.');
    const retargeted = Buffer.from(
      JSON.stringify({ ...JSON.parse(Buffer.from(payload!, 'base64url').toString()), tenantId: a.tenantId }),
    ).toString('base64url');
    expect((await post(`${v}.${retargeted}.${mac}`)).statusCode).toBe(401);
  });

  it('replays the same key for the same Idempotency-Key, sealed in Redis (the secret is never stored in clear)', async () => {
    const headers = { ...a.headers, 'idempotency-key': 'bootstrap-1' };
    const first = await t.app.inject({ method: 'POST', url: url(a.tenantId), headers });
    const replay = await t.app.inject({ method: 'POST', url: url(a.tenantId), headers });
    expect(first.statusCode).toBe(201);
    expect(replay.statusCode).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.json()).toEqual(first.json());
    const secret = first.json().mcp.env.SERVICE_API_KEY.split('.')[1];
    const stored = await t.runtime.redis.keys(`${t.env.redisPrefix}:idem:*bootstrap-1`);
    expect(stored).toHaveLength(1);
    const raw = (await t.runtime.redis.get(stored[0]!))!;
    expect(raw).toContain('sealedBody');
    expect(raw).not.toContain(secret);
    expect(raw).not.toContain('SERVICE_API_KEY');
    // A new key without one.
    const fresh = await bootstrap(t, a.tenantId, a.headers);
    expect(fresh.apiKey.keyId).not.toBe(first.json().apiKey.keyId);
  });

  it('requires BUYER_SESSION_SECRET (32 bytes) in production and derives a development one otherwise', () => {
    const vars = testEnv().vars;
    const production = { ...vars, NODE_ENV: 'production', WEBHOOK_SECRET_KEY: Buffer.alloc(32, 1).toString('base64') };
    expect(() => loadConfig(production)).toThrow(/BUYER_SESSION_SECRET/);
    expect(() => loadConfig({ ...production, BUYER_SESSION_SECRET: 'short' })).toThrow(/32 bytes/);
    expect(
      loadConfig({ ...production, BUYER_SESSION_SECRET: Buffer.alloc(32, 2).toString('base64') }).onboarding
        .sessionSecret,
    ).toHaveLength(32);
    expect(() =>
      loadConfig({
        ...production,
        BUYER_SESSION_SECRET: Buffer.alloc(32, 2).toString('base64'),
        SMOKE_TEST_MCP_ENTRY_FOR_TESTS: '/tmp/x.mjs',
      }),
    ).toThrow(/tests only/);
    expect(loadConfig(vars).onboarding.sessionSecret).toHaveLength(32);
  });
});
