import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, expect } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { registerAgent } from '../helpers/agents.ts';
import { credit } from '../helpers/money.ts';

export const X402_SCOPES = ['agents:write', 'x402:write', 'wallets:write'] as const;

/**
 * Two API processes for the tests of a describe block (started before them, closed after): two runtimes sharing one
 * database and one Redis prefix (so one invalidation channel), the first also running the x402-verify and settle
 * workers; `auth` holds a key of one tenant with the x402 scopes. Its fields are set once the block's tests run.
 */
export function twoApiProcesses(): { first: TestApp; second: TestApp; auth: Record<string, string> } {
  const processes = {} as { first: TestApp; second: TestApp; auth: Record<string, string> };
  beforeAll(async () => {
    processes.first = await startTestApp({
      workers: ['x402-verify', 'settle'],
      overrides: { RATE_LIMIT_MAX: '100000' },
    });
    processes.second = await startTestApp({ env: processes.first.env, dropOnClose: false });
    ({ auth: processes.auth } = await processes.first.tenantWithKey([...X402_SCOPES]));
  });
  afterAll(async () => {
    await processes.second?.close();
    await processes.first?.close();
  });
  return processes;
}

export function requestHash(label = randomBytes(8).toString('hex')): string {
  return createHash('sha256').update(`GET /tools/search?q=${label}`).digest('hex');
}

export async function post(
  t: TestApp,
  auth: Record<string, string>,
  url: string,
  payload: unknown,
  headers: Record<string, string> = {},
) {
  return t.app.inject({
    method: 'POST',
    url,
    headers: { ...auth, ...headers },
    payload: payload as Record<string, unknown>,
  });
}

export async function get(t: TestApp, auth: Record<string, string>, url: string) {
  return t.app.inject({ method: 'GET', url, headers: auth });
}

/**
 * The test service listening on loopback for stock x402 clients, with a tenant key (the payer's, X402_SCOPES) and a
 * provider's key of the same tenant (x402:write), as a resource server's facilitator client holds one.
 */
export async function listeningForX402(t: TestApp) {
  await t.app.listen({ host: '127.0.0.1', port: 0 });
  const tenant = await t.tenantWithKey([...X402_SCOPES]);
  const key = await t.app.inject({
    method: 'POST',
    url: '/ops/api-keys',
    headers: t.admin,
    payload: { tenantId: tenant.tenantId, scopes: ['x402:write'] },
  });
  return {
    base: `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`,
    network: t.config.x402.network,
    auth: tenant.auth,
    payerKey: tenant.token,
    providerKey: key.json().token as string,
  };
}

/** A payer funded with `funds` USD and a payee, both agents of the key's tenant. */
export async function gateParties(t: TestApp, auth: Record<string, string>, funds: number) {
  const payer = await registerAgent(t, auth);
  const payee = await registerAgent(t, auth);
  if (funds > 0) await credit(t, payer.agentId, funds);
  return { payer: payer.agentId, payee: payee.agentId };
}

export async function createGate(t: TestApp, auth: Record<string, string>, body: Record<string, unknown>) {
  const res = await post(t, auth, '/x402/gate/create', { currency: 'USD', ...body });
  expect(res.statusCode, res.body).toBe(201);
  return res.json() as { gateId: string; status: string; escrowWalletId: string };
}

export async function quote(
  t: TestApp,
  auth: Record<string, string>,
  gateId: string,
  requestSha256 = requestHash(),
  ttlSeconds?: number,
) {
  const res = await post(t, auth, '/x402/gate/quote', { gateId, requestSha256, ...(ttlSeconds ? { ttlSeconds } : {}) });
  expect(res.statusCode, res.body).toBe(200);
  return {
    ...(res.json() as {
      quoteId: string;
      expiresAt: string;
      paymentRequirements: Record<string, unknown>;
      paymentRequired: string;
      quoteSha256: string;
    }),
    requestSha256,
  };
}

/** A sponsor wallet of the tenant, funded. */
export async function sponsorWallet(
  t: TestApp,
  tenantId: string,
  funds: number,
  walletId = `sponsor-${randomBytes(6).toString('hex')}`,
) {
  const res = await t.app.inject({
    method: 'POST',
    url: `/ops/wallets/${walletId}/credit`,
    headers: t.admin,
    payload: { amount: funds, currency: 'USD', tenantId },
  });
  expect(res.statusCode, res.body).toBe(201);
  return walletId;
}

/** Every currency balances: credits = available + escrow over every wallet (no payouts leave this system). */
export async function expectLedgerBalances(t: TestApp) {
  const postings = t.runtime.stores.ledger.postings;
  const credits = await t.runtime.stores.ledger.entries.find({ kind: 'credit', state: 'applied' }).toArray();
  const credited: Record<string, number> = {};
  for (const c of credits) credited[c.currency] = (credited[c.currency] ?? 0) + c.legs[0]!.delta;
  const held: Record<string, number> = {};
  for (const account of await postings.distinct('account')) {
    const [walletId, currency, bucket] = account.split('|') as [string, string, 'available' | 'escrow'];
    const balance = await t.runtime.stores.ledger.balances(walletId);
    held[currency] = (held[currency] ?? 0) + (balance[currency]?.[bucket] ?? 0);
  }
  expect(held).toEqual(credited);
}
