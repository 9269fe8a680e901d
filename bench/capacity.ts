// Capacity on paper, from measurements here (issue 40, item 4). Two halves, one Redis node:
//
// A. The queue machinery alone, per hot queue (settle, x402-verify, webhook-dispatch, finalize), with the job data
//    this service really enqueues (captured from the jobs the B half's requests made): jobs added per second the way
//    the service adds them (its Producers, 32 calls in flight), with addBulk (batches of 100, the ceiling), and
//    processed per second by the service's own worker runner (src/workers/runner.ts) with a no-op processor, at
//    WORKER_CONCURRENCY 8 (the default) and 32. Redis CPU per job from `INFO cpu` deltas, so a node's ceiling is
//    1 s of Redis CPU over the CPU a job costs it, whatever this 2-core machine let the clients reach.
// B. One worker process (`node --import tsx src/main.ts worker <queue>`, NODE_ENV=production, production node
//    flags) per queue running the real processor over work prepared beforehand through the real API (in process,
//    app.inject): finalize of runs with one signed event, settle of those runs, x402-verify of gates that were
//    created, quoted, authorized and reported, webhook-dispatch of outbox events to one endpoint on a 127.0.0.1
//    receiver (a fan-out job and a deliver job each). The queue is paused while the work is prepared and resumed once
//    the worker is up: jobs/s from resume to the last completion, CPU per job of the worker, Redis and FerretDB.
//
// Prints JSON and writes bench/results/capacity.json. Stops by itself within about 3 minutes.
//
//   node --import tsx bench/capacity.ts [--own-backend]     (npm run bench:capacity)
//
// Against the shared Redis and FerretDB (scripts/services.sh) on a fresh key prefix and database, or --own-backend
// a pair of its own (then their CPU is this bench's alone). docs/capacity.md turns the figures into a table.
import { randomBytes, randomUUID, createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { Queue, QueueEvents } from 'bullmq';
import { Redis } from 'ioredis';
import type { FastifyInstance } from 'fastify';
import { loadConfig, type Config } from '../src/config.ts';
import { generateEd25519KeyPair, newId } from '../src/domain/crypto.ts';
import { signEvents } from '../src/domain/event-chain.ts';
import { buildApp } from '../src/http/app.ts';
import { createLogger } from '../src/logger.ts';
import { DependencyOutages } from '../src/outages.ts';
import { bullPrefix, jobIdFor, Producers, type QueueName } from '../src/queues/index.ts';
import { connectRuntime, createApiRedis, createRuntime, type Runtime } from '../src/runtime.ts';
import { emitEvent } from '../src/services/events.ts';
import { settlementIdFor } from '../src/store/settlements.ts';
import { startWorkers } from '../src/workers/runner.ts';
import { sharedBackend, startOwnBackend, stopOwnBackend, type Backend } from './backend.ts';
import {
  cpuTicks,
  CLOCK_TICKS_PER_SECOND,
  machineBusyPercent,
  machineJiffies,
  startChild,
  stopChild,
  type Child,
} from './growth/processes.ts';
import { benchService, dropBenchData, PRODUCTION_NODE_FLAGS, ROOT } from './production-service.ts';

const OWN_BACKEND = process.argv.includes('--own-backend');
const BUDGET_MS = 180_000;
const HOT_QUEUES = ['settle', 'x402-verify', 'webhook-dispatch', 'finalize'] as const;
type HotQueue = (typeof HOT_QUEUES)[number];
/** Part A: jobs per add phase and per processing phase (each phase also stops after PHASE_MS). */
const A_JOBS = Number(process.env.BENCH_CAPACITY_JOBS ?? 1_500);
const PHASE_MS = 3_000;
const ADD_IN_FLIGHT = 32;
const BULK = 100;
/** Part B: runs (finalized, then settled), gates (verified) and webhook events prepared for the real workers. */
const RUNS = Number(process.env.BENCH_CAPACITY_RUNS ?? 60);
const GATES = Number(process.env.BENCH_CAPACITY_GATES ?? 60);
const EVENTS = Number(process.env.BENCH_CAPACITY_EVENTS ?? 100);

const started = Date.now();
const log = (line: string) => console.error(`[capacity +${((Date.now() - started) / 1000).toFixed(1)}s] ${line}`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const round = (n: number, digits = 1) => Number(n.toFixed(digits));

// ---------------------------------------------------------------------------------------------------------------
// Setup: backend, the service's configuration (shared by this process and the worker children), the app in process.

// The hard stop; before it, a part-B phase that no longer fits in the budget is skipped and said so in the result.
const watchdog = setTimeout(() => {
  log(`over its ${BUDGET_MS / 1000}-s budget: stopping`);
  void cleanup().finally(() => process.exit(1));
}, BUDGET_MS);
watchdog.unref();
const timeLeft = () => BUDGET_MS - (Date.now() - started);

const backend: Backend = OWN_BACKEND ? await startOwnBackend(log) : sharedBackend();
const service = benchService('capacity', {
  REDIS_URL: backend.redisUrl,
  WEBHOOK_ALLOW_INSECURE_URLS: 'true',
  WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
  // As the tests do on this shared 2-core machine: a command that waited 400 ms behind a neighbour is not an outage.
  REQUEST_DEADLINE_MS: '5000',
  REDIS_COMMAND_TIMEOUT_MS: '2000',
});
service.env.MONGO_URL = `${backend.mongoBase}/${service.dbName}`;
const config = loadConfig({ ...service.env, LOG_LEVEL: 'warn' });
const runtime: Runtime = createRuntime(config, createLogger(config, 'bench'));
await connectRuntime(runtime);
const app: FastifyInstance = await buildApp(runtime, { logger: false, bullBoard: false });
await app.ready();
const info = new Redis(backend.redisUrl, { maxRetriesPerRequest: 1 });
const children = new Set<Child>();
let receiver: http.Server | null = null;

async function cleanup(): Promise<void> {
  for (const child of children) await stopChild(child, 5_000).catch(() => undefined);
  receiver?.closeAllConnections();
  receiver?.close();
  await app.close().catch(() => undefined);
  if (!OWN_BACKEND) await dropBenchData(service, runtime.mongo, log);
  await runtime.close().catch(() => undefined);
  info.disconnect();
  if (OWN_BACKEND) await stopOwnBackend();
}
for (const signal of ['SIGINT', 'SIGTERM'] as const)
  process.once(signal, () => void cleanup().finally(() => process.exit(130)));

async function redisCpuSeconds(): Promise<number> {
  const text = await info.info('cpu');
  const field = (name: string) => Number(new RegExp(`^${name}:([0-9.]+)`, 'm').exec(text)?.[1] ?? 0);
  return field('used_cpu_user') + field('used_cpu_sys');
}
async function redisUsedMemory(): Promise<number> {
  return Number(/^used_memory:(\d+)/m.exec(await info.info('memory'))?.[1] ?? 0);
}
/** Connection options (not a client) for a BullMQ object of the bench's own, so that closing it closes them. */
function bullConnection(url: string) {
  const { hostname, port } = new URL(url);
  return { host: hostname, port: Number(port || 6379), maxRetriesPerRequest: null };
}
const ferretTicks = () => (backend.ferretdbPid ? cpuTicks(backend.ferretdbPid) : 0);

/** CPU of this process, Redis, FerretDB and the machine around `work`; per job in µs. */
async function measured<T>(jobs: () => number, work: () => Promise<T>) {
  const [redis0, ferret0, self0, machine0, t0] = [
    await redisCpuSeconds(),
    ferretTicks(),
    process.cpuUsage(),
    machineJiffies(),
    performance.now(),
  ];
  const result = await work();
  const seconds = (performance.now() - t0) / 1000;
  const [redis1, ferret1, self1, machine1] = [
    await redisCpuSeconds(),
    ferretTicks(),
    process.cpuUsage(self0),
    machineJiffies(),
  ];
  const n = Math.max(1, jobs());
  return {
    result,
    jobs: jobs(),
    seconds: round(seconds, 2),
    jobsPerSecond: round(jobs() / seconds),
    redisCpuUsPerJob: round(((redis1 - redis0) * 1e6) / n),
    ferretdbCpuUsPerJob: round(((ferret1 - ferret0) / CLOCK_TICKS_PER_SECOND) * (1e6 / n)),
    clientCpuUsPerJob: round((self1.user + self1.system) / n),
    machineBusyPercent: machineBusyPercent(machine0, machine1),
  };
}

const jsonHeaders = (token: string) => ({ authorization: `Bearer ${token}`, 'idempotency-key': randomUUID() });
async function call<T = Record<string, unknown>>(
  method: 'GET' | 'POST',
  url: string,
  token: string,
  payload?: unknown,
  ok: number[] = [200, 201, 202],
): Promise<T> {
  const headers = jsonHeaders(token);
  let res = await app.inject({ method, url, headers, ...(payload ? { payload } : {}) });
  // A 503, or the same key still in progress, asks for a retry with the same key, as the service's client does.
  const retryable = () =>
    res.statusCode === 503 || (res.statusCode === 409 && res.body.includes('IDEMPOTENCY_IN_PROGRESS'));
  for (let retry = 0; retryable() && retry < 10; retry++) {
    await sleep(500);
    res = await app.inject({ method, url, headers, ...(payload ? { payload } : {}) });
  }
  if (!ok.includes(res.statusCode)) throw new Error(`${method} ${url} -> ${res.statusCode} ${res.body.slice(0, 300)}`);
  return res.json() as T;
}
/** `count` tasks, `inFlight` at a time. */
async function pool(count: number, inFlight: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(inFlight, count) }, async () => {
      for (let i = next++; i < count; i = next++) await task(i);
    }),
  );
}

const output: Record<string, unknown> = {
  benchmark: 'capacity',
  at: new Date().toISOString(),
  node: process.version,
  machine: { cpus: cpus().length, loadAverageAtStart: loadavg().map((l) => round(l, 2)) },
  backend: OWN_BACKEND
    ? "a Redis 7 and a FerretDB (SQLite) of the bench's own"
    : 'the shared Redis 7 and FerretDB of scripts/services.sh (their CPU includes whatever else ran on them)',
};

try {
  // -------------------------------------------------------------------------------------------------------------
  // B, preparation: real work for each hot queue, made through the API while the queues are paused.
  for (const q of HOT_QUEUES) await runtime.producers.queues[q].pause();
  const admin = service.adminKey;
  const tenant = await call<{ tenantId: string }>('POST', '/ops/tenants', admin, { name: 'capacity' });
  const { token } = await call<{ token: string }>('POST', '/ops/api-keys', admin, {
    tenantId: tenant.tenantId,
    scopes: ['agents:write', 'runs:write', 'x402:write', 'webhooks:write'],
  });
  const agent = async (name: string) => {
    const pair = generateEd25519KeyPair();
    const made = await call<{ agentId: string; keyId: string }>('POST', '/v1/agents', token, {
      name,
      publicKey: Buffer.from(pair.raw).toString('base64url'),
    });
    return { ...made, privateKey: pair.privateKey };
  };
  // Eight payers and eight payees: the hot-wallet case (one payer) is bench/x402-hot-wallet.ts's subject, not this.
  const payers = await Promise.all(Array.from({ length: 8 }, (_, i) => agent(`payer${i}`)));
  const payees = await Promise.all(Array.from({ length: 8 }, (_, i) => agent(`payee${i}`)));
  for (const p of payers)
    await call('POST', `/ops/wallets/${encodeURIComponent(p.agentId)}/credit`, admin, {
      amount: 10_000_000,
      currency: 'USD',
    });

  log(`preparing ${RUNS} runs (one signed event each, finalize requested)`);
  const runIds: string[] = [];
  await pool(RUNS, 8, async (i) => {
    const payee = payees[i % payees.length]!;
    const { runId } = await call<{ runId: string }>('POST', '/v1/runs', token, {
      agentId: payee.agentId,
      terms: { accuracy: { min: 0.9 } },
      settlement: { payerAgentId: payers[i % payers.length]!.agentId, amount: 100, currency: 'USD' },
    });
    const [event] = signEvents(
      [
        {
          id: newId('evt'),
          runId,
          type: 'metric',
          at: new Date().toISOString(),
          payload: { name: 'accuracy', value: 1 },
        },
      ],
      { seq: 0, chainHash: null },
      payee.privateKey,
      payee.keyId,
    );
    await call('POST', `/v1/runs/${runId}/events`, token, { event });
    await call('POST', `/v1/runs/${runId}/finalize`, token);
    runIds.push(runId);
  });

  log(`preparing ${GATES} gates (create, quote, authorize-payment, verify: each verify waits 2 s for its paused job)`);
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  await pool(GATES, 25, async (i) => {
    const seed = `${i}-${randomBytes(4).toString('hex')}`;
    const { gateId } = await call<{ gateId: string }>('POST', '/x402/gate/create', token, {
      payerAgentId: payers[i % payers.length]!.agentId,
      payeeAgentId: payees[i % payees.length]!.agentId,
      amount: 100,
      currency: 'USD',
    });
    const quote = await call<{ quoteId: string; requestSha256: string }>('POST', '/x402/gate/quote', token, {
      gateId,
      requestSha256: sha(seed),
    });
    await call('POST', '/x402/gate/authorize-payment', token, {
      gateId,
      quoteId: quote.quoteId,
      requestSha256: quote.requestSha256,
    });
    await call('POST', '/x402/gate/verify', token, { gateId, evidence: { responseSha256: sha(`response ${seed}`) } });
  });

  log(`preparing ${EVENTS} outbox events for one webhook endpoint on a 127.0.0.1 receiver`);
  let delivered = 0;
  let onDelivered: (() => void) | null = null;
  receiver = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(204).end();
      delivered++;
      onDelivered?.();
    });
  });
  await new Promise<void>((resolve) => receiver!.listen(0, '127.0.0.1', resolve));
  const hookTenant = await call<{ tenantId: string }>('POST', '/ops/tenants', admin, { name: 'capacity-hooks' });
  const hookKey = await call<{ token: string }>('POST', '/ops/api-keys', admin, {
    tenantId: hookTenant.tenantId,
    scopes: ['webhooks:write'],
  });
  await call('POST', '/v1/webhooks', hookKey.token, {
    url: `http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`,
    events: ['settlement.completed'],
  });
  await pool(EVENTS, 8, async (i) => {
    const runId = newId('run');
    await emitEvent(
      runtime,
      hookTenant.tenantId,
      'settlement.completed',
      { runId, settlementId: settlementIdFor(runId), amount: 100, holdback: 0, currency: 'USD' },
      `capacity:${i}:${runId}`,
    );
  });

  // The job data the service really enqueued, one of each kind: the payloads part A adds, its sizes reported.
  const sampleOf = async (q: QueueName, name?: string) => {
    const jobs = await runtime.producers.queues[q].getJobs(['waiting'], 0, 50);
    const job = jobs.find((j) => (name ? j.name === name : j.name !== 'sweep'));
    if (!job) throw new Error(`no ${q} job was enqueued by the preparation`);
    return job;
  };
  const fanOut = await sampleOf('webhook-dispatch');
  const samples: Record<HotQueue, Array<{ name: string; data: Record<string, unknown>; jobId: string }>> = {
    settle: [
      {
        name: 'settle',
        data: { tenantId: tenant.tenantId, runId: runIds[0]!, settlementId: settlementIdFor(runIds[0]!) },
        jobId: jobIdFor('settle', settlementIdFor(runIds[0]!)),
      },
    ],
    'x402-verify': [await sampleOf('x402-verify')].map((j) => ({ name: j.name, data: j.data, jobId: j.id! })),
    // Per event one fan-out job and, per subscribed endpoint, one deliver job: both kinds, alternately.
    'webhook-dispatch': [
      { name: fanOut.name, data: fanOut.data, jobId: fanOut.id! },
      {
        name: 'deliver',
        data: { kind: 'deliver', tenantId: hookTenant.tenantId, deliveryId: `whd_${sha('d').slice(0, 32)}`, rev: 0 },
        jobId: jobIdFor('webhook-dispatch', `whd_${sha('d').slice(0, 32)}`, '0'),
      },
    ],
    finalize: [await sampleOf('finalize')].map((j) => ({ name: j.name, data: j.data, jobId: j.id! })),
  };
  output.jobDataBytes = Object.fromEntries(
    HOT_QUEUES.map((q) => [
      q,
      samples[q].map((s) => ({ name: s.name, bytes: Buffer.byteLength(JSON.stringify(s.data)) })),
    ]),
  );
  log(`prepared in ${((Date.now() - started) / 1000).toFixed(1)} s; job data ${JSON.stringify(output.jobDataBytes)}`);

  // -------------------------------------------------------------------------------------------------------------
  // B: one worker process per queue with the real processor.
  const childEnv = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? '/tmp',
    ...service.env,
  };
  // One worker process for the four queues, started once (its start-up under tsx takes seconds on this machine);
  // each queue is resumed alone while the others stay paused, so the process's CPU in a window is that queue's.
  const child = startChild(
    'worker',
    [...PRODUCTION_NODE_FLAGS, '--import', 'tsx', 'src/main.ts', 'worker', ...HOT_QUEUES],
    childEnv,
    join(service.logDir, 'worker.log'),
    ROOT,
  );
  children.add(child);
  for (let waited = 0; ; waited += 100) {
    const counts = await Promise.all(HOT_QUEUES.map((q) => runtime.producers.queues[q].getWorkersCount()));
    if (counts.every((n) => n > 0)) break;
    if (waited > 40_000 || child.proc.exitCode !== null)
      throw new Error(`the worker did not start; see ${child.logFile}`);
    await sleep(100);
  }
  await sleep(1_000); // its start-up work (indexes, sweeper schedules) out of the window
  log('B: worker process up');

  async function drainWithWorker(
    q: HotQueue,
    expected: number,
    counts: (jobId: string) => boolean,
    doneWhen: () => boolean = () => true,
  ): Promise<Record<string, unknown>> {
    if (timeLeft() < 15_000) return { skipped: `not started: ${Math.round(timeLeft() / 1000)} s of the budget left` };
    const queue = runtime.producers.queues[q];
    const events = new QueueEvents(q, {
      connection: bullConnection(config.redisUrl),
      prefix: bullPrefix(config.redisPrefix),
    });
    await events.waitUntilReady();
    // By job id: a job's completion can be announced more than once (a stalled job's second run).
    const completedIds = new Set<string>();
    const failedIds = new Set<string>();
    let wake: () => void = () => undefined;
    events.on('completed', ({ jobId }) => {
      if (counts(jobId)) completedIds.add(jobId);
      wake();
    });
    events.on('failed', ({ jobId }) => {
      if (counts(jobId)) failedIds.add(jobId);
      wake();
    });
    onDelivered = () => wake();
    const finished = () => completedIds.size + failedIds.size >= expected && doneWhen();
    const worker0 = cpuTicks(child.pid);
    const m = await measured(
      () => completedIds.size,
      async () => {
        await queue.resume();
        const deadline = Date.now() + Math.min(30_000, timeLeft() - 8_000);
        while (!finished() && Date.now() < deadline) {
          await Promise.race([new Promise<void>((r) => (wake = r)), sleep(200)]);
        }
      },
    );
    const workerCpuMs = ((cpuTicks(child.pid) - worker0) / CLOCK_TICKS_PER_SECOND) * 1000;
    await queue.pause();
    await events.close();
    const { result: _, clientCpuUsPerJob: _api, ...figures } = m;
    return {
      ...figures,
      expected,
      finished: finished(),
      failed: failedIds.size,
      workerCpuMsPerJob: round(workerCpuMs / Math.max(1, completedIds.size), 2),
      workerCpuPercentOfOneCore: round((workerCpuMs / 1000 / m.seconds) * 100),
    };
  }

  const realProcessors: Record<string, unknown> = {};
  realProcessors.finalize = await drainWithWorker('finalize', RUNS, (id) => id.startsWith('finalize__'));
  log(`B finalize: ${JSON.stringify(realProcessors.finalize)}`);

  if (timeLeft() > 30_000) {
    await pool(runIds.length, 8, async (i) => void (await call('POST', `/v1/runs/${runIds[i]}/settle`, token, {})));
    realProcessors.settle = await drainWithWorker('settle', runIds.length, (id) => id.startsWith('settle__'));
  } else realProcessors.settle = { skipped: `not prepared: ${Math.round(timeLeft() / 1000)} s of the budget left` };
  log(`B settle: ${JSON.stringify(realProcessors.settle)}`);

  realProcessors['x402-verify'] = await drainWithWorker('x402-verify', GATES, (id) => id.startsWith('x402-verify__'));
  log(`B x402-verify: ${JSON.stringify(realProcessors['x402-verify'])}`);

  // Every event makes two jobs (its fan-out, then its one delivery's attempt); done when each event has arrived.
  const hooks = await drainWithWorker(
    'webhook-dispatch',
    2 * EVENTS,
    (id) => id.startsWith('webhook-dispatch__'),
    () => delivered >= EVENTS,
  );
  realProcessors['webhook-dispatch'] = { ...hooks, webhooksReceived: delivered };
  await stopChild(child, 10_000);
  children.delete(child);
  log(`B webhook-dispatch: ${JSON.stringify(realProcessors['webhook-dispatch'])}`);
  output.realProcessors = realProcessors;
  // -------------------------------------------------------------------------------------------------------------
  // A: one queue on one Redis node, the machinery alone. Each phase on a key prefix of its own.
  let phase = 0;
  const outages = new DependencyOutages(runtime.logger);
  const phaseConfig = (concurrency = 8): Config =>
    loadConfig({
      ...service.env,
      LOG_LEVEL: 'silent',
      REDIS_PREFIX: `${service.redisPrefix}a${++phase}`,
      WORKER_CONCURRENCY: String(concurrency),
    });
  const jobAt = (q: HotQueue, i: number) => {
    const s = samples[q][i % samples[q].length]!;
    return { name: s.name, data: s.data, jobId: `${s.jobId}__${phase}_${i}` };
  };
  const queueMachinery: Record<string, unknown> = {};
  for (const q of HOT_QUEUES) {
    if (timeLeft() < 20_000) {
      queueMachinery[q] = { skipped: `not started: ${Math.round(timeLeft() / 1000)} s of the budget left` };
      continue;
    }
    const result: Record<string, unknown> = {};
    {
      // The service's own add: Producers.enqueue (payload checked against its schema, the default job options, a
      // derived job id, the 1-s deadline), ADD_IN_FLIGHT calls at once as a busy API makes them.
      const cfg = phaseConfig();
      const redis = createApiRedis(cfg, outages);
      const producers = new Producers(redis, cfg.redisPrefix);
      let added = 0;
      const deadline = Date.now() + PHASE_MS;
      const m = await measured(
        () => added,
        () =>
          pool(A_JOBS, ADD_IN_FLIGHT, async (i) => {
            if (Date.now() > deadline) return;
            const job = jobAt(q, i);
            await producers.enqueue(q, job.data as never, job.jobId, { name: job.name });
            added++;
          }),
      );
      const { result: _, ...figures } = m;
      result.add = { inFlight: ADD_IN_FLIGHT, ...figures };
      await producers.close();
      redis.disconnect();
    }
    {
      // addBulk in batches of BULK, with the same options; the machinery's ceiling for adding. Then the Redis memory a
      // waiting job holds, and (below) the no-op processing of exactly these jobs.
      for (const concurrency of [8, 32]) {
        const cfg = phaseConfig(concurrency);
        const queue = new Queue(q, {
          connection: bullConnection(cfg.redisUrl),
          prefix: bullPrefix(cfg.redisPrefix),
          defaultJobOptions: runtime.producers.queues[q].defaultJobOptions,
        });
        await queue.pause();
        const memory0 = await redisUsedMemory();
        let added = 0;
        const deadline = Date.now() + PHASE_MS;
        const bulk = await measured(
          () => added,
          async () => {
            for (let i = 0; i < A_JOBS && Date.now() < deadline; i += BULK) {
              const batch = Array.from({ length: Math.min(BULK, A_JOBS - i) }, (_, k) => jobAt(q, i + k));
              await queue.addBulk(batch.map((j) => ({ name: j.name, data: j.data, opts: { jobId: j.jobId } })));
              added += batch.length;
            }
          },
        );
        const bytesPerWaitingJob = Math.round(((await redisUsedMemory()) - memory0) / Math.max(1, added));
        if (concurrency === 8) {
          const { result: _, ...figures } = bulk;
          result.addBulk = { batch: BULK, ...figures, redisBytesPerWaitingJob: bytesPerWaitingJob };
        }
        // The service's worker runner (src/workers/runner.ts: payload schema check, concurrency, stalled checks,
        // the watchdog) with a processor that does nothing, so the queue machinery is the limit.
        const events = new QueueEvents(q, {
          connection: bullConnection(cfg.redisUrl),
          prefix: bullPrefix(cfg.redisPrefix),
        });
        await events.waitUntilReady();
        let done = 0;
        let failed = 0;
        let allDone: () => void = () => undefined;
        const finished = new Promise<void>((resolve) => (allDone = resolve));
        events.on('completed', () => ++done >= added && allDone());
        events.on('failed', () => {
          failed++;
          if (++done >= added) allDone();
        });
        const workers = startWorkers(cfg, createLogger(cfg, 'bench'), { [q]: { process: async () => undefined } }, [q]);
        await sleep(500);
        const processed = await measured(
          () => done,
          async () => {
            await queue.resume();
            await Promise.race([finished, sleep(PHASE_MS * 2)]);
          },
        );
        const { result: _r, ...figures } = processed;
        result[`processNoop_concurrency${concurrency}`] = { ...figures, failed };
        await workers.close();
        await events.close();
        await queue.obliterate({ force: true }).catch(() => undefined);
        await queue.close();
      }
    }
    queueMachinery[q] = result;
    log(`A ${q}: ${JSON.stringify(result)}`);
  }
  output.queueMachinery = queueMachinery;

  output.setup = {
    partA: `per queue: Producers.enqueue ${ADD_IN_FLIGHT} in flight, then addBulk ${BULK} a batch (up to ${A_JOBS} jobs or ${PHASE_MS / 1000} s each), then those jobs processed by src/workers/runner.ts with a no-op processor in this process; job data as captured from the jobs part B's requests enqueued; each phase on a fresh prefix`,
    partB: `one worker process per queue (node ${PRODUCTION_NODE_FLAGS.join(' ')} --import tsx src/main.ts worker <queue>, NODE_ENV=production, WORKER_CONCURRENCY 8) over ${RUNS} runs (finalize, then settle; 100 USD, no holdback, 8 payers), ${GATES} gates (x402-verify; 100 USD, no holdback) and ${EVENTS} events (webhook-dispatch: fan-out + deliver to a 127.0.0.1 receiver), each queue paused while its work was prepared through the API in this process`,
    cpu: 'Redis from INFO cpu (used_cpu_user + used_cpu_sys) deltas, FerretDB and the worker from /proc/<pid>/stat, this process from process.cpuUsage()',
  };
  output.machine = { ...(output.machine as object), loadAverageAtEnd: loadavg().map((l) => round(l, 2)) };
  output.seconds = round((Date.now() - started) / 1000);
  mkdirSync(join(ROOT, 'bench/results'), { recursive: true });
  writeFileSync(
    join(ROOT, `bench/results/capacity${OWN_BACKEND ? '-own-backend' : ''}.json`),
    `${JSON.stringify(output, null, 2)}\n`,
  );
  console.log(JSON.stringify(output, null, 2));
} finally {
  clearTimeout(watchdog);
  await cleanup();
}
// Open handles (a QueueEvents reconnecting, the receiver's sockets) must not keep the bench alive past its result.
process.exit(0);
