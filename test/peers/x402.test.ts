// x402's community tools against this service: x402-conformance (`x402conf live` over the facilitator's public
// /supported, `x402conf resource` over the paid tool's 402 answers, JUnit kept in .data/x402-conformance/) and
// x402lint (`check` on the paid tool: no failure; the unknown-scheme warning is inherent to a scheme of our own).
import { writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPaidTool } from '../../examples/paid-tool/tool.ts';
import { installPeerTools, reportsDir, run, startService, venvBin, type PeerService } from './harness.ts';

interface Check {
  check: string;
  pass: boolean;
  severity: string;
}

/** Every check of an x402conf JSON answer, with a line per failure for the assertion message. */
function checksOf(stdout: string): { checks: Check[]; failures: string } {
  const doc = JSON.parse(stdout) as { results: Array<{ target: string; checks: Check[] }> };
  const checks = doc.results.flatMap((r) => r.checks);
  const failures = doc.results
    .flatMap((r) => r.checks.filter((c) => !c.pass).map((c) => `${r.target}: ${c.check} (${c.severity})`))
    .join('\n');
  return { checks, failures };
}

describe('x402 peer suites: x402-conformance 1.6.0 and x402lint 0.5.2', () => {
  let s: PeerService;
  let tool: Server;
  let toolUrl: string;
  let reports: string;

  beforeAll(async () => {
    installPeerTools();
    reports = reportsDir('x402-conformance');
    s = await startService('api', ['agents:write', 'x402:write']);
    const payee = await s.agent('search-tool');
    // The example paid tool as its README starts it, with the service as its facilitator.
    tool = createPaidTool({
      serviceUrl: s.api.url,
      apiKey: s.token,
      network: 'agentstl:default',
      payeeAgentId: payee,
    }).listen(0, '127.0.0.1');
    await new Promise((resolve) => tool.once('listening', resolve));
    toolUrl = `http://127.0.0.1:${(tool.address() as { port: number }).port}`;
  }, 400_000);

  afterAll(async () => {
    if (tool) await new Promise((resolve) => tool.close(resolve));
    await s?.api.stop();
  });

  it("x402conf live: the facilitator's /supported passes S0-S4 without a key (CAIP-2 networks)", async () => {
    const out = await run(`${venvBin}/x402conf`, ['live', '--fail-on-error', `${s.api.url}/x402/facilitator`]);
    writeFileSync(`${reports}/live.json`, out.stdout);
    const { checks, failures } = checksOf(out.stdout);
    expect(checks.map((c) => c.check.split(' ')[0])).toEqual(['S1', 'S2', 'S3', 'S4']);
    expect(failures, out.stderr).toBe('');
    expect(out.code, out.stderr).toBe(0);
  }, 120_000);

  it("x402conf resource: the paid tool's fixed and metered 402 answers pass P1-P7", async () => {
    const out = await run(`${venvBin}/x402conf`, [
      'resource',
      '--fail-on-error',
      `${toolUrl}/search?q=ledger`,
      `${toolUrl}/summarize?words=5`,
    ]);
    writeFileSync(`${reports}/resource-402.json`, out.stdout);
    const { checks, failures } = checksOf(out.stdout);
    expect(checks.length).toBe(14);
    expect(failures, out.stderr).toBe('');
    expect(out.code, out.stderr).toBe(0);
  }, 120_000);

  it('x402conf report: both runs as JUnit, no failure', async () => {
    const out = await run(`${venvBin}/x402conf`, [
      'report',
      '--dir',
      reports,
      '--junit',
      `${reports}/junit.xml`,
      '--fail-on-error',
    ]);
    expect(out.code, `${out.stdout}\n${out.stderr}`).toBe(0);
    expect(JSON.parse(out.stdout)).toEqual({ checks: 18, failed: 0, failed_ids: [] });
  }, 60_000);

  it('x402lint facilitator: reads /supported without a key; its only notes are the two schemes of our own', async () => {
    const out = await run(`${venvBin}/x402lint`, ['facilitator', '--json', `${s.api.url}/x402/facilitator`]);
    expect(out.stderr).toBe('');
    const summary = JSON.parse(out.stdout) as {
      kinds: Array<{ scheme: string; network: string }>;
      networks: string[];
      notes: string[];
    };
    expect(summary.kinds.map((k) => `${k.scheme} ${k.network}`)).toEqual([
      'escrow-gate agentstl:default',
      'escrow-session agentstl:default',
    ]);
    expect(summary.notes).toEqual([
      "unrecognised scheme 'escrow-gate' for agentstl:default",
      "unrecognised scheme 'escrow-session' for agentstl:default",
    ]);
  }, 60_000);

  it('x402lint check: no failure on either paid route', async () => {
    for (const url of [`${toolUrl}/search?q=ledger`, `${toolUrl}/summarize?words=5`]) {
      const out = await run(`${venvBin}/x402lint`, ['check', '--json', url]);
      const report = JSON.parse(out.stdout) as {
        ok: boolean;
        counts: Record<string, number>;
        checks: Array<{ id: string; level: string; message: string }>;
      };
      const problems = report.checks
        .filter((c) => c.level === 'FAIL' || c.level === 'WARN')
        .map((c) => `${c.level} ${c.id}: ${c.message}`);
      expect(report.counts.FAIL ?? 0, problems.join('\n')).toBe(0);
      // The one warning allowed: a scheme of our own is unknown to the linter.
      expect(problems, url).toEqual(["WARN accepts[0].scheme: unrecognised scheme 'escrow-gate'"]);
      expect(report.checks.find((c) => c.id === 'accepts[0].network')).toMatchObject({
        level: 'PASS',
        message: 'agentstl:default (CAIP-2)',
      });
      expect(report.ok).toBe(true);
      expect(out.code, out.stderr).toBe(0);
    }
  }, 120_000);
});
