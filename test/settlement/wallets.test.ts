import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { registerAgent } from '../helpers/agents.ts';

describe('wallet routes: credit, balances, entries', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  beforeAll(async () => {
    t = await startTestApp();
    ({ auth, tenantId } = await t.tenantWithKey(['agents:write', 'wallets:write']));
  });
  afterAll(() => t.close());

  const creditOf = (walletId: string, payload: Record<string, unknown>) =>
    t.app.inject({
      method: 'POST',
      url: `/ops/wallets/${encodeURIComponent(walletId)}/credit`,
      headers: t.admin,
      payload,
    });

  it('credits a reference once, refuses it for another amount, and shows every currency', async () => {
    const agent = await registerAgent(t, auth);
    const first = await creditOf(agent.agentId, { amount: 300, currency: 'USD', reference: 'wire-1' });
    expect(first.statusCode, first.body).toBe(201);
    expect(first.json()).toMatchObject({
      walletId: agent.agentId,
      kind: 'agent',
      entryId: `credit:${agent.agentId}:wire-1`,
      balances: { USD: { available: 300, escrow: 0 } },
    });
    expect(
      (await creditOf(agent.agentId, { amount: 300, currency: 'USD', reference: 'wire-1' })).json().balances,
    ).toEqual({ USD: { available: 300, escrow: 0 } });
    expect((await creditOf(agent.agentId, { amount: 301, currency: 'USD', reference: 'wire-1' })).statusCode).toBe(409);
    await creditOf(agent.agentId, { amount: 7, currency: 'EUR' });
    await creditOf(agent.agentId, { amount: 9, currency: 'USDC' });
    const wallet = await t.app.inject({ method: 'GET', url: `/v1/wallets/${agent.agentId}`, headers: auth });
    expect(wallet.json().balances).toEqual({
      EUR: { available: 7, escrow: 0 },
      USD: { available: 300, escrow: 0 },
      USDC: { available: 9, escrow: 0 },
    });
  });

  it('lets a read-only key (wallets:read) read balances, entries and the policy, and change nothing', async () => {
    const agent = await registerAgent(t, auth);
    await creditOf(agent.agentId, { amount: 40, currency: 'USD' });
    const key = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId, scopes: ['wallets:read'] },
    });
    expect(key.statusCode, key.body).toBe(201);
    const reader = { authorization: `Bearer ${key.json().token}` };
    const wallet = await t.app.inject({ method: 'GET', url: `/v1/wallets/${agent.agentId}`, headers: reader });
    expect(wallet.statusCode, wallet.body).toBe(200);
    expect(wallet.json().balances).toEqual({ USD: { available: 40, escrow: 0 } });
    expect(
      (await t.app.inject({ method: 'GET', url: `/v1/wallets/${agent.agentId}/entries`, headers: reader })).statusCode,
    ).toBe(200);
    const policy = { currency: 'USD', perCallLimit: 10 };
    expect(
      (
        await t.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${agent.agentId}/policy`,
          headers: reader,
          payload: policy,
        })
      ).statusCode,
    ).toBe(403);
    expect(
      (
        await t.app.inject({
          method: 'PUT',
          url: `/x402/wallets/${agent.agentId}/policy`,
          headers: auth,
          payload: policy,
        })
      ).statusCode,
    ).toBe(200);
    expect(
      (await t.app.inject({ method: 'GET', url: `/x402/wallets/${agent.agentId}/policy`, headers: reader })).json(),
    ).toMatchObject({ perCallLimit: 10 });
  });

  it('creates a sponsor wallet only for an existing tenant, and keeps it inside that tenant', async () => {
    expect((await creditOf('sponsor-a', { amount: 5, currency: 'USD' })).statusCode).toBe(422); // schema-valid, but a new sponsor wallet needs its tenant
    expect((await creditOf('sponsor-a', { amount: 5, currency: 'USD', tenantId: 'ten_missing' })).statusCode).toBe(404);
    expect((await creditOf('sponsor-a', { amount: 5, currency: 'USD', tenantId })).json()).toMatchObject({
      kind: 'sponsor',
    });
    const other = (await t.tenantWithKey(['wallets:write'])).auth;
    expect((await t.app.inject({ method: 'GET', url: '/v1/wallets/sponsor-a', headers: other })).statusCode).toBe(404);
    expect(
      (await t.app.inject({ method: 'GET', url: '/v1/wallets/sponsor-a/entries', headers: other })).statusCode,
    ).toBe(404);
  });

  it('pages through the entries with nextCursor, each once, and refuses a cursor it did not issue', async () => {
    const walletId = 'sponsor-paged';
    for (let i = 0; i < 7; i++) await creditOf(walletId, { amount: i + 1, currency: ['USD', 'EUR'][i % 2], tenantId });
    const ids: string[] = [];
    let url = `/v1/wallets/${walletId}/entries?limit=3`;
    for (let page = 0; page < 10; page++) {
      const res = await t.app.inject({ method: 'GET', url, headers: auth });
      expect(res.statusCode, res.body).toBe(200);
      const body = res.json() as { items: Array<{ postingId: string; delta: number }>; nextCursor: string | null };
      ids.push(...body.items.map((i) => i.postingId));
      if (!body.nextCursor) break;
      url = `/v1/wallets/${walletId}/entries?limit=3&cursor=${body.nextCursor}`;
    }
    expect(ids).toHaveLength(7);
    expect(new Set(ids).size).toBe(7);
    const bad = await t.app.inject({
      method: 'GET',
      url: `/v1/wallets/${walletId}/entries?cursor=nonsense`,
      headers: auth,
    });
    expect(bad.statusCode).toBe(422); // the shape of a cursor, but not one this API issued
    expect(bad.json().code).toBe('VALIDATION_FAILED');
    expect(
      (
        await t.app.inject({
          method: 'GET',
          url: `/v1/wallets/${walletId}/entries?cursor=not%20a%20cursor`,
          headers: auth,
        })
      ).statusCode,
    ).toBe(400);
  });
});
