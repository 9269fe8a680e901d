// Diagnostic: CPU and MongoDB commands per x402 gate flow (create, quote, authorize-payment, verify; then GET the
// gate while verify answered 202), API and the x402-verify and settle workers in this one process. Prints per flow:
// this process's CPU, FerretDB's and Redis's (from /proc/<pid>/stat: give FERRETDB_PID and REDIS_PID, best of a
// FerretDB and Redis of one's own via MONGO_URL and REDIS_URL, as the shared ones serve other work too) and the
// MongoDB commands by kind and collection. Run under `node --cpu-prof` to see where this process's CPU goes.
// With --metered each verify charges 370 of the 1,000 authorized (the rest goes back to the payer in the same entry).
//   MONGO_URL=... REDIS_URL=... FERRETDB_PID=... REDIS_PID=... \
//     node --import tsx bench/x402-gate-cpu.ts [flows] [clients] [--metered]
import { createHash, randomUUID } from 'node:crypto';
import type { CommandStartedEvent } from 'mongodb';
import { generateEd25519KeyPair } from '../src/domain/crypto.ts';
import { buildApp } from '../src/http/app.ts';
import { createLogger } from '../src/logger.ts';
import { connectRuntime, createRuntime } from '../src/runtime.ts';
import { createProcessors } from '../src/workers/index.ts';
import { startWorkers } from '../src/workers/runner.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks } from './growth/processes.ts';
import { inProcessConfig } from './in-process.ts';

const FLOWS = Number(process.argv[2] ?? 200);
const CLIENTS = Number(process.argv[3] ?? 4);
const METERED = process.argv.includes('--metered');
process.env.MONGO_COMMAND_MONITORING = process.env.COUNT_COMMANDS === 'false' ? 'false' : 'true';
// The API and the workers each with a runtime of their own (their own caches and connections), as in production.
const { config, adminKey } = inProcessConfig();
const api = createRuntime(config, createLogger(config, 'bench-api'));
const worker = createRuntime(config, createLogger(config, 'bench-worker'));
await connectRuntime(api);
await connectRuntime(worker);
const app = await buildApp(api, { logger: false, bullBoard: false });
await app.listen({ host: '127.0.0.1', port: 0 });
const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
const workers = startWorkers(config, worker.logger, createProcessors(worker), ['x402-verify', 'settle']);

let counting = false;
const kinds = new Map<string, number>();
for (const [side, runtime] of [
  ['api', api],
  ['worker', worker],
] as const) {
  runtime.mongo.on('commandStarted', (e: CommandStartedEvent) => {
    if (!counting || e.commandName === 'hello' || e.commandName === 'isMaster' || e.commandName === 'ping') return;
    const label = `${side} ${e.commandName} ${String(e.command[e.commandName])}`;
    kinds.set(label, (kinds.get(label) ?? 0) + 1);
  });
}

async function call(method: string, path: string, token: string, body?: unknown, expect = [200, 201]) {
  const res = await fetch(base + path, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body ? { 'content-type': 'application/json', 'idempotency-key': randomUUID() } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (!expect.includes(res.status)) throw new Error(`${method} ${path} -> ${res.status} ${text.slice(0, 300)}`);
  return JSON.parse(text);
}

const sha = (s: string) => createHash('sha256').update(s).digest('hex');
let seq = 0;
async function flow(token: string, payer: string, payee: string): Promise<void> {
  const n = seq++;
  const gate = await call('POST', '/x402/gate/create', token, {
    payerAgentId: payer,
    payeeAgentId: payee,
    amount: 1_000,
    currency: 'USD',
    holdbackBps: 1_000,
    disputeWindowSeconds: 3_600,
  });
  const q = await call('POST', '/x402/gate/quote', token, { gateId: gate.gateId, requestSha256: sha(`req ${n}`) });
  await call('POST', '/x402/gate/authorize-payment', token, {
    gateId: gate.gateId,
    quoteId: q.quoteId,
    requestSha256: q.requestSha256,
  });
  const v = await call(
    'POST',
    '/x402/gate/verify',
    token,
    { gateId: gate.gateId, evidence: { responseSha256: sha(`res ${n}`) }, ...(METERED ? { amount: 370 } : {}) },
    [200, 202],
  );
  for (let polls = 0; v.decision === null && polls < 2_000; polls++) {
    if ((await call('GET', `/x402/gate/${gate.gateId}`, token)).decision !== null) break;
    await new Promise((r) => setTimeout(r, 25));
  }
}

const others = { ferretdb: Number(process.env.FERRETDB_PID ?? 0), redis: Number(process.env.REDIS_PID ?? 0) };
try {
  const tenant = await call('POST', '/ops/tenants', adminKey, { name: 'cpu' });
  const token = (
    await call('POST', '/ops/api-keys', adminKey, {
      tenantId: tenant.tenantId,
      scopes: ['agents:write', 'x402:write', 'x402:read', 'wallets:write'],
    })
  ).token;
  const agent = async (name: string) =>
    (
      await call('POST', '/v1/agents', token, {
        name,
        publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url'),
      })
    ).agentId as string;
  const pairs = await Promise.all(
    Array.from({ length: CLIENTS }, async (_, i) => {
      const payer = await agent(`payer${i}`);
      await call('POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, adminKey, {
        amount: 1_000_000_000,
        currency: 'USD',
      });
      return { payer, payee: await agent(`payee${i}`) };
    }),
  );
  const run = async (flows: number) => {
    let next = 0;
    await Promise.all(
      pairs.map(async ({ payer, payee }) => {
        while (next++ < flows) await flow(token, payer, payee);
      }),
    );
  };
  await run(CLIENTS * 3); // warm-up, uncounted
  await new Promise((r) => setTimeout(r, 500));
  counting = true;
  const self0 = process.cpuUsage();
  const ticks0 = Object.fromEntries(
    Object.entries(others)
      .filter(([, pid]) => pid > 0)
      .map(([k, pid]) => [k, cpuTicks(pid)]),
  );
  const t0 = performance.now();
  await run(FLOWS);
  const wall = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 300)); // trailing writes of the last flows
  counting = false;
  const self = process.cpuUsage(self0);
  const perFlow = (ms: number) => Number((ms / FLOWS).toFixed(2));
  const cpu: Record<string, number> = { thisProcess: perFlow((self.user + self.system) / 1000) };
  for (const [k, before] of Object.entries(ticks0))
    cpu[k] = perFlow(((cpuTicks(others[k as keyof typeof others]) - before) / CLOCK_TICKS_PER_SECOND) * 1000);
  cpu.total = Number(
    Object.values(cpu)
      .reduce((a, b) => a + b, 0)
      .toFixed(2),
  );
  const commands = [...kinds].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${(n / FLOWS).toFixed(2)}`);
  const total = [...kinds.values()].reduce((a, b) => a + b, 0) / FLOWS;
  console.log(
    JSON.stringify(
      {
        flows: FLOWS,
        clients: CLIENTS,
        metered: METERED,
        flowsPerSecond: Number((FLOWS / (wall / 1000)).toFixed(1)),
        cpuMsPerFlow: cpu,
        mongoCommandsPerFlow: Number(total.toFixed(2)),
        commands,
      },
      null,
      2,
    ),
  );
} finally {
  await workers.close();
  await app.close();
  await api.db.dropDatabase().catch(() => undefined);
  await worker.close();
  await api.close();
}
