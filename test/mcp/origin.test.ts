// /mcp validates Host and Origin before anything else (MCP transport: servers MUST validate Origin; DNS rebinding):
// PUBLIC_BASE_URL's host and origin, loopback names, and MCP_ALLOWED_ORIGINS pass; anything else is 403 in the
// contract's error shape, before the key is looked at, and never reaches a tool.
import { describe, expect, it, afterAll, beforeAll } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config.ts';
import { refusedOrigin } from '../../src/domain/origins.ts';
import { startTestApp, testEnv, type TestApp } from '../helpers/context.ts';

const initialize = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'origin-test', version: '1.0.0' } },
};

describe('the Host and Origin rule', () => {
  const policy = {
    publicBaseUrl: 'https://settle.example.com',
    allowedOrigins: ['https://app.example.com'],
    allowLoopback: true,
  };

  it("passes the service's own host and origin, loopback on any port, and the allowed origins", () => {
    for (const headers of [
      { host: 'settle.example.com' },
      { host: 'settle.example.com:443', origin: 'https://settle.example.com' },
      { host: 'settle.example.com', origin: 'https://app.example.com' },
      { host: '127.0.0.1:3000', origin: 'http://localhost:5173' },
      { host: 'localhost', origin: 'http://127.0.0.1:8080' },
      { host: '[::1]:3000', origin: 'http://[::1]:3000' },
    ])
      expect(refusedOrigin(policy, headers), JSON.stringify(headers)).toBeNull();
  });

  it('refuses another host, a rebound name, another origin, an opaque or non-http origin, and a missing host', () => {
    expect(refusedOrigin(policy, { host: 'evil.example.com', origin: 'http://evil.example.com' })).toMatchObject({
      header: 'host',
    });
    expect(refusedOrigin(policy, { host: 'settle.example.com:8443' })).toMatchObject({ header: 'host' });
    expect(refusedOrigin(policy, {})).toMatchObject({ header: 'host' });
    expect(refusedOrigin(policy, { host: 'settle.example.com/x' })).toMatchObject({ header: 'host' });
    expect(refusedOrigin(policy, { host: '127.0.0.1:3000', origin: 'http://evil.example.com' })).toMatchObject({
      header: 'origin',
    });
    expect(refusedOrigin(policy, { host: 'settle.example.com', origin: 'http://settle.example.com' })).toMatchObject({
      header: 'origin',
    });
    expect(
      refusedOrigin(policy, { host: 'settle.example.com', origin: 'https://app.example.com.evil.net' }),
    ).toMatchObject({ header: 'origin' });
    expect(refusedOrigin(policy, { host: 'settle.example.com', origin: 'null' })).toMatchObject({ header: 'origin' });
    expect(refusedOrigin(policy, { host: 'settle.example.com', origin: 'file:///etc/passwd' })).toMatchObject({
      header: 'origin',
    });
  });

  it('refuses loopback names when MCP_ALLOW_LOOPBACK is off', () => {
    const strict = { ...policy, allowLoopback: false };
    expect(refusedOrigin(strict, { host: '127.0.0.1:3000' })).toMatchObject({ header: 'host' });
    expect(refusedOrigin(strict, { host: 'settle.example.com', origin: 'http://localhost:5173' })).toMatchObject({
      header: 'origin',
    });
  });

  it('refuses a configured origin that is not an origin, at start', () => {
    const vars = (value: string) => ({ ...testEnv().vars, MCP_ALLOWED_ORIGINS: value });
    expect(loadConfig(vars('https://app.example.com, http://localhost:5173/')).mcp.allowedOrigins).toEqual([
      'https://app.example.com',
      'http://localhost:5173',
    ]);
    for (const bad of ['app.example.com', 'https://app.example.com/path', 'ftp://app.example.com']) {
      expect(() => loadConfig(vars(bad)), bad).toThrow(ConfigError);
      expect(() => loadConfig(vars(bad)), bad).toThrow(/MCP_ALLOWED_ORIGINS/);
    }
  });
});

describe('POST /mcp with a foreign Host or Origin', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({
      overrides: { PUBLIC_BASE_URL: 'https://settle.example.com', MCP_ALLOWED_ORIGINS: 'https://app.example.com' },
    });
    ({ auth } = await t.tenantWithKey(['agents:write', 'runs:write']));
  });
  afterAll(async () => {
    await t.close();
  });

  const mcp = (headers: Record<string, string>, payload: unknown = initialize) =>
    t.app.inject({
      method: 'POST',
      url: '/mcp',
      headers: { accept: 'application/json, text/event-stream', ...headers },
      payload: payload as Record<string, unknown>,
    });

  it("answers 403 in the contract's shape before authentication: no key, a bad key and a good one alike", async () => {
    for (const credential of [{}, { authorization: 'Bearer sk_nope.nope' }, auth]) {
      const res = await mcp({ host: 'evil.example.com', origin: 'http://evil.example.com', ...credential });
      expect(res.statusCode, res.body).toBe(403);
      expect(res.json()).toEqual({
        code: 'FORBIDDEN',
        message: expect.stringContaining('evil.example.com'),
        details: { header: 'host' },
        requestId: expect.any(String),
      });
    }
    const origin = await mcp({ host: 'settle.example.com', origin: 'https://evil.example.com', ...auth });
    expect(origin.statusCode).toBe(403);
    expect(origin.json()).toMatchObject({ code: 'FORBIDDEN', details: { header: 'origin' } });
  });

  it('never reaches a tool: a refused register_agent registers nothing', async () => {
    const call = {
      jsonrpc: '2.0',
      id: 2,
      method: 'tools/call',
      params: { name: 'register_agent', arguments: { namespace: 'rebind', name: 'victim' } },
    };
    const res = await mcp({ host: 'settle.example.com', origin: 'http://evil.example.com', ...auth }, call);
    expect(res.statusCode).toBe(403);
    const agent = await t.app.inject({ method: 'GET', url: '/v1/agents/rebind:agent:victim', headers: auth });
    expect(agent.statusCode).toBe(404);
    // The control: the same call from an allowed origin registers it.
    const allowed = await mcp({ host: 'settle.example.com', origin: 'https://app.example.com', ...auth }, call);
    expect(allowed.statusCode, allowed.body).toBe(200);
    expect(allowed.json().result.isError, allowed.body).toBeFalsy();
    expect(
      (await t.app.inject({ method: 'GET', url: '/v1/agents/rebind:agent:victim', headers: auth })).statusCode,
    ).toBe(200);
  });

  it('answers its own host and origin, loopback, and the allowed origins; a missing Origin is judged by Host alone', async () => {
    const cases: Array<Record<string, string>> = [
      { host: 'settle.example.com' },
      { host: 'settle.example.com', origin: 'https://settle.example.com' },
      { host: 'settle.example.com', origin: 'https://app.example.com' },
      { host: '127.0.0.1:3000', origin: 'http://localhost:3000' },
    ];
    for (const headers of cases) {
      const res = await mcp({ ...headers, ...auth });
      expect(res.statusCode, `${JSON.stringify(headers)}: ${res.body}`).toBe(200);
      expect(res.json().result.serverInfo.name).toBe('agent-settlement');
    }
    // Allowed Host without a key: authentication decides, as before.
    expect((await mcp({ host: 'settle.example.com' })).statusCode).toBe(401);
  });

  it('leaves every other route alone', async () => {
    expect(
      (
        await t.app.inject({
          method: 'GET',
          url: '/healthz',
          headers: { host: 'evil.example.com', origin: 'http://evil.example.com' },
        })
      ).statusCode,
    ).toBe(200);
  });
});
