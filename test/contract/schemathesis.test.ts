// Schemathesis (from PyPI, installed by scripts/install-schemathesis.sh) against the service started as in
// production on its own port, database and Redis prefix, over the whole of openapi/openapi.json with every check it
// offers. The run is bounded (examples per operation, a time limit) and seeded, so CI sees the same cases each time;
// ST_SEED and ST_MAX_EXAMPLES explore further. Any failure fails the test with schemathesis' own report.
import { execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { SCOPES } from '../../src/domain/scopes.ts';
import { must, ServiceProcess, serviceEnv } from '../faults/service.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));
const st = `${root}.tools/schemathesis/bin/st`;
const SEED = process.env.ST_SEED ?? '20261123';
const MAX_EXAMPLES = process.env.ST_MAX_EXAMPLES ?? '20';
const RUN_LIMIT_MS = 600_000;

interface Outcome {
  code: number | null;
  output: string;
  ms: number;
}

function schemathesis(base: string, env: Record<string, string>, selection: string[]): Promise<Outcome> {
  const started = Date.now();
  const args = [
    '--config-file',
    `${root}test/contract/schemathesis.toml`,
    '--no-color',
    'run',
    `${root}openapi/openapi.json`,
    '--url',
    base,
    '--checks',
    'all',
    '--max-examples',
    MAX_EXAMPLES,
    '--seed',
    SEED,
    ...selection,
  ];
  return new Promise((resolve) => {
    const child = spawn(st, args, { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d) => (output += d));
    child.stderr.on('data', (d) => (output += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), RUN_LIMIT_MS);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output, ms: Date.now() - started });
    });
  });
}

/** `N generated, N passed` or `N generated, N found …`, as schemathesis ends its summary. */
function summary(output: string): string {
  return output.match(/^\s*(\d+ generated.*)$/m)?.[1] ?? 'no summary';
}

function report(outcome: Outcome): string {
  const failures = outcome.output.match(/=+ FAILURES =+[\s\S]*?(?==+ SUMMARY =+)/)?.[0] ?? outcome.output.slice(-6000);
  return `schemathesis exited ${outcome.code} (${summary(outcome.output)}):\n${failures}`;
}

describe('schemathesis over the whole OpenAPI document', () => {
  let api: ServiceProcess;
  let env: Record<string, string>;

  beforeAll(async () => {
    execFileSync('bash', [`${root}scripts/install-schemathesis.sh`], { stdio: 'inherit', timeout: 300_000 });
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/c_st_${randomBytes(4).toString('hex')}`;
    // Production settings: https-only public webhook URLs, as the document describes them.
    // The admin key's budget is the default one: raised so the operator routes (lists, rulings, bulk decisions) are
    // fuzzed, not answered 429 after the first minute's 1,200 requests.
    const serviceVars = serviceEnv(mongoUrl.toString(), inject('redisUrl'), {
      WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'false',
      WEBHOOK_ALLOW_INSECURE_URLS: 'false',
      RATE_LIMIT_MAX: '10000000',
      // The fuzzer checks shapes, not latency: at the default 800 ms a request on a loaded machine (a CI minute with
      // the faults suite beside it) is answered 503 UNAVAILABLE by design, which schemathesis reports as a failure.
      REQUEST_DEADLINE_MS: '15000',
    });
    api = await ServiceProcess.start('all', serviceVars);
    const admin = { authorization: `Bearer ${serviceVars.SERVICE_ADMIN_KEY}` };
    // A tenant whose budget the fuzzer cannot exhaust (429 would hide the routes behind it), with a key of every scope.
    const { tenantId } = await must(api.url, 'POST', '/ops/tenants', 201, {
      headers: admin,
      body: { name: 'schemathesis', rateLimit: { limit: 10_000_000, windowSeconds: 60 } },
    });
    const { token } = await must(api.url, 'POST', '/ops/api-keys', 201, {
      headers: admin,
      body: { tenantId, scopes: [...SCOPES] },
    });
    // Records for the generated requests to find (schemathesis.toml [parameters]).
    const tenant = { authorization: `Bearer ${token}` };
    const agent = async (name: string) => {
      const publicKey = generateKeyPairSync('ed25519').publicKey.export({ type: 'spki', format: 'pem' }).toString();
      return (
        await must(api.url, 'POST', '/v1/agents', 201, {
          headers: tenant,
          body: { namespace: 'fuzz', name, publicKey },
        })
      ).agentId as string;
    };
    const payer = await agent('payer');
    const payee = await agent('payee');
    await must(api.url, 'POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, 201, {
      headers: admin,
      body: { amount: 1_000_000, currency: 'USD' },
    });
    const { runId } = await must(api.url, 'POST', '/v1/runs', 201, {
      headers: tenant,
      body: { agentId: payee, settlement: { payerAgentId: payer, amount: 100, currency: 'USD' } },
    });
    const { gateId } = await must(api.url, 'POST', '/x402/gate/create', 201, {
      headers: tenant,
      body: { payerAgentId: payer, payeeAgentId: payee, amount: 10, currency: 'USD' },
    });
    const endpoint = await must(api.url, 'POST', '/v1/webhooks', 201, {
      headers: tenant,
      body: { url: 'https://hooks.example.com/in', events: ['run.finalized'] },
    });
    env = {
      ST_TENANT_KEY: token,
      ST_ADMIN_KEY: serviceVars.SERVICE_ADMIN_KEY!,
      ST_TENANT_ID: tenantId,
      ST_AGENT_ID: payee,
      ST_WALLET_ID: payer,
      ST_RUN_ID: runId,
      ST_GATE_ID: gateId,
      ST_ENDPOINT_ID: endpoint.id,
    };
  }, 400_000);

  afterAll(async () => {
    await api?.stop();
  });

  it(
    'finds no failure on any operation but key rotation and revocation',
    async () => {
      // Rotating or revoking keys would sooner or later revoke the key this run authenticates with; they run below.
      const outcome = await schemathesis(api.url, env, ['--exclude-path-regex', '^/ops/api-keys/']);
      console.log(
        `schemathesis, all but /ops/api-keys/*: ${summary(outcome.output)} in ${Math.round(outcome.ms / 1000)} s`,
      );
      expect(outcome.code, report(outcome)).toBe(0);
    },
    RUN_LIMIT_MS + 30_000,
  );

  it(
    'finds no failure on the ops routes, key rotation and revocation included',
    async () => {
      const outcome = await schemathesis(api.url, env, ['--include-path-regex', '^/ops/']);
      console.log(`schemathesis, /ops/*: ${summary(outcome.output)} in ${Math.round(outcome.ms / 1000)} s`);
      expect(outcome.code, report(outcome)).toBe(0);
    },
    RUN_LIMIT_MS + 30_000,
  );
});
