import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { QUEUE_NAMES } from '../../src/queues/index.ts';

// `--help` names every command the program takes: the ones it dispatches are read from its source, so a command
// added without a line of help fails here (`mcp` was missing from the launcher's help).
const root = resolve(import.meta.dirname, '../..');
const BIN = resolve(root, 'bin/agent-settlement.js');
const MAIN = resolve(root, 'src/main.ts');

async function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, args, { cwd: root, timeout: 30_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('--help lists every command', () => {
  it('bin/agent-settlement.js: verify, mcp and help, each with its own --help', async () => {
    const dispatched = [...readFileSync(BIN, 'utf8').matchAll(/command === '([a-z-]+)'/g)].map((m) => m[1]!);
    expect(dispatched.sort()).toEqual(['mcp', 'verify']);
    for (const args of [['--help'], ['-h'], ['help'], []]) {
      const help = await run([BIN, ...args]);
      expect(help.code, args.join(' ')).toBe(0);
      for (const command of [...dispatched, 'help']) expect(help.stdout).toContain(`agent-settlement ${command}`);
    }
    const mcp = await run([BIN, 'mcp', '--help']);
    expect(mcp.code).toBe(0);
    for (const name of ['SERVICE_BASE_URL', 'SERVICE_TENANT_ID', 'SERVICE_API_KEY']) expect(mcp.stdout).toContain(name);
    const verify = await run([BIN, 'verify', '--help']);
    expect(verify.code).toBe(0);
    expect(verify.stdout).toContain('Usage: agent-settlement verify');
  });

  it('bin/agent-settlement.js: an unknown command exits 2 with the list on stderr', async () => {
    const unknown = await run([BIN, 'frobnicate']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown command "frobnicate"');
    expect(unknown.stderr).toContain('agent-settlement mcp');
  });

  it('src/main.ts: every process mode and every queue a worker can take', async () => {
    const modes = [...new Set([...readFileSync(MAIN, 'utf8').matchAll(/mode !== '([a-z-]+)'/g)].map((m) => m[1]!))];
    expect(modes.sort()).toEqual(['all', 'api', 'rebuild-lists', 'worker']);
    const help = await run(['--import', 'tsx', MAIN, '--help']);
    expect(help.code).toBe(0);
    for (const mode of modes) expect(help.stdout).toMatch(new RegExp(`^  ${mode}\\b`, 'm'));
    for (const queue of QUEUE_NAMES) expect(help.stdout).toContain(queue);
    const wrong = await run(['--import', 'tsx', MAIN, 'serve']);
    expect(wrong.code).toBe(2);
  });
});
