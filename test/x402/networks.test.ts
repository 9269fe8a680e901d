// The CAIP-2 network id (`agentstl:<deployment>`), the legacy `agent-settlement:<deployment>` id accepted for its
// deprecation window, and any other network refused with x402's `invalid_network`, moving nothing.
import { randomBytes } from 'node:crypto';
import type { PaymentPayload, PaymentRequirements } from '@x402/core/types';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config.ts';
import { acceptsNetwork, legacyNetworksAt, X402_SCHEME } from '../../src/domain/x402.ts';
import { EscrowGateClientScheme } from '../../src/x402/client.ts';
import { escrowGateFacilitator } from '../../src/x402/facilitator.ts';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, listeningForX402 } from './helpers.ts';

const LEGACY = 'agent-settlement:default';

async function setUp(overrides: Record<string, string> = {}) {
  const t = await startTestApp({
    workers: ['x402-verify', 'settle'],
    overrides: { RATE_LIMIT_MAX: '100000', ...overrides },
  });
  const listening = await listeningForX402(t);
  const parties = await gateParties(t, listening.auth, 1_000);
  const facilitator = (path: 'verify' | 'settle', body: unknown) =>
    t.app.inject({
      method: 'POST',
      url: `/x402/facilitator/${path}`,
      headers: { authorization: `Bearer ${listening.providerKey}` },
      payload: body as Record<string, unknown>,
    });
  /** A payment made (gate, quote, authorization) for requirements naming `network`, as a stock client makes it. */
  const pay = async (network: string) => {
    const url = `https://tools.example/search?q=${randomBytes(4).toString('hex')}`;
    const requirements: PaymentRequirements = {
      scheme: X402_SCHEME,
      network: network as `${string}:${string}`,
      asset: 'USD',
      amount: '100',
      payTo: parties.payee,
      maxTimeoutSeconds: 60,
      extra: { holdbackBps: 0, disputeWindowSeconds: 86_400, method: 'GET', resource: url },
    };
    const scheme = new EscrowGateClientScheme({
      serviceUrl: listening.base,
      apiKey: listening.payerKey,
      payerAgentId: parties.payer,
    });
    const result = await scheme.createPaymentPayload(2, requirements);
    const paymentPayload: PaymentPayload = {
      x402Version: 2,
      resource: { url },
      accepted: requirements,
      payload: result.payload,
    };
    return { x402Version: 2, paymentPayload, paymentRequirements: requirements };
  };
  const money = async () => ({
    payer: await balances(t, listening.auth, parties.payer),
    payee: await balances(t, listening.auth, parties.payee),
  });
  return { t, ...listening, ...parties, facilitator, pay, money };
}

describe('x402 network ids', () => {
  let s: Awaited<ReturnType<typeof setUp>>;
  beforeAll(async () => {
    s = await setUp();
  });
  afterAll(async () => {
    await s.t.close();
  });

  it('quotes name the CAIP-2 id', async () => {
    const gate = await s.t.app.inject({
      method: 'POST',
      url: '/x402/gate/create',
      headers: s.auth,
      payload: { payerAgentId: s.payer, payeeAgentId: s.payee, amount: 5, currency: 'USD' },
    });
    expect(gate.statusCode, gate.body).toBe(201);
    const quote = await s.t.app.inject({
      method: 'POST',
      url: '/x402/gate/quote',
      headers: s.auth,
      payload: { gateId: gate.json().gateId, requestSha256: 'a'.repeat(64) },
    });
    expect(quote.json().paymentRequirements.network).toBe('agentstl:default');
    expect(JSON.parse(Buffer.from(quote.json().paymentRequired, 'base64').toString('utf8')).accepts[0].network).toBe(
      'agentstl:default',
    );
  });

  it('settles a payment under the CAIP-2 id, and one under the legacy id during its window', async () => {
    for (const network of ['agentstl:default', LEGACY]) {
      const body = await s.pay(network);
      expect((await s.facilitator('verify', body)).json(), network).toMatchObject({ isValid: true, payer: s.payer });
      const before = await s.money();
      const settled = (await s.facilitator('settle', body)).json();
      expect(settled, network).toMatchObject({ success: true, amount: '100' });
      const after = await s.money();
      expect(after.payee.available - before.payee.available, network).toBe(100);
    }
    await expectLedgerBalances(s.t);
  });

  it('refuses a payment naming another network with invalid_network, and moves nothing', async () => {
    const body = await s.pay('agentstl:default');
    const before = await s.money();
    for (const network of ['eip155:8453', 'agentstl:other-deployment', 'agent-settlement:other']) {
      const wrong = {
        ...body,
        paymentRequirements: { ...body.paymentRequirements, network },
        paymentPayload: { ...body.paymentPayload, accepted: { ...body.paymentPayload.accepted, network } },
      };
      expect((await s.facilitator('verify', wrong)).json(), network).toMatchObject({
        isValid: false,
        invalidReason: 'invalid_network',
      });
      expect((await s.facilitator('settle', wrong)).json(), network).toMatchObject({
        success: false,
        errorReason: 'invalid_network',
        transaction: '',
        network: 'agentstl:default',
      });
      // Only the requirements, or only the payload's accepted copy, naming it is refused the same way.
      expect(
        (await s.facilitator('settle', { ...body, paymentRequirements: wrong.paymentRequirements })).json(),
      ).toMatchObject({ success: false, errorReason: 'invalid_network' });
      expect((await s.facilitator('settle', { ...body, paymentPayload: wrong.paymentPayload })).json()).toMatchObject({
        success: false,
        errorReason: 'invalid_network',
      });
    }
    expect(await s.money()).toEqual(before);
    // The right network still settles it afterwards: the refusals touched nothing.
    expect((await s.facilitator('settle', body)).json()).toMatchObject({ success: true });
  });

  it('announces the legacy id in /supported (public, rate limited, no tenant data) and the service client offers it as a kind', async () => {
    const res = await fetch(`${s.base}/x402/facilitator/supported`);
    expect(res.status).toBe(200);
    expect(res.headers.get('ratelimit-policy')).toBeTruthy();
    const body = await res.json();
    expect(body.kinds.map((k: { network: string }) => k.network)).toEqual(['agentstl:default', 'agentstl:default']);
    expect(body.kinds[0].extra).toEqual({
      deprecatedNetworks: [
        { network: LEGACY, acceptedUntil: '2027-06-01T00:00:00.000Z', replacedBy: 'agentstl:default' },
      ],
    });
    expect(JSON.stringify(body)).not.toMatch(/ten_|key_|agent:/);
    const viaClient = await escrowGateFacilitator({ serviceUrl: s.base, apiKey: s.providerKey }).getSupported();
    expect(viaClient.kinds.map((k) => `${k.scheme} ${k.network}`)).toEqual([
      'escrow-gate agentstl:default',
      'escrow-session agentstl:default',
      `escrow-gate ${LEGACY}`,
      `escrow-session ${LEGACY}`,
    ]);
  });
});

describe('x402 network ids after the deprecation window', () => {
  let s: Awaited<ReturnType<typeof setUp>>;
  beforeAll(async () => {
    s = await setUp({ X402_NETWORK: 'agentstl:eu-prod', X402_LEGACY_NETWORKS_UNTIL: '2026-01-01T00:00:00Z' });
  });
  afterAll(async () => {
    await s.t.close();
  });

  it('refuses the legacy id with invalid_network and no longer announces it', async () => {
    const body = await s.pay('agent-settlement:eu-prod');
    const before = await s.money();
    expect((await s.facilitator('verify', body)).json()).toMatchObject({
      isValid: false,
      invalidReason: 'invalid_network',
    });
    expect((await s.facilitator('settle', body)).json()).toMatchObject({
      success: false,
      errorReason: 'invalid_network',
      network: 'agentstl:eu-prod',
    });
    expect(await s.money()).toEqual(before);
    const supported = await (await fetch(`${s.base}/x402/facilitator/supported`)).json();
    expect(supported.kinds).toEqual([
      { x402Version: 2, scheme: 'escrow-gate', network: 'agentstl:eu-prod' },
      { x402Version: 2, scheme: 'escrow-session', network: 'agentstl:eu-prod' },
    ]);
    const viaClient = await escrowGateFacilitator({ serviceUrl: s.base, apiKey: s.providerKey }).getSupported();
    expect(viaClient.kinds).toHaveLength(2);
  });
});

describe('x402 network rule (both schemes)', () => {
  it('accepts the CAIP-2 id always, a legacy id only before the window ends, and nothing else', () => {
    const rules = {
      network: 'agentstl:default' as const,
      legacyNetworks: [LEGACY],
      legacyNetworksUntil: new Date('2027-06-01T00:00:00Z'),
    };
    const before = new Date('2027-05-31T23:59:59Z');
    const after = new Date('2027-06-01T00:00:00Z');
    expect(acceptsNetwork(rules, 'agentstl:default', before)).toBe(true);
    expect(acceptsNetwork(rules, 'agentstl:default', after)).toBe(true);
    expect(acceptsNetwork(rules, LEGACY, before)).toBe(true);
    expect(acceptsNetwork(rules, LEGACY, after)).toBe(false);
    expect(legacyNetworksAt(rules, after)).toEqual([]);
    for (const other of ['agentstl:other', 'agent-settlement:other', 'eip155:8453', '', 'agentstl:default '])
      expect(acceptsNetwork(rules, other, before), other).toBe(false);
  });
});

describe('x402 network configuration', () => {
  const vars = (overrides: Record<string, string>) => ({ ...testEnv().vars, ...overrides });

  it('defaults to agentstl:default with the matching legacy id, and derives the legacy id from the reference', () => {
    expect(loadConfig(vars({})).x402).toMatchObject({ network: 'agentstl:default', legacyNetworks: [LEGACY] });
    expect(loadConfig(vars({ X402_NETWORK: 'agentstl:eu-prod' })).x402).toMatchObject({
      network: 'agentstl:eu-prod',
      legacyNetworks: ['agent-settlement:eu-prod'],
    });
    expect(loadConfig(vars({ X402_LEGACY_NETWORKS: 'none' })).x402.legacyNetworks).toEqual([]);
  });

  it('refuses a network id that is no CAIP-2 at start, naming the variable', () => {
    expect(() => loadConfig(vars({ X402_NETWORK: 'agent-settlement:prod' }))).toThrow(ConfigError);
    expect(() => loadConfig(vars({ X402_NETWORK: 'agent-settlement:prod' }))).toThrow(
      /X402_NETWORK must be a CAIP-2 id/,
    );
    expect(() => loadConfig(vars({ X402_NETWORK: 'agentstl' }))).toThrow(/X402_NETWORK/);
    expect(() => loadConfig(vars({ X402_LEGACY_NETWORKS: 'not an id' }))).toThrow(/X402_LEGACY_NETWORKS/);
    expect(() => loadConfig(vars({ X402_LEGACY_NETWORKS_UNTIL: 'soon' }))).toThrow(/X402_LEGACY_NETWORKS_UNTIL/);
  });
});
