// The standards' own test tools, run as a new user would run them: installed pinned from their registries by
// scripts/install-peer-tools.sh, each against a service process this suite starts (src/main.ts, as in production,
// on loopback, with its own database and Redis prefix). A tool's non-zero exit, or a failed check, fails the test.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { inject } from 'vitest';
import { generateEd25519KeyPair } from '../../src/domain/crypto.ts';
import type { Scope } from '../../src/domain/scopes.ts';
import { must, ServiceProcess, serviceEnv } from '../faults/service.ts';

export const root = fileURLToPath(new URL('../..', import.meta.url));
export const venvBin = `${root}.tools/venv/bin`;
export const mcpConformance = `${root}.tools/mcp-conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js`;
/** Where the last run's reports are kept for a person to read (ignored by git; emptied first, so runs do not pile up). */
export const reportsDir = (name: string) => {
  const dir = `${root}.data/${name}`;
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  return dir;
};

/** Installs the pinned tools once per checkout (a no-op when they are there). */
export function installPeerTools(): void {
  execFileSync('bash', [`${root}scripts/install-peer-tools.sh`], { stdio: 'inherit', timeout: 300_000 });
}

export interface Outcome {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function run(
  command: string,
  args: string[],
  options: { cwd?: string; timeoutMs?: number } = {},
): Promise<Outcome> {
  return new Promise((resolve) => {
    const child = spawn(command, args, {
      cwd: options.cwd ?? root,
      env: process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 120_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

export interface PeerService {
  api: ServiceProcess;
  tenantId: string;
  token: string;
  auth: Record<string, string>;
  agent(name: string): Promise<string>;
}

/** The API process with a tenant and a key of `scopes`, on a database and Redis prefix of its own. */
export async function startService(mode: 'api' | 'all', scopes: Scope[]): Promise<PeerService> {
  const mongoUrl = new URL(inject('mongoUrl'));
  mongoUrl.pathname = `/peers_${randomBytes(4).toString('hex')}`;
  const vars = serviceEnv(mongoUrl.toString(), inject('redisUrl'));
  const api = await ServiceProcess.start(mode, vars);
  const admin = { authorization: `Bearer ${vars.SERVICE_ADMIN_KEY}` };
  const { tenantId } = await must(api.url, 'POST', '/ops/tenants', 201, { headers: admin, body: { name: 'peers' } });
  const { token } = await must(api.url, 'POST', '/ops/api-keys', 201, { headers: admin, body: { tenantId, scopes } });
  const auth = { authorization: `Bearer ${token}` };
  return {
    api,
    tenantId,
    token,
    auth,
    async agent(name) {
      const publicKey = generateEd25519KeyPair().publicKey.export({ type: 'spki', format: 'pem' }).toString();
      return (
        await must(api.url, 'POST', '/v1/agents', 201, { headers: auth, body: { namespace: 'peers', name, publicKey } })
      ).agentId as string;
    },
  };
}
