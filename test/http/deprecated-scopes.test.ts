import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AGENT_READ_WITH_RUNS_READ, grantsDeprecated } from '../../src/domain/scopes.ts';
import { registerAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('reading one agent needs agents:read; runs:read passes, signalled, until the window ends', () => {
  let t: TestApp;
  let agentId: string;
  let tenantOf: string;
  beforeAll(async () => {
    t = await startTestApp();
    const { tenantId, auth } = await t.tenantWithKey(['agents:write']);
    agentId = (await registerAgent(t, auth)).agentId;
    tenantOf = tenantId;
  });
  afterAll(() => t.close());

  const keyOf = async (scopes: string[]) => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: tenantOf, scopes },
    });
    expect(res.statusCode, res.body).toBe(201);
    return { authorization: `Bearer ${res.json().token as string}` };
  };
  const readAgent = (auth: Record<string, string>) =>
    t.app.inject({ method: 'GET', url: `/v1/agents/${agentId}`, headers: auth });

  it('answers agents:read (and agents:write) without a deprecation', async () => {
    for (const scopes of [['agents:read'], ['agents:write']]) {
      const res = await readAgent(await keyOf(scopes));
      expect(res.statusCode, res.body).toBe(200);
      expect(res.json().agentId).toBe(agentId);
      expect(res.headers.deprecation).toBeUndefined();
      expect(res.headers.sunset).toBeUndefined();
    }
  });

  it('answers runs:read (the old rule) with Deprecation and Sunset headers naming the window', async () => {
    for (const scopes of [['runs:read'], ['runs:write']]) {
      const res = await readAgent(await keyOf(scopes));
      expect(res.statusCode, res.body).toBe(200);
      expect(res.json().agentId).toBe(agentId);
      expect(res.headers.deprecation).toBe(`@${Date.parse(AGENT_READ_WITH_RUNS_READ.since) / 1000}`);
      expect(res.headers.sunset).toBe('Tue, 01 Jun 2027 00:00:00 GMT');
    }
  });

  it('refuses other scopes with 403 naming agents:read, and lists agents only with agents:read', async () => {
    const other = await keyOf(['x402:read', 'wallets:read']);
    const res = await readAgent(other);
    expect(res.statusCode).toBe(403);
    expect(res.json()).toMatchObject({ code: 'FORBIDDEN' });
    expect(res.json().message).toContain('agents:read');
    const list = await t.app.inject({ method: 'GET', url: '/v1/agents', headers: await keyOf(['runs:read']) });
    expect(list.statusCode).toBe(403); // the list never took runs:read: nothing to keep for it
  });

  it('stops passing runs:read once the window ends', () => {
    const { until } = AGENT_READ_WITH_RUNS_READ;
    const justBefore = new Date(Date.parse(until) - 1);
    expect(grantsDeprecated(['runs:read'], AGENT_READ_WITH_RUNS_READ, justBefore)).toBe(true);
    expect(grantsDeprecated(['runs:write'], AGENT_READ_WITH_RUNS_READ, justBefore)).toBe(true);
    expect(grantsDeprecated(['runs:read'], AGENT_READ_WITH_RUNS_READ, new Date(until))).toBe(false);
    expect(grantsDeprecated(['x402:read'], AGENT_READ_WITH_RUNS_READ, justBefore)).toBe(false);
  });

  it('names the old scope and its window in the OpenAPI document', async () => {
    const doc = (await t.app.inject({ method: 'GET', url: '/openapi.json' })).json();
    expect(doc.paths['/v1/agents/{agentId}'].get).toMatchObject({
      'x-required-scope': 'agents:read',
      'x-deprecated-scope': AGENT_READ_WITH_RUNS_READ,
    });
  });
});
