import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

// The client as another project gets it: `npm pack` the workspace package (its prepack compiles it), install the
// tarball into an ESM project and a CommonJS project outside the repository, and run the quick start from each
// against a listening service: register, run, signed events, finalize, settle, verify offline.
const root = fileURLToPath(new URL('../..', import.meta.url));
const packageDir = join(root, 'packages/client');
const manifest = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')) as {
  name: string;
  version: string;
};
const run = promisify(execFile);

/**
 * The environment for npm outside this repository: `npm test` exports npm_config_local_prefix and the repository's
 * npm_package_* values, which would point an install back at this checkout. Only the network and cache settings stay.
 */
function npmEnv(): NodeJS.ProcessEnv {
  const keep = new Set(['registry', 'cache', 'userconfig', 'cafile', 'proxy', 'https_proxy', 'noproxy', 'strict_ssl']);
  return Object.fromEntries(
    Object.entries(process.env).filter(([key]) => {
      const npm = /^npm_(?:config_)?(.*)$/i.exec(key);
      return !npm || (/^npm_config_/i.test(key) && keep.has(npm[1]!.toLowerCase()));
    }),
  );
}

const npm = (args: string[], cwd: string, timeout = 240_000) =>
  run('npm', args, { cwd, env: npmEnv(), timeout, maxBuffer: 16 * 1024 * 1024 });

// The README's quick start, once as ESM and once as CommonJS; each prints one JSON line of what it saw.
const quickStart = `
const baseUrl = process.env.SETTLEMENT_URL;
const admin = createSettlementClient({ baseUrl, apiKey: process.env.SETTLEMENT_ADMIN_KEY });
const tenant = await admin.createTenant({ body: { name: 'packed-client' } });
const { token } = await admin.issueApiKey({ body: { tenantId: tenant.tenantId, scopes: ['agents:write', 'runs:write'] } });
const client = createSettlementClient({ baseUrl, apiKey: token });
const buyer = await client.createAgent({ name: 'buyer' });
const worker = await client.createAgent({ name: 'summarizer' });
await admin.creditWallet({ params: { path: { walletId: buyer.agentId } }, body: { amount: 10000, currency: 'USD' } });
const run = await client.createRun({
  body: {
    agentId: worker.agentId,
    terms: { accuracy: { min: 0.9 } },
    settlement: { payerAgentId: buyer.agentId, amount: 2500, currency: 'USD' },
  },
});
const signer = await client.eventSigner(run.runId, worker);
await client.appendEvents(signer, [
  { type: 'sample', payload: { latencyMs: 420, correct: true } },
  { type: 'metric', payload: { name: 'accuracy', value: 0.96 } },
]);
await client.finalizeRun({ params: { path: { runId: run.runId } } });
const finalized = await client.waitForFinalized(run.runId);
await client.settleRun({ params: { path: { runId: run.runId } } });
const settlement = await client.waitForSettlement(run.runId);
const artifact = await client.verifyArtifactLocally(finalized.artifactId);
const receipt = await client.verifyReceiptLocally(run.runId);
// Offline, from the documents alone: one changed payload byte must fail the artifact's checks.
const jwks = await client.getJwks();
const altered = structuredClone(artifact.artifact);
altered.events.items[0].payload.latencyMs = 421;
let refused = null;
try {
  await client.getRun({ params: { path: { runId: 'run_missing' } } });
} catch (err) {
  refused = { name: err.name, isApiError: err instanceof SettlementApiError, status: err.status, code: err.code };
}
console.log(JSON.stringify({
  runId: run.runId,
  verdict: finalized.verdict,
  settlement: { status: settlement.status, released: settlement.releasedAmount },
  artifactVerified: artifact.verified,
  receiptVerified: receipt.verified,
  alteredChecks: verifyArtifact(altered, jwks).checks,
  refused,
  webhookVerifier: typeof verifyWebhook,
}));
`;

const projects = {
  esm: {
    manifest: { name: 'packed-client-esm', private: true, type: 'module' },
    script: `import { createSettlementClient, SettlementApiError, verifyArtifact } from 'agent-settlement-client';
import { verifyWebhook } from 'agent-settlement-client/webhooks';
${quickStart}`,
  },
  cjs: {
    manifest: { name: 'packed-client-cjs', private: true, type: 'commonjs' },
    script: `const { createSettlementClient, SettlementApiError, verifyArtifact } = require('agent-settlement-client');
const { verifyWebhook } = require('agent-settlement-client/webhooks');
(async () => {
${quickStart}
})().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});`,
  },
} as const;

// Types as a TypeScript user gets them from the tarball: a wrong call is an error (the declarations are there, not
// `any`), under ESM (import) and CommonJS (import = require) resolution alike.
const typeChecks = {
  'check.mts': `import { createSettlementClient, RunEventSigner, type Run } from 'agent-settlement-client';
import { verifyWebhook } from 'agent-settlement-client/webhooks';
const client = createSettlementClient({ baseUrl: 'http://127.0.0.1:1' });
export async function check(): Promise<Run> {
  // @ts-expect-error runId is the path parameter's name
  await client.getRun({ params: { path: { runID: 'run_x' } } });
  void verifyWebhook;
  void RunEventSigner;
  return client.getRun({ params: { path: { runId: 'run_x' } } });
}
`,
  'check.cts': `import client = require('agent-settlement-client');
const c = client.createSettlementClient({ baseUrl: 'http://127.0.0.1:1' });
// @ts-expect-error createRun needs a body
void c.createRun({});
export const status: Promise<string> = c.getRun({ params: { path: { runId: 'run_x' } } }).then((r) => r.status);
`,
};

let t: TestApp;
let baseUrl: string;
let work: string;
let tarball: string;

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'agent-settlement-client-'));
  t = await startTestApp({ workers: ['finalize', 'settle'] });
  await t.app.listen({ host: '127.0.0.1', port: 0 });
  baseUrl = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
  // prepack builds dist/ (tsc, twice): the tarball holds what the sources compile to now.
  await npm(['pack', '--pack-destination', work], packageDir);
  tarball = join(work, `${manifest.name}-${manifest.version}.tgz`);
  await Promise.all(
    Object.entries(projects).map(async ([kind, project]) => {
      const dir = join(work, kind);
      mkdirSync(dir);
      writeFileSync(join(dir, 'package.json'), `${JSON.stringify(project.manifest, null, 2)}\n`);
      writeFileSync(join(dir, 'quick-start.js'), project.script);
      await npm(['install', '--no-audit', '--no-fund', tarball], dir);
    }),
  );
}, 600_000);

afterAll(async () => {
  await t?.close();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the packed client (agent-settlement-client)', () => {
  it('holds compiled ESM, CommonJS and declarations only, and installs with no server dependency', async () => {
    const { stdout } = await run('tar', ['-tzf', tarball]);
    const files = stdout.split('\n').filter(Boolean);
    expect(files).toContain('package/dist/esm/index.js');
    expect(files).toContain('package/dist/esm/index.d.ts');
    expect(files).toContain('package/dist/cjs/index.js');
    expect(files).toContain('package/dist/cjs/index.d.ts');
    expect(files).toContain('package/dist/cjs/package.json');
    expect(files.filter((f) => !/^package\/(dist\/|package\.json$|README\.md$)/.test(f))).toEqual([]);
    expect(files.filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))).toEqual([]);

    for (const kind of Object.keys(projects)) {
      const installed = readdirSync(join(work, kind, 'node_modules')).filter((n) => !n.startsWith('.'));
      // openapi-fetch and its one helper package: nothing of Fastify, BullMQ, MongoDB or Redis.
      expect(installed.sort(), kind).toEqual([
        'agent-settlement-client',
        'openapi-fetch',
        'openapi-typescript-helpers',
      ]);
    }
  });

  for (const kind of Object.keys(projects) as Array<keyof typeof projects>) {
    it(
      `runs the quick start from a ${kind === 'esm' ? 'ESM' : 'CommonJS'} project against a listening service`,
      { timeout: 180_000 },
      async () => {
        const { stdout } = await run(process.execPath, ['quick-start.js'], {
          cwd: join(work, kind),
          env: { ...npmEnv(), SETTLEMENT_URL: baseUrl, SETTLEMENT_ADMIN_KEY: t.env.adminKey },
          timeout: 170_000,
        });
        const seen = JSON.parse(stdout.trim().split('\n').at(-1)!);
        expect(seen).toMatchObject({
          verdict: 'pass',
          settlement: { status: 'completed', released: 2500 },
          artifactVerified: true,
          receiptVerified: true,
          alteredChecks: { artifactHash: false, eventSignatures: false },
          refused: { name: 'SettlementApiError', isApiError: true, status: 404 },
          webhookVerifier: 'function',
        });
        // The service agrees with what the packed client verified.
        const verify = await fetch(`${baseUrl}/v1/verify/${seen.runId}`).then((r) => r.json());
        expect(verify).toMatchObject({ verified: true, verdict: 'pass', settlement: { status: 'completed' } });
      },
    );
  }

  it(
    'ships declarations that type-check a caller under ESM and CommonJS resolution',
    { timeout: 180_000 },
    async () => {
      const dir = join(work, 'esm');
      for (const [name, text] of Object.entries(typeChecks)) writeFileSync(join(dir, name), text);
      const tsc = join(root, 'node_modules/typescript/bin/tsc');
      const args = [
        ...['--noEmit', '--strict', '--skipLibCheck', '--module', 'nodenext', '--moduleResolution', 'nodenext'],
        ...['--target', 'es2022', '--types', 'node', '--typeRoots', join(root, 'node_modules/@types')],
        ...Object.keys(typeChecks),
      ];
      const result = await run(process.execPath, [tsc, ...args], { cwd: dir, timeout: 170_000 }).catch(
        (err: { stdout?: string; code?: number }) => ({ stdout: err.stdout ?? '', failed: err.code }),
      );
      expect(result.stdout).toBe('');
      expect('failed' in result ? result.failed : 0).toBe(0);
    },
  );
});
