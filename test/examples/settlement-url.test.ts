import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerAgent, type TestAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, credit } from '../helpers/money.ts';
import { gateParties, listeningForX402 } from '../x402/helpers.ts';

// Every example reads the service's URL from SETTLEMENT_URL (default http://127.0.0.1:3000) and prints it first, so
// a service on another port is reached, and a wrong one is seen at once (it used to be a 401 from whatever listened
// on 3000). The examples run as a user runs them: their own processes, against a service on a random port.
const root = fileURLToPath(new URL('../..', import.meta.url));
const SERVICE_LINE = /^settlement service: (\S+) \(SETTLEMENT_URL; default http:\/\/127\.0\.0\.1:3000\)$/m;

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Starts a long-running example and resolves once it printed `ready`; its output so far is in `output()`. */
async function startExample(script: string, env: Record<string, string>, ready: RegExp) {
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (chunk) => (out += chunk));
  child.stderr!.on('data', (chunk) => (out += chunk));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${script} not ready in 60 s:\n${out}`)), 60_000);
    const check = () => {
      if (ready.test(out)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout!.on('data', check);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${script} exited with ${code}:\n${out}`));
    });
  });
  return { child, output: () => out };
}

describe('examples honour SETTLEMENT_URL and print it', () => {
  let t: TestApp;
  let base: string;
  let network: string;
  let payerKey: string;
  let providerKey: string;
  let payer: string;
  let payee: string;
  let auth: Record<string, string>;
  const started: ChildProcess[] = [];
  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ base, network, auth, payerKey, providerKey } = await listeningForX402(t));
    ({ payer, payee } = await gateParties(t, auth, 1_000));
  });
  afterAll(async () => {
    for (const child of started) child.kill('SIGTERM');
    await t?.close();
  });

  it('the paid tool and its caller pay through the service SETTLEMENT_URL names', { timeout: 150_000 }, async () => {
    const port = await freePort();
    const tool = await startExample(
      'examples/paid-tool/tool.ts',
      {
        SETTLEMENT_URL: base,
        PROVIDER_API_KEY: providerKey,
        PAYEE_AGENT_ID: payee,
        X402_NETWORK: network,
        PORT: String(port),
      },
      /paid tool on http:\/\//,
    );
    started.push(tool.child);
    expect(SERVICE_LINE.exec(tool.output())?.[1]).toBe(base);

    const { stdout } = await promisify(execFile)(
      process.execPath,
      ['--import', 'tsx', 'examples/paid-tool/caller.ts'],
      {
        cwd: root,
        env: {
          ...process.env,
          SETTLEMENT_URL: base,
          PAYER_API_KEY: payerKey,
          PAYER_AGENT_ID: payer,
          X402_NETWORK: network,
          TOOL_URL: `http://127.0.0.1:${port}/search?q=ports`,
        },
        timeout: 120_000,
      },
    );
    expect(SERVICE_LINE.exec(stdout)?.[1]).toBe(base);
    expect(stdout).toMatch(/^200 /m); // paid and served: the tool's facilitator and the caller's gate are both `base`
    const gates = (
      await t.app.inject({ method: 'GET', url: '/v1/gates', headers: { authorization: `Bearer ${payerKey}` } })
    ).json();
    expect(gates.items).toHaveLength(1);
  });

  it(
    'the metered tool and its caller pay witnessed usage through the service SETTLEMENT_URL names',
    { timeout: 150_000 },
    async () => {
      const payerAgent = await registerAgent(t, auth);
      const payeeAgent = await registerAgent(t, auth);
      await credit(t, payerAgent.agentId, 1_000);
      const pem = (agent: TestAgent) => agent.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      const port = await freePort();
      const tool = await startExample(
        'examples/metered-tool/tool.ts',
        {
          SETTLEMENT_URL: base,
          PROVIDER_API_KEY: providerKey,
          PAYEE_AGENT_ID: payeeAgent.agentId,
          PAYEE_PRIVATE_KEY: pem(payeeAgent),
          X402_NETWORK: network,
          PORT: String(port),
        },
        /metered tool on http:\/\//,
      );
      started.push(tool.child);
      expect(SERVICE_LINE.exec(tool.output())?.[1]).toBe(base);
      const { stdout } = await promisify(execFile)(
        process.execPath,
        ['--import', 'tsx', 'examples/metered-tool/caller.ts'],
        {
          cwd: root,
          env: {
            ...process.env,
            SETTLEMENT_URL: base,
            PAYER_API_KEY: payerKey,
            PAYER_AGENT_ID: payerAgent.agentId,
            PAYER_PRIVATE_KEY: pem(payerAgent),
            X402_NETWORK: network,
            TOOL_URL: `http://127.0.0.1:${port}`,
          },
          timeout: 120_000,
        },
      );
      expect(SERVICE_LINE.exec(stdout)?.[1]).toBe(base);
      expect(stdout.match(/^\/complete\S* 200 /gm)).toHaveLength(2);
      // Both calls' usage was acknowledged and paid: 12 tokens (2) and 2 tokens (the minimum, 1).
      expect(await balances(t, auth, payeeAgent.agentId)).toEqual({ available: 3, escrow: 0 });
    },
  );

  it('the session tool starts against the service SETTLEMENT_URL names', { timeout: 90_000 }, async () => {
    const port = await freePort();
    const tool = await startExample(
      'examples/session-tool/tool.ts',
      {
        SETTLEMENT_URL: base,
        PROVIDER_API_KEY: providerKey,
        PAYEE_AGENT_ID: payee,
        X402_NETWORK: network,
        PORT: String(port),
      },
      /session tool on http:\/\//,
    );
    started.push(tool.child);
    expect(SERVICE_LINE.exec(tool.output())?.[1]).toBe(base);
    // Unpaid, the route answers 402 with requirements for this deployment's network: its facilitator answered.
    const unpaid = await fetch(`http://127.0.0.1:${port}/search?q=x`);
    expect(unpaid.status).toBe(402);
    expect(Buffer.from(unpaid.headers.get('payment-required')!, 'base64').toString()).toContain(network);
  });

  it(
    'the quick start prints the URL it uses (naming the default) and calls that one',
    { timeout: 60_000 },
    async () => {
      const dead = `http://127.0.0.1:${await freePort()}`;
      const run = (env: Record<string, string | undefined>) =>
        promisify(execFile)(process.execPath, ['--import', 'tsx', 'examples/quick-start.ts'], {
          cwd: root,
          env: { ...process.env, SETTLEMENT_ADMIN_KEY: 'not-a-key', ...env },
          timeout: 50_000,
        }).then(
          () => ({ code: 0, stdout: '' }),
          (err: { code: number; stdout: string }) => ({ code: err.code, stdout: err.stdout }),
        );
      const refused = await run({ SETTLEMENT_URL: dead });
      expect(refused.code).not.toBe(0); // nothing listens there: it tried that URL, not another
      expect(SERVICE_LINE.exec(refused.stdout)?.[1]).toBe(dead);
    },
  );
});
