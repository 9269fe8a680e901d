// Diagnostic: what each step of the x402 gate flow costs on its own, per process. The service runs as production runs
// it (bench/production-service.ts: `node dist/main.js api` and `worker`); `--clients` clients send `--requests` of one
// step (every POST with an Idempotency-Key of its own, as a careful client does), then the next step on the gates the
// one before made: create, quote, authorize-payment, verify, GET the gate. Two reference steps come first: `GET
// /healthz` (the framework and its hooks) and an authenticated `GET /v1/agents/{id}` (one MongoDB read). CPU per
// request is read from /proc/<pid>/stat of the API, the worker, FerretDB and Redis around each step, once all four are
// idle; the first round warms up and is not counted, the figures are the mean of the other rounds. Prints JSON (also
// bench/results/x402-steps[-own-backend].json).
//
//   node --import tsx bench/x402-steps.ts [--requests 300] [--clients 4] [--rounds 3] [--own-backend]
//
// --own-backend starts a FerretDB and a Redis of the bench's own (bench/backend.ts), so their CPU is this bench's
// alone. Loopback only; stops by itself.
import { createHash, randomUUID } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { MongoClient } from 'mongodb';
import { sharedBackend, startOwnBackend, stopOwnBackend } from './backend.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks, stopChild, type Child } from './growth/processes.ts';
import {
  benchService,
  buildService,
  cleanUpOnSignals,
  cpuProfileFlags,
  dropBenchData,
  MONGO_BASE,
  ROOT,
  startServiceProcesses,
  type BenchService,
} from './production-service.ts';
import { call, positiveArg, quiesce, registerAgent, writeResults, type Caller } from './side-by-side.ts';

const REQUESTS = positiveArg('--requests', 300, { integer: true });
const CLIENTS = positiveArg('--clients', 4, { integer: true });
const ROUNDS = positiveArg('--rounds', 3, { integer: true });
if (ROUNDS < 2) throw new Error('--rounds must be at least 2 (the first warms up)');
const OWN_BACKEND = process.argv.includes('--own-backend');
const STEPS = ['healthz', 'agent GET', 'create', 'quote', 'authorize-payment', 'verify', 'gate GET'] as const;
type Step = (typeof STEPS)[number];
const PROCESSES = ['api', 'worker', 'ferretdb', 'redis'] as const;
type Cpu = Record<(typeof PROCESSES)[number] | 'total', number>;

const log = (line: string) => process.stderr.write(`[bench steps ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const round = (x: number, digits = 2) => Number(x.toFixed(digits));

const children: Child[] = [];
let service: BenchService | null = null;

async function cleanup(): Promise<void> {
  for (const child of children.splice(0)) await stopChild(child).catch(() => undefined);
  if (OWN_BACKEND) await stopOwnBackend();
  else if (service) {
    const mongo = new MongoClient(MONGO_BASE, { serverSelectionTimeoutMS: 5_000 });
    await dropBenchData(service, mongo, log);
    await mongo.close().catch(() => undefined);
  }
}

async function main(): Promise<void> {
  cleanUpOnSignals(cleanup, log);
  log(
    `load average ${loadavg()
      .map((x) => round(x))
      .join(' ')}; ${cpus().length} CPUs; ${CLIENTS} clients, ${REQUESTS} requests per step, ${ROUNDS} rounds`,
  );
  buildService();
  const backend = OWN_BACKEND ? await startOwnBackend(log) : sharedBackend();
  if (!backend.ferretdbPid || !backend.redisPid)
    throw new Error('FerretDB or Redis not found: start them with scripts/services.sh up, or pass --own-backend');
  service = benchService('steps');
  service.env.MONGO_URL = `${backend.mongoBase}/${service.dbName}`;
  service.env.REDIS_URL = backend.redisUrl;
  const { api, worker, http } = await startServiceProcesses(service, 'steps', cpuProfileFlags('steps'));
  children.push(api, worker);
  const pids = { api: api.pid, worker: worker.pid, ferretdb: backend.ferretdbPid, redis: backend.redisPid };

  const admin: Caller = { http, token: service.adminKey };
  const tenant = await call(admin, 'POST', '/ops/tenants', { name: 'bench' });
  const token = (
    await call(admin, 'POST', '/ops/api-keys', {
      tenantId: tenant.tenantId,
      scopes: ['agents:write', 'agents:read', 'runs:read', 'x402:write', 'x402:read'],
    })
  ).token as string;
  const caller: Caller = { http, token };
  const pairs = await Promise.all(
    Array.from({ length: CLIENTS }, async (_, i) => {
      const payer = (await registerAgent(caller, `payer${i}`)).agentId;
      await call(admin, 'POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, {
        amount: 1_000_000_000,
        currency: 'USD',
      });
      return { payer, payee: (await registerAgent(caller, `payee${i}`)).agentId };
    }),
  );
  const post = (path: string, body: unknown, expect = [200, 201]) =>
    call(caller, 'POST', path, body, expect, { 'idempotency-key': randomUUID() });

  // What each step does to request i (client c): the gates and quotes of this round, made by the steps before.
  let gates: string[] = [];
  let quotes: Array<{ quoteId: string; requestSha256: string }> = [];
  let undecided = 0;
  const work: Record<Step, (i: number, c: number) => Promise<unknown>> = {
    healthz: () => call(caller, 'GET', '/healthz'),
    'agent GET': (_, c) => call(caller, 'GET', `/v1/agents/${encodeURIComponent(pairs[c]!.payer)}`),
    create: async (i, c) => {
      gates[i] = (
        await post('/x402/gate/create', {
          payerAgentId: pairs[c]!.payer,
          payeeAgentId: pairs[c]!.payee,
          amount: 1_000,
          currency: 'USD',
          holdbackBps: 1_000,
          disputeWindowSeconds: 3_600,
        })
      ).gateId;
    },
    quote: async (i) => {
      quotes[i] = await post('/x402/gate/quote', { gateId: gates[i], requestSha256: sha(`request ${i}`) });
    },
    'authorize-payment': (i) =>
      post('/x402/gate/authorize-payment', {
        gateId: gates[i],
        quoteId: quotes[i]!.quoteId,
        requestSha256: quotes[i]!.requestSha256,
      }),
    verify: async (i) => {
      const answer = await post(
        '/x402/gate/verify',
        { gateId: gates[i], evidence: { responseSha256: sha(`response ${i}`) } },
        [200, 202],
      );
      if (answer.decision === null) undecided++;
    },
    'gate GET': (i) => call(caller, 'GET', `/x402/gate/${gates[i]}`),
  };

  const rounds: Array<Record<Step, Cpu & { requestsPerSecond: number }>> = [];
  for (let r = 0; r < ROUNDS; r++) {
    gates = [];
    quotes = [];
    const figures = {} as Record<Step, Cpu & { requestsPerSecond: number }>;
    for (const step of STEPS) {
      await quiesce(Object.values(pids));
      const before = Object.fromEntries(PROCESSES.map((p) => [p, cpuTicks(pids[p])]));
      const started = performance.now();
      let next = 0;
      await Promise.all(
        Array.from({ length: CLIENTS }, async (_, c) => {
          for (let i; (i = next++) < REQUESTS;) await work[step](i, c);
        }),
      );
      const wallMs = performance.now() - started;
      await new Promise((resolve) => setTimeout(resolve, 300)); // the verify job's last writes trail its answer
      const cpu = Object.fromEntries(
        PROCESSES.map((p) => [
          p,
          round((((cpuTicks(pids[p]) - before[p]!) / CLOCK_TICKS_PER_SECOND) * 1000) / REQUESTS, 3),
        ]),
      ) as Cpu;
      cpu.total = round(
        PROCESSES.reduce((sum, p) => sum + cpu[p], 0),
        3,
      );
      figures[step] = { ...cpu, requestsPerSecond: round(REQUESTS / (wallMs / 1000), 1) };
      log(`round ${r + 1}/${ROUNDS} ${step}: ${JSON.stringify(cpu)}`);
    }
    rounds.push(figures);
  }
  const counted = rounds.slice(1);
  const mean = Object.fromEntries(
    STEPS.map((step) => {
      const of = (key: keyof Cpu) => round(counted.reduce((sum, f) => sum + f[step][key], 0) / counted.length, 3);
      return [
        step,
        { api: of('api'), worker: of('worker'), ferretdb: of('ferretdb'), redis: of('redis'), total: of('total') },
      ];
    }),
  ) as Record<Step, Cpu>;
  const flow = (['create', 'quote', 'authorize-payment', 'verify'] as const).reduce(
    (sum, step) => sum + mean[step].total,
    0,
  );
  const out = {
    benchmark: 'x402-steps',
    at: new Date().toISOString(),
    node: process.version,
    setup: {
      service:
        'node dist/main.js api + node dist/main.js worker (NODE_ENV=production, production node flags), compiled by tsc -p tsconfig.build.json',
      backend: OWN_BACKEND
        ? "a FerretDB and a Redis of the bench's own, serving only this service"
        : 'the shared FerretDB and Redis (scripts/services.sh): other work on them counts too',
      clients: CLIENTS,
      requestsPerStep: REQUESTS,
      rounds: `${ROUNDS} (the first warms up and is not counted)`,
      gate: '1,000 USD, holdbackBps 1000; every POST with an Idempotency-Key of its own',
      cpu: 'utime + stime from /proc/<pid>/stat around each step, once every process is idle (under 5% of a core over 0.5 s)',
      machine: { cpus: cpus().length, loadAverageAtEnd: loadavg().map((x) => round(x)) },
    },
    cpuMsPerRequest: mean,
    fourStepFlowCpuMs: round(flow),
    verifiesAnswered202: undecided,
    rounds,
  };
  writeResults(join(ROOT, `bench/results/x402-steps${OWN_BACKEND ? '-own-backend' : ''}.json`), out, log);
}

try {
  await main();
} finally {
  await cleanup();
}
process.exit(0);
