// Growth benchmark (issue 8): one run on this machine measures the service as production runs it (compiled
// JavaScript, an API process and a worker process) over real HTTP on loopback, first on an empty database, then on
// another, seeded directly through the stores with BENCH_SEED_RUNS runs and BENCH_SEED_EVENTS events (100,000 and
// 1,000,000 by default). It reports latency percentiles and throughput at 1 and 16 clients, finalize and public
// verification of a 10,000-event run, webhook delivery after finalize and settle, idle CPU of every process, peak
// RSS under load, and ceilings measured in the same run (a bare Fastify route, raw driver insertOne/findOne).
// Writes bench/results/growth.json (bench/results/growth-quick.json with --quick) and prints it and a table.
//
//   npm run bench               # full: about 10 minutes on 2 cores
//   npm run bench -- --quick    # small sizes and short idle windows, for development
// Env: BENCH_SEED_RUNS, BENCH_SEED_EVENTS, BENCH_IDLE_SECONDS, BENCH_SEED_REAL_SIGNATURES=1,
//      BENCH_CPU_PROF=<dir> (API and worker write .cpuprofile files there), BENCH_KEEP_DATA=1 (skip the cleanup).
// Loopback only; every loop is bounded; children are stopped and the database and Redis keys dropped on exit.
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { MongoClient } from 'mongodb';
import { loadConfig } from '../src/config.ts';
import { generateEd25519KeyPair, newId } from '../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents, type ChainHead, type EventEnvelope } from '../src/domain/event-chain.ts';
import { createLogger } from '../src/logger.ts';
import { connectRuntime, createRuntime } from '../src/runtime.ts';
import { concurrently, HttpClient, summarize, type LatencySummary } from './growth/http-client.ts';
import {
  CLOCK_TICKS_PER_SECOND,
  cpuTicks,
  killAllChildren,
  machineBusyPercent,
  machineJiffies,
  memoryMiB,
  pidOfServer,
  stopChild,
  withPeakRss,
  type Child,
} from './growth/processes.ts';
import { seedDatabase, type SeedReport } from './growth/seed.ts';
import {
  benchService,
  buildService,
  cleanUpOnSignals,
  cpuProfileFlags,
  dropBenchData,
  MONGO_BASE,
  ROOT,
  startBareFastify,
  startServiceProcesses,
} from './production-service.ts';
import { WebhookReceiver } from './growth/webhook-receiver.ts';

const QUICK = process.argv.includes('--quick');
const CONCURRENCY = [1, 16] as const;
type Concurrency = (typeof CONCURRENCY)[number];

function envInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw.replace(/_/g, ''));
  if (!Number.isSafeInteger(value) || value < 0)
    throw new Error(`${name} must be a non-negative integer, got "${raw}"`);
  return value;
}

/** Calls per client for each operation, at 1 and at 16 clients. */
const SIZES = QUICK
  ? {
      create: { 1: 40, 16: 8 },
      appendSingle: { 1: 40, 16: 8 },
      appendBatches: { 1: 6, 16: 3 },
      get: { 1: 100, 16: 20 },
      webhook: { 1: 3, 16: 1 },
      verifyWarm: { 1: 10, 16: 3 },
      bare: { 1: 200, 16: 50 },
      rawInsert: { 1: 50, 16: 10 },
      finalizeSamples: 1,
    }
  : {
      create: { 1: 200, 16: 40 },
      appendSingle: { 1: 200, 16: 40 },
      appendBatches: { 1: 30, 16: 10 },
      get: { 1: 500, 16: 100 },
      webhook: { 1: 30, 16: 6 },
      verifyWarm: { 1: 30, 16: 10 },
      bare: { 1: 1000, 16: 200 },
      rawInsert: { 1: 300, 16: 50 },
      finalizeSamples: 2,
    };
// Quick mode finalizes a smaller run: appending 10,000 events takes a minute on a busy machine.
const FINALIZE_EVENTS = QUICK ? 2_000 : 10_000;
const SEED_RUNS = envInt('BENCH_SEED_RUNS', QUICK ? 5_000 : 100_000);
const SEED_EVENTS = envInt('BENCH_SEED_EVENTS', QUICK ? 50_000 : 1_000_000);
const IDLE_SECONDS = envInt('BENCH_IDLE_SECONDS', QUICK ? 5 : 60);
// Each phase on a database and Redis prefix of its own: the seeded phase's holds the seed and nothing the empty
// phase left (its settlements in their dispute windows, its webhook work the sweepers look at once it is a minute
// old), so the two differ only by the stored data.
const WEBHOOKS_TO_LOOPBACK = { WEBHOOK_ALLOW_INSECURE_URLS: 'true', WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true' };
const SERVICES = {
  empty: benchService('growth', WEBHOOKS_TO_LOOPBACK),
  seeded: benchService('growth', WEBHOOKS_TO_LOOPBACK),
};
type Phase = keyof typeof SERVICES;

const log = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}`);
const round = (x: number, digits = 2) => Number(x.toFixed(digits));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------------------------
// Processes

interface Services {
  api: Child;
  worker: Child;
  http: HttpClient;
}

async function startServices(phase: Phase): Promise<Services> {
  const { api, worker, http } = await startServiceProcesses(SERVICES[phase], phase, cpuProfileFlags(phase));
  return { api, worker, http };
}

// ---------------------------------------------------------------------------------------------------------------
// One phase: every measurement against the database as it stands

interface Client {
  token: string;
  workerAgent: { agentId: string; keyId: string; privateKey: import('node:crypto').KeyObject };
  payerAgentId: string;
}

async function bootstrap(http: HttpClient, receiverPort: number, adminKey: string): Promise<Client> {
  const tenant = (
    await http.expect(201, 'POST', '/ops/tenants', { token: adminKey, body: { name: `bench-${newId('t')}` } })
  ).json;
  const scopes = ['agents:write', 'runs:write', 'runs:read', 'wallets:write', 'webhooks:write'];
  const token = (
    await http.expect(201, 'POST', '/ops/api-keys', { token: adminKey, body: { tenantId: tenant.tenantId, scopes } })
  ).json.token as string;
  const register = async (name: string) => {
    const pair = generateEd25519KeyPair();
    const agent = (
      await http.expect(201, 'POST', '/v1/agents', {
        token,
        body: { name, publicKey: Buffer.from(pair.raw).toString('base64url') },
      })
    ).json;
    return { agentId: agent.agentId as string, keyId: agent.keyId as string, privateKey: pair.privateKey };
  };
  const workerAgent = await register(newId('worker'));
  const payer = await register(newId('payer'));
  await http.expect(201, 'POST', `/ops/wallets/${encodeURIComponent(payer.agentId)}/credit`, {
    token: adminKey,
    body: { amount: 1_000_000_000, currency: 'USD' },
  });
  await http.expect(201, 'POST', '/v1/webhooks', {
    token,
    body: { url: `http://127.0.0.1:${receiverPort}/hook`, events: ['run.finalized', 'settlement.completed'] },
  });
  return { token, workerAgent, payerAgentId: payer.agentId };
}

function sampleEvents(runId: string, head: ChainHead, count: number, agent: Client['workerAgent']): EventEnvelope[] {
  return signEvents(
    Array.from({ length: count }, (_, i) => ({
      id: newId('evt'),
      runId,
      type: 'sample',
      at: new Date().toISOString(),
      payload: {
        latencyMs: 100 + ((head.seq + i) % 700),
        correct: (head.seq + i) % 20 !== 0,
        step: head.seq + i,
        note: 'tool output digest 0123456789abcdef',
      },
    })),
    head,
    agent.privateKey,
    agent.keyId,
  );
}

type ByConcurrency = Record<`c${Concurrency}`, LatencySummary & { eventsPerSecond?: number }>;

interface PhaseResult {
  idleCpu: {
    seconds: number;
    percentOfOneCore: Record<string, number>;
    ticks: Record<string, number>;
    machineBusyPercent: number;
  };
  /** How busy the whole machine was (all cores) while this phase ran: other users' work shows here. */
  machineBusyPercent: number;
  loadAverageAtEnd: number[];
  operations: Record<string, ByConcurrency>;
  ceilings: Record<string, ByConcurrency>;
  finalize10k: { events: number; samplesMs: number[]; p50Ms: number; appendEventsPerSecondSequential: number };
  verifyColdMs: number[];
  peakRssUnder16ClientsMB: Record<string, number>;
  /** Diagnostic: the API's peak RSS in each 16-client step. */
  apiPeakRssByStep16ClientsMB: Record<string, number>;
  /** How long FerretDB took to go quiet before the phase started its service (backendSettled). */
  backendSettled: { seconds: number; ticks: number };
  peakRssWholePhaseMB: Record<string, number>;
}

const mb = (mib: number) => round(mib * 1.048576, 1);

async function measureIdle(pids: Record<string, number | null>, seconds: number): Promise<PhaseResult['idleCpu']> {
  const known = Object.entries(pids).filter((e): e is [string, number] => e[1] !== null);
  const before = Object.fromEntries(known.map(([name, pid]) => [name, cpuTicks(pid)]));
  const machineBefore = machineJiffies();
  const started = performance.now();
  await sleep(seconds * 1000);
  const elapsed = (performance.now() - started) / 1000;
  const ticks = Object.fromEntries(known.map(([name, pid]) => [name, cpuTicks(pid) - before[name]!]));
  const percentOfOneCore = Object.fromEntries(
    Object.entries(ticks).map(([name, t]) => [name, round((t / CLOCK_TICKS_PER_SECOND / elapsed) * 100, 3)]),
  );
  return {
    seconds: round(elapsed, 1),
    percentOfOneCore,
    ticks,
    machineBusyPercent: machineBusyPercent(machineBefore, machineJiffies()),
  };
}

/**
 * Waits until FerretDB has been quiet (at most one clock tick in a 5 s window) before a phase starts its service,
 * at most 120 s. Right after seeding a million events it is still busy with what the bulk load left behind, which
 * would otherwise land in the seeded phase's idle window as if the service had caused it. Both phases wait alike.
 */
async function backendSettled(ferretdbPid: number | null): Promise<{ seconds: number; ticks: number }> {
  if (ferretdbPid === null) return { seconds: 0, ticks: 0 };
  const started = performance.now();
  const first = cpuTicks(ferretdbPid);
  for (;;) {
    const before = cpuTicks(ferretdbPid);
    await sleep(5_000);
    const seconds = round((performance.now() - started) / 1000, 1);
    if (cpuTicks(ferretdbPid) - before <= 1 || seconds >= 120) return { seconds, ticks: cpuTicks(ferretdbPid) - first };
  }
}

async function runPhase(
  phase: 'empty' | 'seeded',
  ctx: {
    receiver: WebhookReceiver;
    receiverPort: number;
    bare: HttpClient;
    mongo: MongoClient;
    backendPids: Record<string, number | null>;
    seededRunIds: string[];
  },
): Promise<PhaseResult> {
  const settled = await backendSettled(ctx.backendPids.ferretdb ?? null);
  log(
    `${phase}: FerretDB quiet after ${settled.seconds} s (${settled.ticks} ticks meanwhile); starting API and worker`,
  );
  const machineAtStart = machineJiffies();
  const services = await startServices(phase);
  const { http, api, worker } = services;
  try {
    const client = await bootstrap(http, ctx.receiverPort, SERVICES[phase].adminKey);
    const { token, workerAgent } = client;
    const settlementTerms = {
      payerAgentId: client.payerAgentId,
      amount: 100,
      currency: 'USD',
      holdbackBps: 0,
      disputeWindowSeconds: 3_600,
    };
    const createRunFor = async (settlement = false) =>
      (
        await http.expect(201, 'POST', '/v1/runs', {
          token,
          body: {
            agentId: workerAgent.agentId,
            terms: { accuracy: { min: 0.9 } },
            ...(settlement ? { settlement: settlementTerms } : {}),
          },
        })
      ).json.runId as string;

    await sleep(3_000); // let start-up work (index builds, first sweeps) pass before the idle window
    log(`${phase}: idle window of ${IDLE_SECONDS} s`);
    const idleCpu = await measureIdle({ api: api.pid, worker: worker.pid, ...ctx.backendPids }, IDLE_SECONDS);

    const operations: PhaseResult['operations'] = {};
    const ceilings: PhaseResult['ceilings'] = {};
    const put = (
      table: Record<string, ByConcurrency>,
      name: string,
      c: Concurrency,
      summary: LatencySummary & { eventsPerSecond?: number },
    ) => {
      table[name] ??= {} as ByConcurrency;
      table[name]![`c${c}`] = summary;
    };
    // Where a step's time went: every process's CPU over it, per call (read like the x402 bench's cpuMsPerCall).
    const watched: Record<string, number> = { api: api.pid, worker: worker.pid, bench: process.pid };
    for (const [name, pid] of Object.entries(ctx.backendPids)) if (pid !== null) watched[name] = pid;
    const measured = async (...args: Parameters<typeof concurrently>) => {
      const before = Object.fromEntries(Object.entries(watched).map(([name, pid]) => [name, cpuTicks(pid)]));
      const r = await concurrently(...args);
      const msPerTick = 1000 / CLOCK_TICKS_PER_SECOND;
      const cpuMsPerCall = Object.fromEntries(
        Object.entries(watched).map(([name, pid]) => [
          name,
          round(((cpuTicks(pid) - before[name]!) * msPerTick) / Math.max(1, r.latencies.length)),
        ]),
      );
      return { ...r, cpuMsPerCall };
    };
    const withCpu = (r: { latencies: number[]; wallMs: number; cpuMsPerCall: Record<string, number> }) => ({
      ...summarize(r.latencies, r.wallMs),
      cpuMsPerCall: r.cpuMsPerCall,
    });
    const createdRuns: string[] = [];
    const raw = ctx.mongo.db(SERVICES[phase].dbName);
    const findTargets = phase === 'seeded' && ctx.seededRunIds.length > 0 ? ctx.seededRunIds : createdRuns;
    let peakUnderLoad: Record<string, number> = { api: 0, worker: 0 };
    let step = '';
    const stepLog = (c: number, name: string) => {
      step = name;
      log(`${phase}: ${c} client(s): ${name}`);
    };
    let apiPeakByStep: Record<string, number> = {};

    for (const c of CONCURRENCY) {
      const measureAll = async () => {
        stepLog(c, 'create run');
        let r = await measured(c, SIZES.create[c], async () => {
          const reply = await http.expect(201, 'POST', '/v1/runs', {
            token,
            body: { agentId: workerAgent.agentId, terms: { accuracy: { min: 0.9 } } },
          });
          createdRuns.push(reply.json.runId);
          return reply.ms;
        });
        put(operations, 'createRun', c, withCpu(r));

        stepLog(c, 'single-event append');
        const singleRuns = await Promise.all(Array.from({ length: c }, () => createRunFor()));
        const singles = singleRuns.map((runId) => sampleEvents(runId, EMPTY_HEAD, SIZES.appendSingle[c], workerAgent));
        r = await measured(
          c,
          SIZES.appendSingle[c],
          async (k, i) =>
            (
              await http.expect(201, 'POST', `/v1/runs/${singleRuns[k]}/events`, {
                token,
                body: { event: singles[k]![i] },
              })
            ).ms,
        );
        put(operations, 'appendSingleEvent', c, {
          ...withCpu(r),
          eventsPerSecond: round(r.latencies.length / (r.wallMs / 1000), 1),
        });

        stepLog(c, '100-event batch append');
        const batchRuns = await Promise.all(Array.from({ length: c }, () => createRunFor()));
        const batches = batchRuns.map((runId) => {
          const out: EventEnvelope[][] = [];
          let head: ChainHead = EMPTY_HEAD;
          for (let b = 0; b < SIZES.appendBatches[c]; b++) {
            const batch = sampleEvents(runId, head, 100, workerAgent);
            head = { seq: batch.at(-1)!.seq, chainHash: batch.at(-1)!.chainHash };
            out.push(batch);
          }
          return out;
        });
        r = await measured(
          c,
          SIZES.appendBatches[c],
          async (k, i) =>
            (
              await http.expect(201, 'POST', `/v1/runs/${batchRuns[k]}/events`, {
                token,
                body: { events: batches[k]![i] },
              })
            ).ms,
        );
        put(operations, 'appendBatch100', c, {
          ...withCpu(r),
          eventsPerSecond: round((r.latencies.length * 100) / (r.wallMs / 1000), 1),
        });

        stepLog(c, 'GET run');
        r = await measured(
          c,
          SIZES.get[c],
          async (k, i) =>
            (
              await http.expect(200, 'GET', `/v1/runs/${createdRuns[(k * 7919 + i * 31) % createdRuns.length]}`, {
                token,
              })
            ).ms,
        );
        put(operations, 'getRun', c, withCpu(r));

        stepLog(c, 'finalize -> run.finalized, settle -> settlement.completed');
        const settleLatencies: number[] = [];
        r = await measured(c, SIZES.webhook[c], async () => {
          const runId = await createRunFor(true);
          const [metric] = signEvents(
            [
              {
                id: newId('evt'),
                runId,
                type: 'metric',
                at: new Date().toISOString(),
                payload: { name: 'accuracy', value: 1 },
              },
            ],
            EMPTY_HEAD,
            workerAgent.privateKey,
            workerAgent.keyId,
          );
          await http.expect(201, 'POST', `/v1/runs/${runId}/events`, { token, body: { event: metric } });
          const finalizeAt = performance.now();
          await http.expect(202, 'POST', `/v1/runs/${runId}/finalize`, { token });
          const finalizedAt = await ctx.receiver.waitFor('run.finalized', runId);
          const settleAt = performance.now();
          await http.expect(202, 'POST', `/v1/runs/${runId}/settle`, { token, body: {} });
          settleLatencies.push((await ctx.receiver.waitFor('settlement.completed', runId)) - settleAt);
          return finalizedAt - finalizeAt;
        });
        put(operations, 'finalizeToWebhook', c, withCpu(r));
        put(operations, 'settleToWebhook', c, summarize(settleLatencies, r.wallMs));

        stepLog(c, 'ceilings');
        r = await measured(c, SIZES.bare[c], async () => (await ctx.bare.expect(200, 'GET', '/ok')).ms);
        put(ceilings, 'bareFastifyRoute', c, withCpu(r));
        const scratch = raw.collection<{ _id: string }>('bench_ceiling');
        r = await measured(c, SIZES.rawInsert[c], async () => {
          const t0 = performance.now();
          await scratch.insertOne({
            _id: newId('run'),
            tenantId: 'ten_bench',
            agentId: workerAgent.agentId,
            terms: { accuracy: { min: 0.9 } },
            status: 'in_progress',
            createdAt: new Date(),
          } as { _id: string });
          return performance.now() - t0;
        });
        put(ceilings, 'rawInsertOne', c, withCpu(r));
        const runsCollection = raw.collection<{ _id: string }>('runs');
        r = await measured(c, SIZES.get[c], async (k, i) => {
          const t0 = performance.now();
          const found = await runsCollection.findOne({ _id: findTargets[(k * 7919 + i * 31) % findTargets.length]! });
          if (!found) throw new Error('raw findOne found nothing');
          return performance.now() - t0;
        });
        put(ceilings, 'rawFindOneById', c, withCpu(r));
      };
      step = 'start';
      if (c === 16)
        ({ peakMiB: peakUnderLoad, byLabel: apiPeakByStep } = await withPeakRss(
          { api: api.pid, worker: worker.pid },
          measureAll,
          100,
          () => step,
        ));
      else await measureAll();
    }

    // Finalize of a 10,000-event run, then its public verification: first call (cold) and repeated (warm).
    const finalizeSamples: number[] = [];
    const verifyColdMs: number[] = [];
    let appendMs = 0;
    const finalizedRuns: string[] = [];
    for (let s = 0; s < SIZES.finalizeSamples; s++) {
      log(`${phase}: finalize of a ${FINALIZE_EVENTS}-event run (${s + 1}/${SIZES.finalizeSamples})`);
      const runId = await createRunFor();
      let head: ChainHead = EMPTY_HEAD;
      for (let done = 0; done < FINALIZE_EVENTS; done += 100) {
        const batch = sampleEvents(runId, head, Math.min(100, FINALIZE_EVENTS - done), workerAgent);
        appendMs += (await http.expect(201, 'POST', `/v1/runs/${runId}/events`, { token, body: { events: batch } })).ms;
        head = { seq: batch.at(-1)!.seq, chainHash: batch.at(-1)!.chainHash };
      }
      const t0 = performance.now();
      await http.expect(202, 'POST', `/v1/runs/${runId}/finalize`, { token });
      for (let polls = 0; ; polls++) {
        if (polls > 6_000) throw new Error(`run ${runId} not finalized after ${polls} polls`);
        if ((await http.expect(200, 'GET', `/v1/runs/${runId}`, { token })).json.status === 'finalized') break;
        await sleep(20);
      }
      finalizeSamples.push(performance.now() - t0);
      const cold = await http.expect(200, 'GET', `/v1/verify/${runId}`);
      if (cold.json.verified !== true) throw new Error(`verification of ${runId} failed: ${cold.text.slice(0, 300)}`);
      verifyColdMs.push(round(cold.ms));
      finalizedRuns.push(runId);
    }
    for (const c of CONCURRENCY) {
      const r = await concurrently(
        c,
        SIZES.verifyWarm[c],
        async (k, i) =>
          (await http.expect(200, 'GET', `/v1/verify/${finalizedRuns[(k + i) % finalizedRuns.length]}`)).ms,
      );
      put(operations, 'publicVerifyWarm', c, summarize(r.latencies, r.wallMs));
    }
    const sortedFinalize = [...finalizeSamples].sort((a, b) => a - b);
    const hwm = { api: memoryMiB(api.pid).hwm, worker: memoryMiB(worker.pid).hwm };
    return {
      idleCpu,
      operations,
      ceilings,
      finalize10k: {
        events: FINALIZE_EVENTS,
        samplesMs: finalizeSamples.map((x) => round(x)),
        p50Ms: round(sortedFinalize[Math.ceil(sortedFinalize.length / 2) - 1]!),
        appendEventsPerSecondSequential: round((FINALIZE_EVENTS * SIZES.finalizeSamples) / (appendMs / 1000), 1),
      },
      verifyColdMs,
      peakRssUnder16ClientsMB: { api: mb(peakUnderLoad.api!), worker: mb(peakUnderLoad.worker!) },
      apiPeakRssByStep16ClientsMB: Object.fromEntries(Object.entries(apiPeakByStep).map(([name, v]) => [name, mb(v)])),
      backendSettled: settled,
      peakRssWholePhaseMB: { api: mb(hwm.api), worker: mb(hwm.worker) },
      machineBusyPercent: machineBusyPercent(machineAtStart, machineJiffies()),
      loadAverageAtEnd: loadavg().map((x) => round(x)),
    };
  } finally {
    await Promise.all([stopChild(api), stopChild(worker)]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Verdicts

interface Target {
  name: string;
  target: string;
  values: Record<string, number | null>;
  met: boolean;
}

function judge(empty: PhaseResult, seeded: PhaseResult) {
  const p50Ratios: Record<string, number> = {};
  for (const [op, byC] of Object.entries(empty.operations)) {
    for (const c of CONCURRENCY) {
      const before = byC[`c${c}`]?.p50;
      const after = seeded.operations[op]?.[`c${c}`]?.p50;
      if (before && after !== undefined) p50Ratios[`${op}@${c}`] = round(after / before);
    }
  }
  p50Ratios['finalize10k@1'] = round(seeded.finalize10k.p50Ms / empty.finalize10k.p50Ms);
  p50Ratios['publicVerifyCold@1'] = round(Math.max(...seeded.verifyColdMs) / Math.max(...empty.verifyColdMs));
  // One clock tick is the resolution: an idle FerretDB may use none, so the ratio's floor is one tick.
  const ferretTicks = (p: PhaseResult) => Math.max(1, p.idleCpu.ticks.ferretdb ?? 0);
  const ferretIdleRatio = round(ferretTicks(seeded) / ferretTicks(empty));
  const getMinusFind = (p: PhaseResult, c: Concurrency) =>
    round(p.operations.getRun![`c${c}`].p50 - p.ceilings.rawFindOneById![`c${c}`].p50);
  const both = (f: (p: PhaseResult) => number) => ({ empty: f(empty), seeded: f(seeded) });
  const targets: Target[] = [
    {
      name: 'every operation: seeded p50 / empty p50',
      target: '<= 1.3',
      values: p50Ratios,
      met: Object.values(p50Ratios).every((r) => r <= 1.3),
    },
    {
      name: 'FerretDB idle CPU: seeded / empty',
      target: '<= 2',
      values: { ratio: ferretIdleRatio },
      met: ferretIdleRatio <= 2,
    },
    {
      name: 'GET run p50 - raw findOne({_id}) p50 (ms, 1 client)',
      target: '<= 2',
      values: both((p) => getMinusFind(p, 1)),
      met: Math.max(getMinusFind(empty, 1), getMinusFind(seeded, 1)) <= 2,
    },
    {
      name: 'single-event append p50 (ms, 1 client)',
      target: '<= 8',
      values: both((p) => p.operations.appendSingleEvent!.c1.p50),
      met: Math.max(empty.operations.appendSingleEvent!.c1.p50, seeded.operations.appendSingleEvent!.c1.p50) <= 8,
    },
    {
      name: 'single-event append events/s (16 clients)',
      target: '>= 410',
      values: both((p) => p.operations.appendSingleEvent!.c16.eventsPerSecond!),
      met:
        Math.min(
          empty.operations.appendSingleEvent!.c16.eventsPerSecond!,
          seeded.operations.appendSingleEvent!.c16.eventsPerSecond!,
        ) >= 410,
    },
    {
      name: '100-event batch append events/s (16 clients)',
      target: '>= 8000',
      values: both((p) => p.operations.appendBatch100!.c16.eventsPerSecond!),
      met:
        Math.min(
          empty.operations.appendBatch100!.c16.eventsPerSecond!,
          seeded.operations.appendBatch100!.c16.eventsPerSecond!,
        ) >= 8000,
    },
    {
      name: 'finalize of a 10k-event run, p50 (ms)',
      target: '<= 2000',
      values: both((p) => p.finalize10k.p50Ms),
      met: Math.max(empty.finalize10k.p50Ms, seeded.finalize10k.p50Ms) <= 2000,
    },
    {
      name: 'public verify cold, worst (ms)',
      target: '<= 1500',
      values: both((p) => Math.max(...p.verifyColdMs)),
      met: Math.max(...empty.verifyColdMs, ...seeded.verifyColdMs) <= 1500,
    },
    {
      name: 'API peak RSS under 16 clients (MB)',
      target: '<= 200',
      values: both((p) => p.peakRssUnder16ClientsMB.api!),
      met: Math.max(empty.peakRssUnder16ClientsMB.api!, seeded.peakRssUnder16ClientsMB.api!) <= 200,
    },
    {
      name: 'worker peak RSS under 16 clients (MB)',
      target: '<= 250',
      values: both((p) => p.peakRssUnder16ClientsMB.worker!),
      met: Math.max(empty.peakRssUnder16ClientsMB.worker!, seeded.peakRssUnder16ClientsMB.worker!) <= 250,
    },
  ];
  return {
    p50Ratios,
    ferretIdleRatio,
    getMinusFindOneP50Ms: { c1: both((p) => getMinusFind(p, 1)), c16: both((p) => getMinusFind(p, 16)) },
    targets,
  };
}

function table(empty: PhaseResult, seeded: PhaseResult, ratios: Record<string, number>): string {
  const rows: string[][] = [
    [
      'operation',
      'clients',
      'empty p50/p95/p99 ms',
      'empty ops/s',
      'seeded p50/p95/p99 ms',
      'seeded ops/s',
      'p50 ratio',
    ],
  ];
  const fmt = (s: (LatencySummary & { eventsPerSecond?: number }) | undefined) =>
    s ? `${s.p50} / ${s.p95} / ${s.p99}` : '-';
  const rate = (s: (LatencySummary & { eventsPerSecond?: number }) | undefined) =>
    s ? (s.eventsPerSecond !== undefined ? `${s.eventsPerSecond} ev/s` : String(s.opsPerSecond)) : '-';
  for (const [kind, source] of [
    ['', 'operations'],
    ['ceiling: ', 'ceilings'],
  ] as const) {
    for (const name of Object.keys(empty[source])) {
      for (const c of CONCURRENCY) {
        const e = empty[source][name]?.[`c${c}`];
        const s = seeded[source][name]?.[`c${c}`];
        rows.push([kind + name, String(c), fmt(e), rate(e), fmt(s), rate(s), String(ratios[`${name}@${c}`] ?? '')]);
      }
    }
  }
  rows.push([
    'finalize 10k events (p50 ms)',
    '1',
    String(empty.finalize10k.p50Ms),
    '',
    String(seeded.finalize10k.p50Ms),
    '',
    String(ratios['finalize10k@1']),
  ]);
  rows.push([
    'public verify cold (ms)',
    '1',
    empty.verifyColdMs.join(', '),
    '',
    seeded.verifyColdMs.join(', '),
    '',
    String(ratios['publicVerifyCold@1']),
  ]);
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join('  ')).join('\n');
}

// ---------------------------------------------------------------------------------------------------------------
// Main

async function cleanup(mongo: MongoClient | null): Promise<void> {
  killAllChildren();
  if (process.env.BENCH_KEEP_DATA === '1') return;
  for (const service of Object.values(SERVICES)) await dropBenchData(service, mongo, log);
}

async function main(): Promise<void> {
  const startedAt = new Date();
  for (const [phase, service] of Object.entries(SERVICES))
    log(
      `mode ${QUICK ? 'quick' : 'full'}; ${phase}: database ${service.dbName}, Redis prefix ${service.redisPrefix}; child logs in ${service.logDir}`,
    );
  log('building: tsc -p tsconfig.build.json');
  buildService();

  const backendPids = {
    ferretdb: pidOfServer(27027, [join(ROOT, '.data/ferretdb.pid'), join(ROOT, '../main/.data/ferretdb.pid')]),
    redis: pidOfServer(6390, [join(ROOT, '.data/redis.pid'), join(ROOT, '../main/.data/redis.pid')]),
  };
  if (!backendPids.ferretdb || !backendPids.redis)
    throw new Error(
      `FerretDB on 27027 and Redis on 6390 must be running (scripts/services.sh up): ${JSON.stringify(backendPids)}`,
    );

  const mongo = new MongoClient(MONGO_BASE, { maxPoolSize: 32 });
  const receiver = new WebhookReceiver();
  let bareChild: Child | null = null;
  cleanUpOnSignals(() => cleanup(mongo), log);

  try {
    await mongo.connect();
    const receiverPort = await receiver.start();
    const bare = await startBareFastify(SERVICES.empty.logDir);
    bareChild = bare.child;
    const ctx = { receiver, receiverPort, bare: bare.http, mongo, backendPids, seededRunIds: [] as string[] };

    const empty = await runPhase('empty', ctx);

    log(`seeding ${SEED_RUNS} runs and ${SEED_EVENTS} events through the stores`);
    const config = loadConfig({ ...SERVICES.seeded.env, LOG_LEVEL: 'warn' });
    const runtime = createRuntime(config, createLogger(config, 'bench-seed'));
    let seed: SeedReport;
    try {
      await connectRuntime(runtime);
      seed = await seedDatabase(
        runtime,
        {
          runs: SEED_RUNS,
          events: SEED_EVENTS,
          finalizedEvery: 100,
          realSignatures: process.env.BENCH_SEED_REAL_SIGNATURES === '1',
          chunkRuns: 1_000,
        },
        log,
      );
    } finally {
      await runtime.close();
    }
    log(`seeded in ${seed.seconds} s (building documents: ${seed.buildSeconds} s)`);
    ctx.seededRunIds = seed.sampleRunIds;

    const seeded = await runPhase('seeded', ctx);
    const verdicts = judge(empty, seeded);
    const { sampleRunIds: _ids, ...seedSummary } = seed;
    const result = {
      bench: 'growth',
      mode: QUICK ? 'quick' : 'full',
      startedAt: startedAt.toISOString(),
      durationSeconds: round((Date.now() - startedAt.getTime()) / 1000, 0),
      machine: {
        cpus: cpus().length,
        cpuModel: cpus()[0]?.model ?? null,
        node: process.version,
        loadAverageAtStart: loadavg().map((x) => round(x)),
      },
      setup: {
        backend:
          'FerretDB 1.24 (SQLite) on 127.0.0.1:27027, Redis on 127.0.0.1:6390 (shared with other users of this machine)',
        processes:
          'node dist/main.js api + node dist/main.js worker (NODE_ENV=production), load from this process over keep-alive HTTP',
        databases: 'each phase on a database and Redis prefix of its own; the seeded one holds only the seed',
        callsPerClient: SIZES,
        idleSeconds: IDLE_SECONDS,
        batchAppend: 'each client appends batches of 100 events to its own run',
        singleAppend: 'each client appends one event per request to its own run',
      },
      seed: seedSummary,
      phases: { empty, seeded },
      ratios: {
        seededOverEmptyP50: verdicts.p50Ratios,
        ferretdbIdleCpuSeededOverEmpty: verdicts.ferretIdleRatio,
        getRunMinusRawFindOneP50Ms: verdicts.getMinusFindOneP50Ms,
      },
      targets: verdicts.targets,
      webhooksReceived: receiver.received,
    };
    const json = JSON.stringify(result, null, 2);
    mkdirSync(join(ROOT, 'bench/results'), { recursive: true });
    const out = join(ROOT, `bench/results/growth${QUICK ? '-quick' : ''}.json`);
    writeFileSync(out, `${json}\n`);
    console.log(json);
    console.log(`\n${table(empty, seeded, verdicts.p50Ratios)}\n`);
    console.log(`seeding: ${seed.runs} runs, ${seed.events} events in ${seed.seconds} s`);
    console.log(
      `idle CPU % of one core over ${IDLE_SECONDS} s: empty ${JSON.stringify(empty.idleCpu.percentOfOneCore)}; seeded ${JSON.stringify(seeded.idleCpu.percentOfOneCore)}`,
    );
    const cpuOf = (p: PhaseResult) =>
      Object.fromEntries(
        Object.entries(p.operations).flatMap(([name, byC]) =>
          Object.entries(byC)
            .filter(([, v]) => v.cpuMsPerCall)
            .map(([c, v]) => [`${name}@${c.slice(1)}`, `${v.cpuMsPerCall!.api}/${v.cpuMsPerCall!.ferretdb}`]),
        ),
      );
    console.log(
      `CPU ms per call, API/FerretDB: empty ${JSON.stringify(cpuOf(empty))}; seeded ${JSON.stringify(cpuOf(seeded))}`,
    );
    console.log(
      `API peak RSS MB per 16-client step: empty ${JSON.stringify(empty.apiPeakRssByStep16ClientsMB)}; seeded ${JSON.stringify(seeded.apiPeakRssByStep16ClientsMB)}`,
    );
    console.log(
      `FerretDB went quiet before each phase after: empty ${JSON.stringify(empty.backendSettled)}; seeded ${JSON.stringify(seeded.backendSettled)}`,
    );
    console.log(
      `machine busy (all cores): empty phase ${empty.machineBusyPercent}% (idle window ${empty.idleCpu.machineBusyPercent}%), seeded phase ${seeded.machineBusyPercent}% (idle window ${seeded.idleCpu.machineBusyPercent}%)`,
    );
    for (const t of verdicts.targets)
      console.log(`${t.met ? 'MET   ' : 'MISSED'} ${t.name} ${t.target}: ${JSON.stringify(t.values)}`);
    console.log(`written to ${out}`);
  } finally {
    if (bareChild) await stopChild(bareChild);
    await receiver.close();
    await cleanup(mongo);
    await mongo.close().catch(() => undefined);
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
