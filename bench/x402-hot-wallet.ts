// A hot wallet (issue 40, item 1): a money flow with every flow paid from ONE wallet, beside the same flow spread over
// one wallet per client, at 4, 16 and 50 clients. Target: the one wallet at 50 clients reaches at least 0.9x the
// throughput and at most 1.1x the CPU per flow of the many wallets, with a flow p99 under 1.5 s. Prints JSON (also
// written to bench/results/<flow's file>.json, -shared-backend with --shared-backend) with the ratios measured in this
// one run and what fell short. The flows (--flow):
//   gate       (default) the x402 gate flow: create -> quote -> authorize-payment -> verify, then GET until decided;
//              the hot wallet is the payer's
//   sponsored  the same gate flow paid from a sponsor wallet, with the sponsor's wallet decision before the payment
//              (POST /x402/wallets/:id/authorize); the hot wallet is the sponsor's
//   run        run settlement: a run with settlement terms, one signed metric event, finalize, settle, then GET until
//              the settlement completes; the hot wallet is the payer's
//
//   node --import tsx bench/x402-hot-wallet.ts [--flow gate|sponsored|run] [--flows 300] [--clients 4,16,50]
//     [--shared-backend]
//
// The service runs as production runs it (bench/production-service.ts: `node dist/main.js api` and `worker`, built
// by tsc -p tsconfig.build.json) on a FerretDB and a Redis the bench starts for itself (bench/backend.ts), so their
// CPU is this bench's alone; --shared-backend uses the shared ones (127.0.0.1:27027 and :6390) instead. Both modes
// run against the same processes: each client count runs its flows in chunks that alternate between the modes (one,
// many, many, one, ...), each chunk starting once every process is idle, so the shared machine's drift falls on both.
// Every client has a payee of its own in both modes: only the payer differs. BENCH_CPU_PROF=<dir> writes profiles.
import { createHash, randomUUID } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { MongoClient } from 'mongodb';
import { newId } from '../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents } from '../src/domain/event-chain.ts';
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
import {
  call,
  percentiles,
  positiveArg,
  quiesce,
  Refused,
  registerAgent,
  writeResults,
  type Caller,
} from './side-by-side.ts';

const FLOWS = positiveArg('--flows', 300, { integer: true });
const CLIENTS = (process.argv.includes('--clients') ? process.argv[process.argv.indexOf('--clients') + 1]! : '4,16,50')
  .split(',')
  .map(Number);
const OWN_BACKEND = !process.argv.includes('--shared-backend');
const FLOW_KINDS = ['gate', 'sponsored', 'run'] as const;
type FlowKind = (typeof FLOW_KINDS)[number];
const FLOW = (process.argv.includes('--flow') ? process.argv[process.argv.indexOf('--flow') + 1] : 'gate') as FlowKind;
if (!FLOW_KINDS.includes(FLOW)) throw new Error(`--flow must be one of ${FLOW_KINDS.join(', ')}`);
const RESULT_NAME = { gate: 'x402-hot-wallet', sponsored: 'x402-hot-sponsor-wallet', run: 'run-settlement-hot-wallet' }[
  FLOW
];
const MODES = ['onePayer', 'manyPayers'] as const;
type Mode = (typeof MODES)[number];
const CHUNKS = 6;
const POLL_EVERY_MS = 25;
const POLL_LIMIT_MS = 60_000;
const QUIESCE_LIMIT_MS = 15_000;
const PROCESSES = ['api', 'worker', 'ferretdb', 'redis'] as const;
/** The target at the highest client count: one payer over many payers. */
const TARGET = { throughputAtLeast: 0.9, cpuAtMost: 1.1, p99BelowMs: 1_500 };

const log = (line: string) => console.error(`[bench hot-wallet ${new Date().toISOString().slice(11, 19)}] ${line}`);
const round = (x: number, digits = 2) => Number(x.toFixed(digits));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha = (seed: string) => createHash('sha256').update(`bench hot wallet ${seed}`).digest('hex');

const running = new Set<Child>();
let service: BenchService | null = null;

async function cleanup(): Promise<void> {
  for (const child of [...running]) await stopChild(child).catch(() => undefined);
  if (OWN_BACKEND) await stopOwnBackend();
  else if (service) {
    const mongo = new MongoClient(MONGO_BASE, { serverSelectionTimeoutMS: 5_000 });
    await dropBenchData(service, mongo, log);
    await mongo.close().catch(() => undefined);
  }
}

interface Chunk {
  samples: number[];
  failed: Record<string, number>;
  wallMs: number;
  ticks: Record<string, number>;
}

async function main(): Promise<void> {
  const loadAtStart = loadavg().map((x) => round(x));
  log(`load average ${loadAtStart.join(' ')}; ${FLOWS} flows per mode at ${CLIENTS.join(', ')} clients`);
  buildService();
  cleanUpOnSignals(cleanup, log);
  try {
    const backend = OWN_BACKEND ? await startOwnBackend(log) : sharedBackend();
    service = benchService('hotwallet');
    service.env.MONGO_URL = `${backend.mongoBase}/${service.dbName}`;
    service.env.REDIS_URL = backend.redisUrl;
    log(`database ${service.dbName}, Redis prefix ${service.redisPrefix}; logs in ${service.logDir}`);
    const { api, worker, http } = await startServiceProcesses(service, 'hot', cpuProfileFlags('hot'));
    running.add(api).add(worker);
    const admin: Caller = { http, token: service.adminKey };
    const tenant = await call(admin, 'POST', '/ops/tenants', { name: 'bench-hot-wallet' });
    const scopes = ['agents:write', 'x402:write', 'x402:read', 'wallets:write', 'runs:write', 'runs:read'];
    const t: Caller = {
      http,
      token: (await call(admin, 'POST', '/ops/api-keys', { tenantId: tenant.tenantId, scopes })).token,
    };
    const most = Math.max(...CLIENTS);
    // Set up a few at a time, a refusal (503 on a busy machine) tried again: setup is not measured.
    const patiently = async <T>(work: () => Promise<T>): Promise<T> => {
      for (let tries = 1; ; tries++) {
        try {
          return await work();
        } catch (err) {
          if (!(err instanceof Refused) || tries >= 10) throw err;
          await sleep(500 * tries);
        }
      }
    };
    type Payee = Awaited<ReturnType<typeof registerAgent>>;
    const pairs: Array<{ payer: string; payee: string; payeeAgent: Payee; sponsor: string }> = [];
    for (let i = 0; i < most; i += 5) {
      pairs.push(
        ...(await Promise.all(
          Array.from({ length: Math.min(5, most - i) }, async (_, k) => {
            const payer = (await patiently(() => registerAgent(t, `payer${i + k}`))).agentId;
            const payeeAgent = await patiently(() => registerAgent(t, `payee${i + k}`));
            const payee = payeeAgent.agentId;
            await patiently(() =>
              call(
                admin,
                'POST',
                `/ops/wallets/${encodeURIComponent(payer)}/credit`,
                { amount: 1_000_000_000, currency: 'USD', reference: 'bench-funds' },
                [201],
              ),
            );
            // A sponsor wallet of its own per pair, with a policy whose limits the bench never reaches.
            const sponsor = `sponsor-bench-${i + k}`;
            if (FLOW === 'sponsored') {
              await patiently(() =>
                call(
                  admin,
                  'POST',
                  `/ops/wallets/${sponsor}/credit`,
                  { amount: 1_000_000_000, currency: 'USD', tenantId: tenant.tenantId, reference: 'bench-funds' },
                  [201],
                ),
              );
              await patiently(() =>
                call(
                  t,
                  'PUT',
                  `/x402/wallets/${sponsor}/policy`,
                  { currency: 'USD', perCallLimit: 1_000_000, dailyLimit: 1_000_000_000 },
                  [200],
                ),
              );
            }
            return { payer, payee, payeeAgent, sponsor };
          }),
        )),
      );
    }
    const post = (path: string, body: unknown, expect: number[]) =>
      call(t, 'POST', path, body, expect, { 'idempotency-key': randomUUID() });
    let seq = 0;
    const runFlow = async (payer: string, payee: Payee) => {
      const settlement = {
        payerAgentId: payer,
        amount: 100,
        currency: 'USD',
        holdbackBps: 0,
        disputeWindowSeconds: 3_600,
      };
      const terms = { accuracy: { min: 0.9 } };
      const { runId } = await post('/v1/runs', { agentId: payee.agentId, terms, settlement }, [201]);
      const metric = { id: newId('evt'), runId, type: 'metric', at: new Date().toISOString() };
      const [event] = signEvents(
        [{ ...metric, payload: { name: 'accuracy', value: 1 } }],
        EMPTY_HEAD,
        payee.privateKey,
        payee.keyId,
      );
      await post(`/v1/runs/${runId}/events`, { event }, [201]);
      await post(`/v1/runs/${runId}/finalize`, undefined, [202]);
      const started = Date.now();
      const waitFor = async (path: string, done: (answer: any) => boolean) => {
        while (!done(await call(t, 'GET', path))) {
          if (Date.now() - started > POLL_LIMIT_MS) throw new Error(`${path} not done after ${POLL_LIMIT_MS} ms`);
          await sleep(POLL_EVERY_MS);
        }
      };
      await waitFor(`/v1/runs/${runId}`, (run) => run.status === 'finalized');
      await post(`/v1/runs/${runId}/settle`, {}, [202]);
      await waitFor(`/runs/${runId}/settlement`, (s) => {
        if (s.status !== 'pending' && s.status !== 'completed') throw new Error(`run ${runId}: settlement ${s.status}`);
        return s.status === 'completed';
      });
    };
    const flow = async (mode: Mode, client: number) => {
      const hot = mode === 'onePayer' ? 0 : client;
      const payer = pairs[FLOW === 'sponsored' ? client : hot]!.payer;
      const payee = pairs[client]!.payee;
      if (FLOW === 'run') return runFlow(payer, pairs[client]!.payeeAgent);
      const sponsor = FLOW === 'sponsored' ? { sponsorWalletId: pairs[hot]!.sponsor } : {};
      const seed = String(seq++);
      const { gateId } = await post(
        '/x402/gate/create',
        { payerAgentId: payer, payeeAgentId: payee, amount: 100, currency: 'USD', ...sponsor },
        [201],
      );
      const { quoteId, requestSha256 } = await post('/x402/gate/quote', { gateId, requestSha256: sha(seed) }, [200]);
      // A sponsored gate's payment carries the sponsor wallet's decision.
      const decision =
        FLOW === 'sponsored'
          ? {
              walletDecisionToken: (
                await post(`/x402/wallets/${pairs[hot]!.sponsor}/authorize`, { gateId, quoteId, requestSha256 }, [200])
              ).walletDecisionToken,
            }
          : {};
      await post('/x402/gate/authorize-payment', { gateId, quoteId, requestSha256, ...decision }, [200]);
      const verified = await post(
        '/x402/gate/verify',
        { gateId, evidence: { responseSha256: sha(`response ${seed}`) } },
        [200, 202],
      );
      const started = Date.now();
      for (
        let decision = verified.decision;
        decision === null;
        decision = (await call(t, 'GET', `/x402/gate/${gateId}`)).decision
      ) {
        if (Date.now() - started > POLL_LIMIT_MS) throw new Error(`gate ${gateId} undecided after ${POLL_LIMIT_MS} ms`);
        await sleep(POLL_EVERY_MS);
      }
    };
    const watched = {
      api: api.pid,
      worker: worker.pid,
      ...(backend.ferretdbPid ? { ferretdb: backend.ferretdbPid } : {}),
      ...(backend.redisPid ? { redis: backend.redisPid } : {}),
    };
    const pids = Object.values(watched);
    const runChunk = async (mode: Mode, clients: number, flows: number): Promise<Chunk> => {
      const samples: number[] = [];
      const failed: Record<string, number> = {};
      let next = 0;
      const before = Object.values(watched).map(cpuTicks);
      const started = performance.now();
      await Promise.all(
        Array.from({ length: Math.min(clients, flows) }, async (_, client) => {
          while (next++ < flows) {
            const flowStarted = performance.now();
            try {
              await flow(mode, client);
            } catch (err) {
              if (!(err instanceof Refused)) throw err;
              failed[err.message] = (failed[err.message] ?? 0) + 1;
              continue;
            }
            samples.push(performance.now() - flowStarted);
          }
        }),
      );
      const wallMs = performance.now() - started;
      const ticks = Object.fromEntries(
        Object.entries(watched).map(([name, pid], i) => [name, cpuTicks(pid) - before[i]!]),
      );
      return { samples, failed, wallMs, ticks };
    };
    const summarize = (chunks: Chunk[]) => {
      const samples = chunks.flatMap((c) => c.samples);
      const n = Math.max(1, samples.length);
      const failed: Record<string, number> = {};
      for (const c of chunks) for (const [k, v] of Object.entries(c.failed)) failed[k] = (failed[k] ?? 0) + v;
      const ticksOf = (name: string) => chunks.reduce((sum, c) => sum + (c.ticks[name] ?? 0), 0);
      const ms = (ticks: number) => round(((ticks / CLOCK_TICKS_PER_SECOND) * 1000) / n);
      const cpuMsPerFlow: Record<string, number> = {};
      for (const name of PROCESSES) if (name in watched) cpuMsPerFlow[name] = ms(ticksOf(name));
      cpuMsPerFlow.total = ms(PROCESSES.reduce((sum, name) => sum + ticksOf(name), 0));
      const { p50, p95, p99 } = percentiles(samples);
      return {
        flows: samples.length,
        ...(Object.keys(failed).length > 0 ? { failed } : {}),
        flowsPerSecond: round(samples.length / (chunks.reduce((sum, c) => sum + c.wallMs, 0) / 1000), 1),
        flowMs: { p50, p95, p99 },
        cpuMsPerFlow,
      };
    };

    const results: Record<string, unknown> = {};
    let last: { one: ReturnType<typeof summarize>; many: ReturnType<typeof summarize> } | null = null;
    for (const clients of CLIENTS) {
      // Uncounted: the processes compile what this concurrency runs, and the one payer's chains get going.
      for (const mode of MODES) await runChunk(mode, clients, clients * 2);
      const chunkSize = Math.max(Math.ceil(FLOWS / CHUNKS), clients * 2);
      const chunks = new Map<Mode, Chunk[]>(MODES.map((m) => [m, []]));
      for (let done = 0, k = 0; done < FLOWS; done += chunkSize, k++) {
        for (const mode of k % 2 === 0 ? MODES : [...MODES].reverse()) {
          await quiesce(pids, QUIESCE_LIMIT_MS);
          const chunk = await runChunk(mode, clients, Math.min(chunkSize, FLOWS - done));
          chunks.get(mode)!.push(chunk);
          const total = Object.values(chunk.ticks).reduce((a, b) => a + b, 0);
          log(
            `${clients} clients, ${mode}: ${chunk.samples.length} flows in ${round(chunk.wallMs / 1000, 1)} s, ${round(((total / CLOCK_TICKS_PER_SECOND) * 1000) / Math.max(1, chunk.samples.length), 1)} CPU ms per flow`,
          );
        }
      }
      const one = summarize(chunks.get('onePayer')!);
      const many = summarize(chunks.get('manyPayers')!);
      last = { one, many };
      results[`clients_${clients}`] = {
        onePayer: one,
        manyPayers: many,
        onePayerOverManyPayers: {
          flowsPerSecond: round(one.flowsPerSecond / many.flowsPerSecond),
          cpuMsPerFlow: Object.fromEntries(
            Object.keys(many.cpuMsPerFlow).map((k) => [k, round(one.cpuMsPerFlow[k]! / many.cpuMsPerFlow[k]!)]),
          ),
          p99: round(one.flowMs.p99 / many.flowMs.p99),
        },
      };
    }
    const top = Math.max(...CLIENTS);
    const shortfalls: string[] = [];
    if (last) {
      const throughput = round(last.one.flowsPerSecond / last.many.flowsPerSecond);
      const cpu = round(last.one.cpuMsPerFlow.total! / last.many.cpuMsPerFlow.total!);
      if (throughput < TARGET.throughputAtLeast)
        shortfalls.push(`throughput ${throughput}x of many payers (target >= ${TARGET.throughputAtLeast}x)`);
      if (cpu > TARGET.cpuAtMost)
        shortfalls.push(`CPU per flow ${cpu}x of many payers (target <= ${TARGET.cpuAtMost}x)`);
      if (last.one.flowMs.p99 >= TARGET.p99BelowMs)
        shortfalls.push(`one payer's flow p99 ${last.one.flowMs.p99} ms (target < ${TARGET.p99BelowMs} ms)`);
    }
    const out = {
      benchmark: RESULT_NAME,
      at: new Date().toISOString(),
      node: process.version,
      target: `at ${top} clients, one payer over many payers: throughput >= ${TARGET.throughputAtLeast}x, total CPU per flow <= ${TARGET.cpuAtMost}x, one payer's flow p99 < ${TARGET.p99BelowMs} ms`,
      verdict: { met: shortfalls.length === 0, ...(shortfalls.length > 0 ? { shortfalls } : {}) },
      setup: {
        flow: {
          gate: 'POST /x402/gate/create (100 USD, no holdback) -> quote -> authorize-payment -> verify, then GET /x402/gate/:id every 25 ms until decided',
          sponsored:
            'POST /x402/gate/create (100 USD from a sponsor wallet, no holdback) -> quote -> POST /x402/wallets/:sponsor/authorize -> authorize-payment -> verify, then GET /x402/gate/:id every 25 ms until decided',
          run: 'POST /v1/runs (settlement: 100 USD, no holdback) -> POST one signed metric event -> finalize -> GET /v1/runs/:id until finalized -> POST settle -> GET /runs/:id/settlement until completed',
        }[FLOW]!.concat('; every POST with an Idempotency-Key of its own'),
        modes:
          FLOW === 'sponsored'
            ? 'onePayer: every client pays from sponsor wallet 0; manyPayers: client i from sponsor wallet i; client i pays payee i from payer i in both'
            : 'onePayer: every client pays from payer 0; manyPayers: client i pays from payer i; client i pays payee i in both',
        chunks: `${FLOWS} flows per mode and client count, in chunks alternating between the modes, each starting once API, worker, FerretDB and Redis are idle; ${2} uncounted chunks of 2 flows per client first`,
        processes:
          'node dist/main.js api + worker (NODE_ENV=production, production node flags); CPU from /proc/<pid>/stat per chunk',
        backend: OWN_BACKEND
          ? "a FerretDB (SQLite) and a Redis of the bench's own"
          : 'the shared FerretDB and Redis (their CPU includes whatever else ran)',
        machine: {
          cpus: cpus().length,
          loadAverageAtStart: loadAtStart,
          loadAverageAtEnd: loadavg().map((x) => round(x)),
        },
      },
      ...results,
    };
    if (shortfalls.length > 0) log(`falls short: ${shortfalls.join('; ')}`);
    writeResults(join(ROOT, `bench/results/${RESULT_NAME}${OWN_BACKEND ? '' : '-shared-backend'}.json`), out, log);
  } finally {
    await cleanup();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    void cleanup().finally(() => process.exit(1));
  },
);
