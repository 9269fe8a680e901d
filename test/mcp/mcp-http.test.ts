// The service's own MCP endpoint (/mcp, Streamable HTTP) and the stdio command the bootstrap hands out, both driven
// from outside the repository, as an agent runtime on the service's machine would.
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../../src/domain/scopes.ts';
import { type TestApp } from '../helpers/context.ts';
import { bootstrap, onboardingTenant, startListeningApp } from '../onboarding/helpers.ts';

const URL_CLIENT = resolve(import.meta.dirname, '../fixtures/mcp-url-client.mjs');
const run = promisify(execFile);

interface UrlSession {
  client: Client;
  call(name: string, args?: Record<string, unknown>): Promise<CallToolResult>;
  ok(name: string, args?: Record<string, unknown>): Promise<Record<string, any>>;
}

describe('MCP by URL (/mcp) and by the bootstrap command', () => {
  let t: TestApp & { baseUrl: string };
  let outside: string;
  const sessions: Client[] = [];

  async function connect(token: string): Promise<UrlSession> {
    const client = new Client({ name: 'mcp-http-test', version: '1.0.0' });
    await client.connect(
      new StreamableHTTPClientTransport(new URL(`${t.baseUrl}/mcp`), {
        requestInit: { headers: { authorization: `Bearer ${token}` } },
      }),
    );
    sessions.push(client);
    const call = async (name: string, args: Record<string, unknown> = {}) =>
      (await client.callTool({ name, arguments: args })) as CallToolResult;
    return {
      client,
      call,
      async ok(name, args) {
        const result = await call(name, args);
        expect(result.isError, JSON.stringify(result.content)).toBeFalsy();
        return result.structuredContent as Record<string, any>;
      },
    };
  }

  const tenantKey = (scopes: Scope[]) => t.tenantWithKey(scopes);

  beforeAll(async () => {
    t = await startListeningApp();
    outside = await mkdtemp(join(tmpdir(), 'mcp-outside-'));
  });
  afterAll(async () => {
    for (const client of sessions) await client.close().catch(() => undefined);
    await t?.close();
    if (outside) await rm(outside, { recursive: true, force: true });
  });

  it(
    'a client in another process, started in a directory outside the repository, connects by URL, lists the tools and calls one',
    { timeout: 60_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const boot = await bootstrap(t, tenant.tenantId, tenant.headers);
      expect(boot.mcpHttp).toEqual({
        type: 'http',
        url: `${t.baseUrl}/mcp`,
        headers: { Authorization: `Bearer ${boot.mcp.env.SERVICE_API_KEY}` },
      });
      const { stdout } = await run(process.execPath, [URL_CLIENT], {
        cwd: outside,
        env: {
          PATH: process.env.PATH,
          MCP_URL: boot.mcpHttp.url,
          MCP_AUTHORIZATION: boot.mcpHttp.headers.Authorization,
          MCP_TOOL: 'whoami',
        },
      });
      const seen = JSON.parse(stdout);
      expect(seen.cwd).toBe(outside);
      expect(seen.server).toMatchObject({ name: 'agent-settlement' });
      expect(seen.tools).toContain('register_agent');
      expect(seen.call.isError).toBeFalsy();
      expect(seen.call.structuredContent).toMatchObject({
        tenantId: tenant.tenantId,
        keyId: boot.apiKey.keyId,
        health: { status: 'ready' },
      });
    },
  );

  it(
    "the bootstrap's stdio command (absolute node and launcher, no npx) starts from a temp directory and offers exactly the tools /mcp offers",
    { timeout: 60_000 },
    async () => {
      const tenant = await onboardingTenant(t);
      const boot = await bootstrap(t, tenant.tenantId, tenant.headers);
      expect(boot.mcp.command).toBe(process.execPath);
      expect(boot.mcp.args).toEqual([resolve(import.meta.dirname, '../../bin/agent-settlement.js'), 'mcp']);
      expect(JSON.parse(boot.mcpConfigJson).mcpServers['agent-settlement']).toEqual(boot.mcp);

      const stdio = new Client({ name: 'mcp-http-test-stdio', version: '1.0.0' });
      await stdio.connect(
        new StdioClientTransport({
          command: boot.mcp.command,
          args: boot.mcp.args,
          env: { ...boot.mcp.env, HOME: outside },
          cwd: outside,
        }),
      );
      sessions.push(stdio);
      const byUrl = await connect(boot.mcp.env.SERVICE_API_KEY!);
      const stdioTools = (await stdio.listTools()).tools;
      const urlTools = (await byUrl.client.listTools()).tools;
      expect(urlTools.map((x) => x.name)).toEqual(stdioTools.map((x) => x.name));
      expect(urlTools.map((x) => x.inputSchema)).toEqual(stdioTools.map((x) => x.inputSchema));
      const me = (await stdio.callTool({ name: 'whoami', arguments: {} })) as CallToolResult;
      expect(me.structuredContent).toMatchObject({ tenantId: tenant.tenantId });
    },
  );

  it("refuses a missing, malformed or unknown bearer with 401 in the contract's shape (the admin key, of no tenant, with 403)", async () => {
    const tenant = await tenantKey(['runs:write']);
    const message = { jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} };
    const headers = { accept: 'application/json, text/event-stream', 'content-type': 'application/json' };
    for (const authorization of [
      undefined,
      'Bearer nonsense',
      `Bearer sk_${tenant.keyId}.${'x'.repeat(43)}`,
      t.admin.authorization!,
    ]) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: authorization ? { ...headers, authorization } : headers,
        payload: message,
      });
      const expected = authorization === t.admin.authorization ? 403 : 401;
      expect(res.statusCode, String(authorization)).toBe(expected);
      expect(res.json()).toMatchObject({
        code: expected === 401 ? 'UNAUTHENTICATED' : 'FORBIDDEN',
        message: expect.any(String),
        requestId: expect.any(String),
      });
    }
    // A live key with a message the MCP transport refuses: 422 in the same shape, not a JSON-RPC body.
    const refused = await t.app.inject({
      method: 'POST',
      url: '/mcp',
      headers: { ...headers, authorization: `Bearer ${tenant.token}` },
      payload: { jsonrpc: '2.0' },
    });
    expect(refused.statusCode).toBe(422);
    expect(refused.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'body' }] },
      requestId: expect.any(String),
    });
    // The SDK client sees the refusal at connect.
    await expect(connect('sk_key_unknownunknown.' + 'y'.repeat(43))).rejects.toThrow(
      /401|Unauthorized|UNAUTHENTICATED/i,
    );
  });

  it(
    'runs agents through /mcp with their keys kept sealed in the service; a keyFile path is refused',
    { timeout: 60_000 },
    async () => {
      const tenant = await tenantKey(['agents:write', 'runs:write']);
      const mcp = await connect(tenant.token);
      const agent = await mcp.ok('register_agent', { namespace: 'url', name: 'worker' });
      expect(agent).toMatchObject({ agentId: 'url:agent:worker', keyFile: 'sealed in the service (/mcp)' });
      const created = await mcp.ok('create_run', { agentId: agent.agentId, terms: { accuracy: { min: 0.5 } } });
      const appended = await mcp.ok('append_events', {
        runId: created.runId,
        events: [{ type: 'metric', payload: { name: 'accuracy', value: 0.9 } }],
      });
      expect(appended).toMatchObject({ accepted: 1, head: { seq: 1 } });

      const stored = await t.runtime.stores.mcpAgentKeys.get(tenant.tenantId, agent.agentId);
      expect(stored).toMatchObject({ keyId: agent.keyId, tenantId: tenant.tenantId });
      expect(JSON.stringify(stored)).not.toContain('PRIVATE KEY');

      const withPath = await mcp.call('register_agent', { keyFile: join(outside, 'keys.json') });
      expect(withPath.structuredContent).toMatchObject({ error: { code: 'KEY_FILE_NOT_SUPPORTED' } });
    },
  );

  it(
    "keeps scopes and tenants as the HTTP routes do: another tenant's run and agent key are NOT_FOUND, a missing scope FORBIDDEN",
    { timeout: 60_000 },
    async () => {
      const owner = await tenantKey(['agents:write', 'runs:write', 'wallets:write']);
      const intruder = await tenantKey(['agents:write', 'runs:write', 'wallets:write']);
      const reader = await tenantKey(['runs:read']);
      const ownerMcp = await connect(owner.token);
      const agent = await ownerMcp.ok('register_agent', { namespace: 'own', name: 'a1' });
      const created = await ownerMcp.ok('create_run', { agentId: agent.agentId });

      const intruderMcp = await connect(intruder.token);
      for (const [tool, args] of [
        ['get_run', { runId: created.runId }],
        ['append_events', { runId: created.runId, events: [{ type: 'log', payload: 'forged' }] }],
        ['wallet_balance', { walletId: agent.agentId }],
      ] as const) {
        const result = await intruderMcp.call(tool, args);
        expect(result.isError, tool).toBe(true);
        expect(result.structuredContent, tool).toMatchObject({ error: { code: 'NOT_FOUND', status: 404 } });
      }
      // Nothing the intruder tried reached the owner's run.
      expect((await ownerMcp.ok('get_run', { runId: created.runId })).head).toEqual({ seq: 0, chainHash: null });

      const readerMcp = await connect(reader.token);
      const refused = await readerMcp.call('create_run', { agentId: agent.agentId });
      expect(refused.structuredContent).toMatchObject({ error: { code: 'FORBIDDEN', status: 403 } });
    },
  );
});
