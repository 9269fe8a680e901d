import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('GET /v1/whoami', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  it('names the tenant, key and scopes of any valid tenant key, whatever its scopes', async () => {
    for (const scopes of [['runs:read'], ['x402:write', 'wallets:write']] as const) {
      const key = await t.tenantWithKey([...scopes]);
      const res = await t.app.inject({ method: 'GET', url: '/v1/whoami', headers: key.auth });
      expect(res.statusCode, res.body).toBe(200);
      expect(res.json()).toEqual({ tenantId: key.tenantId, keyId: key.keyId, scopes: [...scopes] });
    }
  });

  it('refuses a missing or unknown credential (401) and the admin key, which belongs to no tenant (403)', async () => {
    expect((await t.app.inject({ method: 'GET', url: '/v1/whoami' })).json()).toMatchObject({
      code: 'UNAUTHENTICATED',
    });
    const unknown = await t.app.inject({
      method: 'GET',
      url: '/v1/whoami',
      headers: { authorization: `Bearer sk_key_${'a'.repeat(22)}.${'b'.repeat(43)}` },
    });
    expect(unknown.statusCode).toBe(401);
    const admin = await t.app.inject({ method: 'GET', url: '/v1/whoami', headers: t.admin });
    expect(admin.statusCode).toBe(403);
    expect(admin.json()).toMatchObject({ code: 'FORBIDDEN' });
  });
});
