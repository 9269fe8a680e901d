import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateEd25519KeyPair, keyIdFor } from '../../src/domain/crypto.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('agents', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let otherTenant: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp();
    auth = (await t.tenantWithKey(['agents:write', 'runs:read'])).auth;
    otherTenant = (await t.tenantWithKey(['agents:write', 'runs:read'])).auth;
  });
  afterAll(() => t.close());

  const register = (body: Record<string, unknown>, headers = auth, url = '/v1/agents') =>
    t.app.inject({ method: 'POST', url, headers, payload: body });

  it('registers an agent from a raw base64url key; keyId is key_ + 24 hex of sha256(raw key)', async () => {
    const pair = generateEd25519KeyPair();
    const raw = Buffer.from(pair.raw).toString('base64url');
    const res = await register({ agentId: 'acme:agent:alpha', publicKey: raw, displayName: 'Alpha' });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toEqual({
      agentId: 'acme:agent:alpha',
      keyId: keyIdFor(pair.raw),
      status: 'active',
      createdAt: expect.any(String),
    });
    expect(res.json().keyId).toMatch(/^key_[0-9a-f]{24}$/);
  });

  it('registers through /agents/register into the same store, from namespace + name and an SPKI PEM', async () => {
    const pair = generateEd25519KeyPair();
    const pem = pair.keyObject.export({ type: 'spki', format: 'pem' }).toString();
    const res = await register({ namespace: 'acme', name: 'beta', publicKey: pem }, auth, '/agents/register');
    expect(res.statusCode).toBe(201);
    expect(res.json().agentId).toBe('acme:agent:beta');
    const dup = await register({ agentId: 'acme:agent:beta', publicKey: pem });
    expect(dup.statusCode).toBe(409);
    expect(dup.json().code).toBe('AGENT_EXISTS');
  });

  it('refuses a key that is not Ed25519, and a malformed agent id, with 400', async () => {
    const notAKey = await register({ name: 'x', publicKey: 'A'.repeat(43) + 'x' });
    expect(notAKey.statusCode).toBe(400);
    const badId = await register({
      agentId: 'no-colons',
      publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url'),
    });
    expect(badId.statusCode).toBe(400);
    expect(badId.json().details.errors[0].path).toBe('body.agentId');
  });

  it('adds and revokes keys, and shows them on the agent', async () => {
    const first = generateEd25519KeyPair();
    const second = generateEd25519KeyPair();
    const agentId = (await register({ name: 'keys', publicKey: Buffer.from(first.raw).toString('base64url') })).json()
      .agentId;
    const added = await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${agentId}/keys`,
      headers: auth,
      payload: { publicKey: Buffer.from(second.raw).toString('base64url') },
    });
    expect(added.statusCode).toBe(201);
    const again = await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${agentId}/keys`,
      headers: auth,
      payload: { publicKey: Buffer.from(second.raw).toString('base64url') },
    });
    expect(again.statusCode).toBe(409);
    const revoked = await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${agentId}/keys/${keyIdFor(first.raw)}/revoke`,
      headers: auth,
    });
    expect(revoked.json()).toMatchObject({ keyId: keyIdFor(first.raw), status: 'revoked' });
    const agent = (await t.app.inject({ method: 'GET', url: `/v1/agents/${agentId}`, headers: auth })).json();
    expect(agent.keys.map((k: { keyId: string; status: string }) => [k.keyId, k.status])).toEqual([
      [keyIdFor(first.raw), 'revoked'],
      [keyIdFor(second.raw), 'active'],
    ]);
  });

  it("answers 404 for another tenant's agent, for reads and writes alike", async () => {
    const pair = generateEd25519KeyPair();
    const agentId = (await register({ name: 'private', publicKey: Buffer.from(pair.raw).toString('base64url') })).json()
      .agentId;
    expect((await t.app.inject({ method: 'GET', url: `/v1/agents/${agentId}`, headers: otherTenant })).statusCode).toBe(
      404,
    );
    const addKey = await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${agentId}/keys`,
      headers: otherTenant,
      payload: { publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url') },
    });
    expect(addKey.statusCode).toBe(404);
    const revoke = await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${agentId}/keys/${keyIdFor(pair.raw)}/revoke`,
      headers: otherTenant,
    });
    expect(revoke.statusCode).toBe(404);
    expect(
      (await t.app.inject({ method: 'GET', url: `/v1/agents/${agentId}`, headers: auth })).json().keys[0].status,
    ).toBe('active');
  });

  it("tells another tenant nothing about which agent ids exist: a namespace is the first registrant's", async () => {
    const key = () => Buffer.from(generateEd25519KeyPair().raw).toString('base64url');
    expect((await register({ agentId: 'nsx:agent:held', publicKey: key() })).statusCode).toBe(201);
    // The same answer for an id that exists and one that does not: the namespace is taken, that is all.
    const held = await register({ agentId: 'nsx:agent:held', publicKey: key() }, otherTenant);
    const free = await register({ agentId: 'nsx:agent:never-registered', publicKey: key() }, otherTenant);
    const byName = await register({ namespace: 'nsx', name: 'held', publicKey: key() }, otherTenant);
    for (const res of [held, free, byName]) {
      expect(res.statusCode).toBe(409);
      expect(res.json()).toMatchObject({
        code: 'AGENT_NAMESPACE_TAKEN',
        message: expect.not.stringContaining('held'),
        details: { namespace: 'nsx' },
      });
    }
    // Inside its own namespace the owner still learns of its own duplicates.
    expect((await register({ agentId: 'nsx:agent:held', publicKey: key() })).json().code).toBe('AGENT_EXISTS');
    expect((await register({ agentId: 'nsx:agent:second', publicKey: key() })).statusCode).toBe(201);

    // A chosen name without a namespace lands in the tenant's own namespace: both tenants may use the same name.
    const mine = await register({ name: 'worker', publicKey: key() });
    const theirs = await register({ name: 'worker', publicKey: key() }, otherTenant);
    expect(mine.statusCode).toBe(201);
    expect(theirs.statusCode).toBe(201);
    expect(mine.json().agentId).not.toBe(theirs.json().agentId);
    expect(mine.json().agentId).toMatch(/^t-[0-9a-f]{20}:agent:worker$/);

    // The shared namespace holds generated names only, so nobody can probe a name there either.
    const chosen = await register({ agentId: 'agents:agent:bob', publicKey: key() });
    expect(chosen.statusCode).toBe(422);
    expect((await register({ namespace: 'agents', name: 'bob', publicKey: key() }, otherTenant)).statusCode).toBe(422);
    const generated = await register({ publicKey: key() }, otherTenant);
    expect(generated.statusCode).toBe(201);
    expect(generated.json().agentId).toMatch(/^agents:agent:agt_/);
  });

  it('requires agents:write to register (403 with runs:read only)', async () => {
    const reader = (await t.tenantWithKey(['runs:read'])).auth;
    const res = await register(
      { name: 'nope', publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url') },
      reader,
    );
    expect(res.statusCode).toBe(403);
  });
});
