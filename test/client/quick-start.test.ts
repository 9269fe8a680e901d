import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

// examples/quick-start.ts, the README's client quick start, run as a user runs it: its own process, the
// agent-settlement-client workspace package (its source, through tsconfig's paths), a listening service with its
// finalize and settle workers. test/client/package.test.ts runs the packed package from projects of its own.
const root = fileURLToPath(new URL('../..', import.meta.url));
let t: TestApp;
let baseUrl: string;

beforeAll(async () => {
  t = await startTestApp({ workers: ['finalize', 'settle'] });
  await t.app.listen({ host: '127.0.0.1', port: 0 });
  baseUrl = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
});
afterAll(async () => {
  await t?.close();
});

it(
  'examples/quick-start.ts registers, runs, signs events, finalizes, settles and verifies in one go',
  { timeout: 120_000 },
  async () => {
    expect(readFileSync(`${root}examples/quick-start.ts`, 'utf8').split('\n').length).toBeLessThanOrEqual(60);
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', 'examples/quick-start.ts'], {
      cwd: root,
      env: { ...process.env, SETTLEMENT_URL: baseUrl, SETTLEMENT_ADMIN_KEY: t.env.adminKey },
      timeout: 110_000,
    });
    const runId = /^run (\S+): finalized, verdict pass, 4 events$/m.exec(stdout)?.[1];
    expect(runId, stdout).toBeDefined();
    expect(stdout).toMatch(/^settlement \S+: completed, released 2500 USD$/m);
    expect(stdout).toMatch(/^artifact art_[0-9a-f]{64}: verified$/m);
    expect(stdout).toMatch(/^receipt [0-9a-f]{64}: verified$/m);

    // What it printed is what the service holds: the run passed and its settlement paid the worker.
    const verify = await fetch(`${baseUrl}/v1/verify/${runId}`).then((r) => r.json());
    expect(verify).toMatchObject({
      verified: true,
      verdict: 'pass',
      settlement: { status: 'completed', amount: 2500, currency: 'USD' },
    });
  },
);
