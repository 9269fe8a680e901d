// Drives `agent-settlement mcp` from outside, as an agent runtime does: the SDK's own Client spawns the launcher
// over stdio with the three bootstrap variables, against the real API listening on a loopback port.
import { chmod, mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { credit } from '../helpers/money.ts';
import { freePort } from '../helpers/redis-instance.ts';

const BIN = resolve(import.meta.dirname, '../../bin/agent-settlement.js');

const TOOLS = [
  'whoami',
  'register_agent',
  'create_run',
  'append_events',
  'finalize_run',
  'get_run',
  'get_verification',
  'settle_run',
  'get_settlement',
  'wallet_balance',
  'gate_create',
  'gate_quote',
  'gate_authorize_payment',
  'gate_verify',
  'gate_get',
];

interface McpSession {
  client: Client;
  /** Every tool result and stderr line of the session, to search for leaked secrets. */
  transcript: string[];
  call(name: string, args?: Record<string, unknown>): Promise<CallToolResult>;
  /** A call that must succeed; returns its structuredContent. */
  ok(name: string, args?: Record<string, unknown>): Promise<Record<string, any>>;
}

async function startMcp(env: Record<string, string>, home: string): Promise<McpSession> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp'],
    env: { ...env, HOME: home },
    stderr: 'pipe',
  });
  const transcript: string[] = [];
  transport.stderr?.on('data', (chunk: Buffer) => transcript.push(chunk.toString()));
  const client = new Client({ name: 'mcp-server-test', version: '1.0.0' });
  await client.connect(transport);
  const call = async (name: string, args: Record<string, unknown> = {}) => {
    const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
    transcript.push(JSON.stringify(result));
    return result;
  };
  return {
    client,
    transcript,
    call,
    async ok(name, args) {
      const result = await call(name, args);
      expect(result.isError, JSON.stringify(result.content)).toBeFalsy();
      expect(result.content[0]).toMatchObject({ type: 'text' });
      return result.structuredContent as Record<string, any>;
    },
  };
}

async function poll<T>(read: () => Promise<T>, until: (value: T) => boolean, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (until(value)) return value;
    if (Date.now() > deadline) throw new Error(`condition not reached: ${JSON.stringify(value)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('agent-settlement mcp (stdio, real API)', () => {
  let t: TestApp;
  let baseUrl: string;
  let tenant: Awaited<ReturnType<TestApp['tenantWithKey']>>;
  let home: string;
  let mcp: McpSession;
  let keyFile: string;

  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize', 'settle'] });
    baseUrl = await t.app.listen({ host: '127.0.0.1', port: 0 });
    tenant = await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write']);
    home = await mkdtemp(join(tmpdir(), 'mcp-home-'));
    keyFile = join(home, 'keys-dir', 'agents.json');
    mcp = await startMcp(
      { SERVICE_BASE_URL: baseUrl, SERVICE_TENANT_ID: tenant.tenantId, SERVICE_API_KEY: tenant.token },
      home,
    );
  });

  afterAll(async () => {
    await mcp?.client.close();
    await t?.close();
    if (home) await rm(home, { recursive: true, force: true });
  });

  it('initializes, lists every tool with input and output schemas, and whoami names the tenant', async () => {
    expect(mcp.client.getServerVersion()?.name).toBe('agent-settlement');
    const { tools } = await mcp.client.listTools();
    expect(tools.map((tool) => tool.name).sort()).toEqual([...TOOLS].sort());
    for (const tool of tools) {
      expect(tool.description, tool.name).toMatch(/\S/);
      expect(tool.inputSchema.type, tool.name).toBe('object');
      expect(tool.outputSchema?.type, tool.name).toBe('object');
    }
    const me = await mcp.ok('whoami');
    expect(me).toMatchObject({
      tenantId: tenant.tenantId,
      keyId: tenant.keyId,
      scopes: ['agents:write', 'runs:write', 'wallets:write'],
      health: { status: 'ready' },
    });
  });

  it(
    'runs an agent through tools alone: register, create, append signed events, finalize, verify',
    { timeout: 60_000 },
    async () => {
      const agent = await mcp.ok('register_agent', {
        namespace: 'mcp',
        name: 'worker-1',
        displayName: 'MCP worker',
        keyFile,
      });
      expect(agent).toMatchObject({
        agentId: 'mcp:agent:worker-1',
        keyId: expect.stringMatching(/^key_[0-9a-f]{24}$/),
        keyFile,
      });

      // The private key is on disk, readable by its owner only, and matches the registered key id.
      expect((await stat(keyFile)).mode & 0o777).toBe(0o600);
      expect((await stat(dirname(keyFile))).mode & 0o777).toBe(0o700);
      const stored = JSON.parse(await readFile(keyFile, 'utf8'));
      expect(stored).toMatchObject({
        version: 1,
        tenantId: tenant.tenantId,
        agents: { [agent.agentId]: { keyId: agent.keyId } },
      });
      const privateKeyPem: string = stored.agents[agent.agentId].privateKey;
      expect(privateKeyPem).toMatch(/^-----BEGIN PRIVATE KEY-----/);

      const run = await mcp.ok('create_run', {
        agentId: agent.agentId,
        terms: { accuracy: { min: 0.9 } },
        idempotencyKey: 'mcp-run-1',
      });
      expect(run).toMatchObject({
        status: 'in_progress',
        agentId: agent.agentId,
        artifactId: null,
        head: { seq: 0, chainHash: null },
      });
      // Same idempotency key, same input: the first answer, not a second run.
      expect(
        (
          await mcp.ok('create_run', {
            agentId: agent.agentId,
            terms: { accuracy: { min: 0.9 } },
            idempotencyKey: 'mcp-run-1',
          })
        ).runId,
      ).toBe(run.runId);

      const samples = await mcp.ok('append_events', {
        runId: run.runId,
        keyFile,
        events: [
          { type: 'sample', payload: { latencyMs: 120, correct: true } },
          { type: 'sample', payload: { latencyMs: 180, correct: true }, id: 'evt_mcp_sample_2' },
          { type: 'log', payload: 'tool call finished' },
        ],
      });
      expect(samples).toMatchObject({ runId: run.runId, accepted: 3, head: { seq: 3 } });
      expect(samples.eventIds).toHaveLength(3);
      expect(samples.eventIds[1]).toBe('evt_mcp_sample_2');
      // A second batch chains after the head the first one left.
      const metric = await mcp.ok('append_events', {
        runId: run.runId,
        keyFile,
        events: [{ type: 'metric', payload: { name: 'accuracy', value: 0.95 } }],
      });
      expect(metric.head.seq).toBe(4);

      // The service's own refusals come back as tool errors with code, status and details.
      const early = await mcp.call('get_verification', { runId: run.runId });
      expect(early.isError).toBe(true);
      expect(early.structuredContent).toMatchObject({
        error: { code: 'TRANSITION_ILLEGAL', status: 409, details: { status: 'in_progress' } },
      });
      expect(JSON.stringify(early.content)).toContain('TRANSITION_ILLEGAL');

      expect(await mcp.ok('finalize_run', { runId: run.runId })).toMatchObject({
        runId: run.runId,
        status: 'finalizing',
      });
      const finalized = await poll(
        () => mcp.ok('get_run', { runId: run.runId }),
        (r) => r.status === 'finalized',
      );
      expect(finalized).toMatchObject({ verdict: 'pass', eventCount: 4, artifactId: expect.stringMatching(/^art_/) });

      const verification = await mcp.ok('get_verification', { runId: run.runId });
      expect(verification).toMatchObject({
        verified: true,
        checks: { artifactHash: true, serviceSignature: true, eventSignatures: true, chain: true },
        runId: run.runId,
        artifactId: finalized.artifactId,
        verdict: 'pass',
        eventCount: 4,
      });

      const appendAfterFinal = await mcp.call('append_events', {
        runId: run.runId,
        keyFile,
        events: [{ type: 'log', payload: 'late' }],
      });
      expect(appendAfterFinal.structuredContent).toMatchObject({ error: { code: 'TRANSITION_ILLEGAL', status: 409 } });

      // Neither secret ever left the server: not in results, errors, nor its stderr.
      const secret = tenant.token.slice(tenant.token.indexOf('.') + 1);
      const pemBody = privateKeyPem.split('\n')[1]!;
      for (const entry of mcp.transcript) {
        expect(entry).not.toContain(secret);
        expect(entry).not.toContain(pemBody);
        expect(entry).not.toContain('PRIVATE KEY');
      }
    },
  );

  it('keeps keys in ~/.agent-settlement/keys/<tenantId>.json by default, and signs only with a key it holds', async () => {
    const other = await mcp.ok('register_agent', {});
    const defaultPath = join(home, '.agent-settlement', 'keys', `${tenant.tenantId}.json`);
    expect(other).toMatchObject({ agentId: expect.stringMatching(/^agents:agent:/), keyFile: defaultPath });
    expect((await stat(defaultPath)).mode & 0o777).toBe(0o600);
    expect((await stat(dirname(defaultPath))).mode & 0o777).toBe(0o700);
    const run = await mcp.ok('create_run', { agentId: other.agentId });
    const result = await mcp.call('append_events', {
      runId: run.runId,
      keyFile,
      events: [{ type: 'log', payload: 1 }],
    });
    expect(result.isError).toBe(true);
    expect(result.structuredContent).toMatchObject({ error: { code: 'AGENT_KEY_NOT_FOUND' } });
    expect(await mcp.ok('append_events', { runId: run.runId, events: [{ type: 'log', payload: 1 }] })).toMatchObject({
      accepted: 1,
    });

    // A key file other users can read is refused, as ssh refuses such a private key.
    await chmod(defaultPath, 0o644);
    const insecure = await mcp.call('append_events', { runId: run.runId, events: [{ type: 'log', payload: 2 }] });
    expect(insecure.structuredContent).toMatchObject({ error: { code: 'KEY_FILE_INSECURE' } });
  });

  it('settles a passing run: the payer escrow pays the worker, minus the holdback', { timeout: 60_000 }, async () => {
    const payer = await mcp.ok('register_agent', { namespace: 'mcp', name: 'payer', keyFile });
    const worker = await mcp.ok('register_agent', { namespace: 'mcp', name: 'worker-2', keyFile });
    await credit(t, payer.agentId, 5_000);
    const run = await mcp.ok('create_run', {
      agentId: worker.agentId,
      terms: { accuracy: { min: 0.9 } },
      settlement: {
        payerAgentId: payer.agentId,
        amount: 1_000,
        currency: 'USD',
        holdbackBps: 1_000,
        disputeWindowSeconds: 3_600,
      },
    });
    expect((await mcp.ok('wallet_balance', { walletId: payer.agentId })).balances.USD).toEqual({
      available: 4_000,
      escrow: 1_000,
    });

    await mcp.ok('append_events', {
      runId: run.runId,
      keyFile,
      events: [{ type: 'metric', payload: { name: 'accuracy', value: 1 } }],
    });
    await mcp.ok('finalize_run', { runId: run.runId });
    await poll(
      () => mcp.ok('get_run', { runId: run.runId }),
      (r) => r.status === 'finalized',
    );

    const accepted = await mcp.ok('settle_run', { runId: run.runId });
    expect(accepted).toMatchObject({ runId: run.runId, settlementId: expect.stringMatching(/^stl_/) });
    const settlement = await poll(
      () => mcp.ok('get_settlement', { runId: run.runId }),
      (s) => s.status !== 'pending',
    );
    expect(settlement).toMatchObject({
      settlementId: accepted.settlementId,
      status: 'completed',
      amount: 1_000,
      releasedAmount: 900,
      holdback: 100,
      currency: 'USD',
    });

    expect((await mcp.ok('wallet_balance', { walletId: worker.agentId })).balances.USD).toEqual({
      available: 900,
      escrow: 0,
    });
    expect((await mcp.ok('wallet_balance', { walletId: payer.agentId })).balances.USD).toEqual({
      available: 4_000,
      escrow: 100,
    });
  });

  it(
    'reports a wrong API key as UNAUTHENTICATED and an unreachable service as SERVICE_UNREACHABLE',
    { timeout: 60_000 },
    async () => {
      const wrongKey = `sk_${tenant.keyId}.${'x'.repeat(43)}`;
      const wrong = await startMcp(
        { SERVICE_BASE_URL: baseUrl, SERVICE_TENANT_ID: tenant.tenantId, SERVICE_API_KEY: wrongKey },
        home,
      );
      const closedPort = await freePort();
      const down = await startMcp(
        {
          SERVICE_BASE_URL: `http://127.0.0.1:${closedPort}`,
          SERVICE_TENANT_ID: tenant.tenantId,
          SERVICE_API_KEY: tenant.token,
        },
        home,
      );
      try {
        const unauthenticated = await wrong.call('whoami');
        expect(unauthenticated.isError).toBe(true);
        expect(unauthenticated.structuredContent).toMatchObject({
          error: { code: 'UNAUTHENTICATED', status: 401, message: expect.any(String), requestId: expect.any(String) },
        });
        expect(JSON.stringify(unauthenticated.content)).toContain('UNAUTHENTICATED');

        const unreachable = await down.call('whoami');
        expect(unreachable.isError).toBe(true);
        expect(unreachable.structuredContent).toMatchObject({ error: { code: 'SERVICE_UNREACHABLE' } });
        expect((unreachable.structuredContent as { error: Record<string, unknown> }).error).not.toHaveProperty(
          'status',
        );

        for (const entry of [...wrong.transcript, ...down.transcript]) {
          expect(entry).not.toContain('x'.repeat(43));
          expect(entry).not.toContain(tenant.token.slice(tenant.token.indexOf('.') + 1));
        }
      } finally {
        await wrong.client.close();
        await down.client.close();
      }
    },
  );
});
