// The MCP conformance suite (@modelcontextprotocol/conformance 0.1.11, the last release that runs on Node 20) over
// /mcp: every `server` scenario of its active suite, with mcp-expected-failures.yml naming the ones that need the
// suite's fixture server (its tools, resources and prompts). Its runner sends no credential (0.1.11 has no option
// for one), so it talks to a loopback relay that adds the tenant's bearer key and passes every other header through
// as sent, Host and Origin included: the service itself judges them (dns-rebinding-protection).
import { createServer, request, type Server } from 'node:http';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { installPeerTools, mcpConformance, reportsDir, run, startService, type PeerService } from './harness.ts';

const expectedFailures = fileURLToPath(new URL('mcp-expected-failures.yml', import.meta.url));

function relay(target: URL, token: string): Promise<Server> {
  const server = createServer((req, res) => {
    const upstream = request(
      {
        host: target.hostname,
        port: target.port,
        path: target.pathname,
        method: req.method,
        headers: { ...req.headers, authorization: `Bearer ${token}` },
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on('error', () => res.destroy());
    req.pipe(upstream);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

describe('MCP peer suite: @modelcontextprotocol/conformance 0.1.11 server scenarios against /mcp', () => {
  let s: PeerService;
  let proxy: Server;

  beforeAll(async () => {
    installPeerTools();
    s = await startService('api', ['agents:write', 'runs:write', 'x402:write', 'wallets:write']);
    proxy = await relay(new URL(`${s.api.url}/mcp`), s.token);
  }, 400_000);

  afterAll(async () => {
    if (proxy) await new Promise((resolve) => proxy.close(resolve));
    await s?.api.stop();
  });

  it("passes every scenario but those needing the suite's fixtures, dns-rebinding-protection included", async () => {
    const url = `http://127.0.0.1:${(proxy.address() as { port: number }).port}/mcp`;
    const out = await run(
      process.execPath,
      [
        mcpConformance,
        'server',
        '--url',
        url,
        '--expected-failures',
        expectedFailures,
        '-o',
        reportsDir('mcp-conformance'),
      ],
      { timeoutMs: 240_000 },
    );
    const summary = out.stdout.slice(out.stdout.indexOf('=== SUMMARY ==='));
    expect(out.code, `${summary}\n${out.stderr.slice(-4000)}`).toBe(0);
    for (const scenario of ['server-initialize', 'ping', 'tools-list', 'tools-call-error'])
      expect(summary).toMatch(new RegExp(`✓ ${scenario}: \\d+ passed, 0 failed`));
    expect(summary).toContain('✓ dns-rebinding-protection: 2 passed, 0 failed');
  }, 300_000);
});
