import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { appendEvents, createRun, events, registerAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

/** Polls `check` until it holds, failing after `withinMs`. */
async function waitUntil(check: () => Promise<boolean>, withinMs: number): Promise<void> {
  const deadline = Date.now() + withinMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not true within ${withinMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('authentication and scopes', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  const listTenants = (headers: Record<string, string>) =>
    t.app.inject({ method: 'GET', url: '/ops/tenants', headers });

  it('refuses a missing, garbled or unknown credential with 401 in the contract body', async () => {
    const cases: Array<Record<string, string>> = [
      {},
      { authorization: 'Bearer nope' },
      { authorization: 'Token abc' },
      { authorization: `Bearer sk_key_${'a'.repeat(22)}.${'b'.repeat(43)}` },
    ];
    for (const headers of cases) {
      const res = await listTenants(headers);
      expect(res.statusCode).toBe(401);
      expect(res.json()).toMatchObject({ code: 'UNAUTHENTICATED', requestId: expect.any(String) });
      expect(res.headers['x-request-id']).toBe(res.json().requestId);
    }
  });

  it('accepts the admin key as Bearer or as the Basic password, and prompts browsers for Basic', async () => {
    expect((await listTenants(t.admin)).statusCode).toBe(200);
    const basic = Buffer.from(`ops:${t.env.adminKey}`).toString('base64');
    expect((await listTenants({ authorization: `Basic ${basic}` })).statusCode).toBe(200);
    const noCred = await listTenants({});
    expect(noCred.headers['www-authenticate']).toMatch(/^Basic/);
  });

  it('answers 403 for a valid key without the scope, and lets an ops-scoped key use /ops', async () => {
    const runsOnly = await t.tenantWithKey(['runs:read']);
    const res = await listTenants(runsOnly.auth);
    expect(res.statusCode).toBe(403);
    expect(res.json()).toMatchObject({ code: 'FORBIDDEN', details: { requiredScope: 'ops' } });
    const ops = await t.tenantWithKey(['ops']);
    expect((await listTenants(ops.auth)).statusCode).toBe(200);
  });

  it('shows the token once, stores only a hash, and never lists secrets', async () => {
    const { keyId, token } = await t.tenantWithKey(['runs:write']);
    const stored = await t.runtime.db.collection('api_keys').findOne({ _id: keyId as never });
    expect(JSON.stringify(stored)).not.toContain(token.split('.')[1]);
    const list = await t.app.inject({ method: 'GET', url: '/ops/api-keys', headers: t.admin });
    expect(list.body).not.toContain(token.split('.')[1]);
    expect(list.json().items.find((k: { keyId: string }) => k.keyId === keyId)).toMatchObject({
      status: 'active',
      scopes: ['runs:write'],
    });
  });

  it('issues API key ids as ak_… (agent key ids are key_…), and keys issued before with key_… ids keep working', async () => {
    const { keyId, tenantId } = await t.tenantWithKey(['ops']);
    expect(keyId).toMatch(/^ak_/);
    const legacy = await t.runtime.stores.apiKeys.issue({ id: `key_${'c'.repeat(22)}`, tenantId, scopes: ['ops'] });
    expect(legacy.token).toMatch(/^sk_key_c{22}\./);
    expect((await listTenants({ authorization: `Bearer ${legacy.token}` })).statusCode).toBe(200);
    const revoked = await t.app.inject({
      method: 'POST',
      url: `/ops/api-keys/${legacy.key._id}/revoke`,
      headers: t.admin,
    });
    expect(revoked.statusCode, revoked.body).toBe(200);
    expect((await listTenants({ authorization: `Bearer ${legacy.token}` })).statusCode).toBe(401);
  });

  it('refuses a revoked key with 401 at once', async () => {
    const ops = await t.tenantWithKey(['ops']);
    expect((await listTenants(ops.auth)).statusCode).toBe(200);
    const revoke = await t.app.inject({ method: 'POST', url: `/ops/api-keys/${ops.keyId}/revoke`, headers: t.admin });
    expect(revoke.json()).toMatchObject({ keyId: ops.keyId, status: 'revoked' });
    expect((await listTenants(ops.auth)).statusCode).toBe(401);
  });

  it('keeps a revoked key refused even if a lost update writes its document back as active', async () => {
    const ops = await t.tenantWithKey(['ops']);
    await t.app.inject({ method: 'POST', url: `/ops/api-keys/${ops.keyId}/revoke`, headers: t.admin });
    // What a concurrent update on FerretDB can do: write back the document as read before the revocation.
    await t.runtime.db
      .collection('api_keys')
      .updateOne({ _id: ops.keyId as never }, { $set: { status: 'active', revokedAt: null } });
    expect((await listTenants(ops.auth)).statusCode).toBe(401);
    const listed = (await t.app.inject({ method: 'GET', url: '/ops/api-keys', headers: t.admin })).json().items;
    expect(listed.find((k: { keyId: string }) => k.keyId === ops.keyId).status).toBe('revoked');
  });

  it('makes a revocation and an agent key revocation effective on another API process within a second, with its cache warm', async () => {
    const other = await startTestApp({ env: t.env, dropOnClose: false });
    try {
      const { auth } = await t.tenantWithKey(['agents:write', 'runs:write']);
      const agent = await registerAgent(t, auth);
      const runId = await createRun(t, auth, { agentId: agent.agentId });
      // Warm the other process's caches: the key (authentication) and the agent (signature checks).
      const [e1, e2] = events(runId, { seq: 0, chainHash: null }, agent, [
        { type: 'log', payload: 1 },
        { type: 'log', payload: 2 },
      ]);
      expect((await appendEvents(other, auth, runId, [e1!])).statusCode).toBe(201);

      const revokedKey = await t.app.inject({
        method: 'POST',
        url: `/v1/agents/${agent.agentId}/keys/${agent.keyId}/revoke`,
        headers: auth,
      });
      expect(revokedKey.statusCode).toBe(200);
      await waitUntil(async () => (await appendEvents(other, auth, runId, [e2!])).statusCode === 400, 1_000);

      const keyId = (await other.app.inject({ method: 'GET', url: '/v1/whoami', headers: auth })).json()
        .keyId as string;
      expect(
        (await t.app.inject({ method: 'POST', url: `/ops/api-keys/${keyId}/revoke`, headers: t.admin })).statusCode,
      ).toBe(200);
      await waitUntil(
        async () => (await other.app.inject({ method: 'GET', url: '/v1/whoami', headers: auth })).statusCode === 401,
        1_000,
      );
    } finally {
      await other.close();
    }
  });

  it('refuses an expired key with 401', async () => {
    const tenant = (
      await t.app.inject({ method: 'POST', url: '/ops/tenants', headers: t.admin, payload: { name: 'exp' } })
    ).json();
    const expiresAt = new Date(Date.now() + 1_500).toISOString();
    const key = (
      await t.app.inject({
        method: 'POST',
        url: '/ops/api-keys',
        headers: t.admin,
        payload: { tenantId: tenant.tenantId, scopes: ['ops'], expiresAt },
      })
    ).json();
    const auth = { authorization: `Bearer ${key.token}` };
    expect((await listTenants(auth)).statusCode).toBe(200);
    await new Promise((r) => setTimeout(r, 1_700));
    expect((await listTenants(auth)).statusCode).toBe(401);
  });

  it('rotates a key: the successor works, the old one stops after its grace period', async () => {
    const ops = await t.tenantWithKey(['ops']);
    const rotated = await t.app.inject({
      method: 'POST',
      url: `/ops/api-keys/${ops.keyId}/rotate`,
      headers: t.admin,
      payload: { gracePeriodSeconds: 0 },
    });
    expect(rotated.statusCode).toBe(201);
    const { current, previous } = rotated.json();
    expect(previous).toMatchObject({ keyId: ops.keyId, status: 'revoked', rotatedTo: current.keyId });
    expect(current.scopes).toEqual(['ops']);
    expect((await listTenants({ authorization: `Bearer ${current.token}` })).statusCode).toBe(200);
    expect((await listTenants(ops.auth)).statusCode).toBe(401);

    const graced = await t.app.inject({
      method: 'POST',
      url: `/ops/api-keys/${current.keyId}/rotate`,
      headers: t.admin,
      payload: { gracePeriodSeconds: 60 },
    });
    expect(graced.json().previous.status).toBe('active');
    const noBody = await t.app.inject({
      method: 'POST',
      url: `/ops/api-keys/${graced.json().current.keyId}/rotate`,
      headers: t.admin,
    });
    expect(noBody.statusCode).toBe(201);
    expect((await listTenants({ authorization: `Bearer ${current.token}` })).statusCode).toBe(200);
  });

  it('refuses to issue a key for an unknown tenant or with an unknown scope', async () => {
    const unknownTenant = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: 'ten_nope', scopes: ['ops'] },
    });
    expect(unknownTenant.statusCode).toBe(404);
    const badScope = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: 'ten_nope', scopes: ['root'] },
    });
    expect(badScope.statusCode).toBe(400);
    expect(badScope.json().code).toBe('VALIDATION_FAILED');
  });
});
