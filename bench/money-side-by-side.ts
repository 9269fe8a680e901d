// CPU per money flow, this checkout against a baseline commit, side by side in one run (issue 22, "Speed": a settle
// end to end and a gate flow keep their CPU per operation within 1.1x of the baseline's). Prints JSON (also written
// to bench/results/money-side-by-side.json; -twins with --twins, -own-backend with --own-backend).
//
//   node --import tsx bench/money-side-by-side.ts [--baseline d77681e] [--clients 4] [--flows N]
//                                                  [--gate-flows 300] [--settle-flows 150] [--twins] [--own-backend]
//
// Two targets, each the service as production runs it (bench/production-service.ts): `node dist/main.js api` and
// `worker` (NODE_ENV=production, PRODUCTION_NODE_FLAGS) on a database and Redis prefix of its own, dropped at the end
// (also on Ctrl-C). "current" is this checkout built as it stands (tsc -p tsconfig.build.json as buildService() runs
// it, its output on stderr; uncommitted changes included; the JSON names HEAD and how many files under src/ differed
// from it once the build was done); "baseline" is --baseline <ref> checked out in a git worktree under /tmp
// (node_modules linked from here), built there and run from there; the worktree is removed at the end. --twins runs
// the current build twice instead: the ratios the comparison shows when nothing differs. BENCH_CPU_PROF=<dir> has
// each target's API and worker write a CPU profile there (`current-api-…`, `baseline-worker-…`).
//
// Two flows, each as a client does it, every POST with an Idempotency-Key of its own:
//   settle: POST /v1/runs with settlement terms (the payer pays the run's agent 1000 USD, no holdback), POST one signed
//           metric event (accuracy 1), POST finalize, poll GET /v1/runs/:id until finalized, POST settle, poll
//           GET /runs/:id/settlement until completed.
//   gate:   POST /x402/gate/create, quote, authorize-payment, verify (bodies as bench/x402.ts), then poll
//           GET /x402/gate/:id while verify answered 202 (undecided), until decided.
// `--clients` clients run flows at once (each with a payer and a payee of its own). Every flow kind is warmed up
// uncounted on both targets, then runs in chunks that alternate between the targets (A B, B A, A B, ...), each chunk
// starting once every service process is idle, so that the shared machine's drift falls on both alike. Per chunk the
// bench reads /proc/<pid>/stat of the running target's API and worker and of FerretDB and Redis; the latter two are
// shared by both targets, and their ticks in a chunk go to the target that ran it. Reported per flow and target:
// flows/s, p50/p95 of the whole flow, CPU ms per flow of each process and their total, and current/baseline ratios.
// Needs the local services (FerretDB 27027, Redis 6390: `bash scripts/services.sh up`); loopback only; stops by itself.
// They serve whatever else runs on this machine too (test suites): their ticks in a chunk include that work, which the
// alternation spreads over both targets but does not remove. --own-backend starts a FerretDB and a Redis of the bench's
// own instead (the same binaries and flags as scripts/services.sh, on free ports and temporary directories, stopped
// and deleted at the end), so that the backend's CPU is the targets' alone.
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { existsSync, rmSync, symlinkSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { MongoClient } from 'mongodb';
import { newId } from '../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents } from '../src/domain/event-chain.ts';
import { sharedBackend, startOwnBackend, stopOwnBackend, type Backend } from './backend.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks, machineJiffies, stopChild, type Child } from './growth/processes.ts';
import {
  benchService,
  cleanUpOnSignals,
  cpuProfileFlags,
  dropBenchData,
  MONGO_BASE,
  ROOT,
  startServiceProcesses,
  type BenchService,
} from './production-service.ts';
import type { HttpClient } from './growth/http-client.ts';
import { call, percentiles, quiesce, Refused, registerAgent, writeResults, type Caller } from './side-by-side.ts';

const arg = (name: string, fallback: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
};
const count = (name: string, fallback: number) => {
  const value = Number(arg(name, String(fallback)));
  if (!Number.isSafeInteger(value) || value < 1) throw new Error(`${name} must be a positive integer`);
  return value;
};
const BASELINE_REF = arg('--baseline', 'd77681e');
/** Both targets on the current build: the comparison's own noise. */
const TWINS = process.argv.includes('--twins');
/** A FerretDB and a Redis of the bench's own, instead of the shared ones. */
const OWN_BACKEND = process.argv.includes('--own-backend');
const CLIENTS = count('--clients', 4);
const FLOWS = {
  settle: count('--settle-flows', count('--flows', 150)),
  gate: count('--gate-flows', count('--flows', 300)),
};
type FlowKind = keyof typeof FLOWS;
/** Chunks per flow kind and target; they alternate between the targets. */
const CHUNKS = 6;
/** Uncounted flows per client, kind and target before anything is measured. */
const WARM_UP_FLOWS = 3;
/** How often a client asks whether the worker has done its part, and for how long at most. */
const POLL_EVERY_MS = 25;
const POLL_LIMIT_MS = 60_000;
/** Waiting for every process to go idle before a chunk: at most this long (FerretDB is shared with anything else). */
const QUIESCE_LIMIT_MS = 10_000;
/** The issue's bound on CPU per flow, current over baseline. */
const LIMIT_RATIO = 1.1;

const log = (line: string) => console.error(`[bench money ${new Date().toISOString().slice(11, 19)}] ${line}`);
const round = (x: number, digits = 2) => Number(x.toFixed(digits));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const git = (args: string[], cwd = ROOT) =>
  execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] })
    .toString()
    .trim();

// ---------------------------------------------------------------------------------------------------------------
// Builds

/** Where a target's dist/ comes from: a checkout (this one, or a worktree of the baseline) and its commit. */
interface Build {
  root: string;
  commit: string;
  /** Files that differ from `commit` in the working tree when it was built (the current checkout only). */
  uncommittedFiles?: number;
  ref?: string;
}

/**
 * `tsc -p tsconfig.build.json` in `root`, as buildService() runs it here, but with tsc's output on stderr: stdout
 * carries only the JSON, and a build that meets someone's half-saved file prints its errors.
 */
function compile(root: string): void {
  // Since the client package became a workspace, the service's build needs the package's dist first.
  if (existsSync(join(root, 'packages/client/scripts/build.mjs')))
    execFileSync(process.execPath, ['packages/client/scripts/build.mjs'], { cwd: root, stdio: ['ignore', 2, 2] });
  execFileSync(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], {
    cwd: root,
    stdio: ['ignore', 2, 2],
  });
}

/** This checkout, as it stands: others may be editing src/, so the build is whatever it holds now. */
function buildCurrent(): Build {
  log('building the current checkout: tsc -p tsconfig.build.json');
  // A file saved half-way through someone's edit fails the build; a later try usually finds it whole.
  for (let attempt = 1; ; attempt++) {
    try {
      compile(ROOT);
      break;
    } catch (err) {
      if (attempt >= 3) throw err;
      log(`build failed (${(err as Error).message.split('\n')[0]}); trying again in 20 s`);
      execFileSync('sleep', ['20']);
    }
  }
  // What was built: HEAD and the files under src/ that differed from it, read once the build is done.
  const commit = git(['rev-parse', 'HEAD']);
  const uncommittedFiles = git(['status', '--porcelain', '--untracked-files=all', '--', 'src'])
    .split('\n')
    .filter(Boolean).length;
  log(`built the current checkout: HEAD ${commit.slice(0, 7)}, ${uncommittedFiles} uncommitted file(s) under src/`);
  return { root: ROOT, commit, uncommittedFiles };
}

/** `ref` checked out in a worktree of its own under /tmp, node_modules linked from here, built there. */
function buildBaseline(ref: string): Build {
  const root = `/tmp/bench-baseline-${randomBytes(4).toString('hex')}`;
  const commit = git(['rev-parse', '--verify', `${ref}^{commit}`]);
  log(`baseline ${ref} (${commit.slice(0, 7)}): git worktree add --detach ${root}`);
  git(['worktree', 'add', '--detach', root, commit]);
  worktrees.push(root);
  symlinkSync(join(ROOT, 'node_modules'), join(root, 'node_modules'));
  log('building the baseline: tsc -p tsconfig.build.json');
  compile(root);
  return { root, commit, ref };
}

/** Removes a baseline worktree (and its dist/ and node_modules link); failures are logged, not thrown. */
function removeWorktree(root: string): void {
  try {
    git(['worktree', 'remove', '--force', root]);
  } catch (err) {
    log(`git worktree remove ${root} failed (${(err as Error).message.split('\n')[0]}); deleting it and pruning`);
    rmSync(root, { recursive: true, force: true });
    try {
      git(['worktree', 'prune']);
    } catch {
      // nothing more to do
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backend

// ---------------------------------------------------------------------------------------------------------------
// Targets

type Agent = Awaited<ReturnType<typeof registerAgent>>;

/** One service under test: its build, its own database, Redis prefix, processes, tenant and one pair per client. */
interface Target {
  name: 'current' | 'baseline' | 'twin';
  build: Build;
  service: BenchService;
  api: Child;
  worker: Child;
  http: HttpClient;
  token: string;
  /** One payer (funded) and one payee per client: the payee is the run's agent and signs its events. */
  pairs: Array<{ payer: string; payee: Agent }>;
}

const running = new Set<Child>();
const services: BenchService[] = [];
const worktrees: string[] = [];

/**
 * Stops the children, drops every target's database and Redis prefix (or stops the bench's own backend and deletes
 * it), removes the baseline's worktree.
 */
async function cleanup(): Promise<void> {
  for (const child of [...running]) await stopChild(child).catch(() => undefined);
  if (OWN_BACKEND) {
    services.splice(0);
    await stopOwnBackend();
  } else {
    const mongo = new MongoClient(MONGO_BASE, { serverSelectionTimeoutMS: 5_000 });
    for (const service of services.splice(0)) await dropBenchData(service, mongo, log);
    await mongo.close().catch(() => undefined);
  }
  for (const root of worktrees.splice(0)) removeWorktree(root);
}

async function startTarget(name: Target['name'], build: Build, backend: Backend): Promise<Target> {
  const service = benchService(`money${name}`);
  service.env.MONGO_URL = `${backend.mongoBase}/${service.dbName}`;
  service.env.REDIS_URL = backend.redisUrl;
  services.push(service);
  log(
    `${name}: ${build.root}/dist at ${build.commit.slice(0, 7)}; database ${service.dbName}, Redis prefix ${service.redisPrefix}; logs in ${service.logDir}`,
  );
  const { api, worker, http } = await startServiceProcesses(service, name, cpuProfileFlags(name), build.root);
  running.add(api).add(worker);
  const admin: Caller = { http, token: service.adminKey };
  const tenant = await call(admin, 'POST', '/ops/tenants', { name: 'bench-money' });
  const scopes = ['agents:write', 'runs:write', 'runs:read', 'x402:write', 'x402:read', 'wallets:write'];
  const tenantKey: Caller = {
    http,
    token: (await call(admin, 'POST', '/ops/api-keys', { tenantId: tenant.tenantId, scopes })).token,
  };
  const pairs = await Promise.all(
    Array.from({ length: CLIENTS }, async (_, i) => {
      const payer = await registerAgent(tenantKey, `payer${i}`);
      const payee = await registerAgent(tenantKey, `payee${i}`);
      await call(admin, 'POST', `/ops/wallets/${encodeURIComponent(payer.agentId)}/credit`, {
        amount: 1_000_000_000,
        currency: 'USD',
      });
      return { payer: payer.agentId, payee };
    }),
  );
  return { name, build, service, api, worker, http, token: tenantKey.token, pairs };
}

// ---------------------------------------------------------------------------------------------------------------
// Flows

/** A POST as a client sends it: with an Idempotency-Key of its own. */
const post = (t: Target, path: string, body: unknown, expect: number[]) =>
  call(t, 'POST', path, body, expect, { 'idempotency-key': randomUUID() });

/** GETs `path` every POLL_EVERY_MS until `done` holds of the answer; the number of GETs. */
async function poll(t: Target, path: string, done: (answer: any) => boolean): Promise<number> {
  const started = Date.now();
  for (let polls = 1; ; polls++) {
    if (done(await call(t, 'GET', path))) return polls;
    if (Date.now() - started > POLL_LIMIT_MS) throw new Error(`GET ${path}: not done after ${POLL_LIMIT_MS} ms`);
    await sleep(POLL_EVERY_MS);
  }
}

const requestSha = (seed: string) => createHash('sha256').update(`bench money ${seed}`).digest('hex');

/** A run with settlement terms, one passing metric event, finalized by the worker, settled by the worker. */
async function settleFlow(t: Target, client: number): Promise<number> {
  const { payer, payee } = t.pairs[client]!;
  const settlement = {
    payerAgentId: payer,
    amount: 1_000,
    currency: 'USD',
    holdbackBps: 0,
    disputeWindowSeconds: 3_600,
  };
  const { runId } = await post(
    t,
    '/v1/runs',
    { agentId: payee.agentId, terms: { accuracy: { min: 0.9 } }, settlement },
    [201],
  );
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
    EMPTY_HEAD,
    payee.privateKey,
    payee.keyId,
  );
  await post(t, `/v1/runs/${runId}/events`, { event }, [201]);
  await post(t, `/v1/runs/${runId}/finalize`, undefined, [202]);
  let polls = await poll(t, `/v1/runs/${runId}`, (run) => run.status === 'finalized');
  await post(t, `/v1/runs/${runId}/settle`, {}, [202]);
  polls += await poll(t, `/runs/${runId}/settlement`, (s) => {
    if (s.status !== 'pending' && s.status !== 'completed')
      throw new Error(`run ${runId}: settlement ${s.status}, not completed`);
    return s.status === 'completed';
  });
  return polls;
}

let gateSeq = 0;

/** A gate created, quoted, authorized and verified (its worker deciding when verify answers 202). */
async function gateFlow(t: Target, client: number): Promise<number> {
  const { payer, payee } = t.pairs[client]!;
  const seed = `${t.name} ${gateSeq++}`;
  const { gateId } = await post(
    t,
    '/x402/gate/create',
    {
      payerAgentId: payer,
      payeeAgentId: payee.agentId,
      amount: 1_000,
      currency: 'USD',
      holdbackBps: 1_000,
      disputeWindowSeconds: 3_600,
    },
    [201],
  );
  const { quoteId, requestSha256 } = await post(
    t,
    '/x402/gate/quote',
    { gateId, requestSha256: requestSha(seed) },
    [200],
  );
  await post(t, '/x402/gate/authorize-payment', { gateId, quoteId, requestSha256 }, [200]);
  const verified = await post(
    t,
    '/x402/gate/verify',
    { gateId, evidence: { responseSha256: requestSha(`response ${seed}`) } },
    [200, 202],
  );
  return verified.decision === null ? poll(t, `/x402/gate/${gateId}`, (gate) => gate.decision !== null) : 0;
}

const FLOW: Record<FlowKind, (t: Target, client: number) => Promise<number>> = { settle: settleFlow, gate: gateFlow };

/** One chunk: its flows' durations, polls, refusals, wall time and CPU ticks per watched process. */
interface Chunk {
  samples: number[];
  polls: number;
  failed: Record<string, number>;
  wallMs: number;
  ticks: Record<string, number>;
  /** Busy jiffies of the whole machine less the watched processes and this one: everything else that ran. */
  otherTicks: number;
}

/**
 * `flows` flows of one kind with CLIENTS clients at once, each client on its own pair. A flow the service refuses
 * (503, 429) is counted under `failed` by status and not timed; anything else wrong stops the benchmark.
 */
async function runChunk(t: Target, kind: FlowKind, flows: number, watched: Record<string, number>): Promise<Chunk> {
  const samples: number[] = [];
  const failed: Record<string, number> = {};
  let polls = 0;
  let next = 0;
  const ticksBefore = Object.values(watched).map(cpuTicks);
  const selfBefore = process.cpuUsage();
  const machineBefore = machineJiffies();
  const started = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(CLIENTS, flows) }, async (_, client) => {
      while (next++ < flows) {
        const flowStarted = performance.now();
        try {
          polls += await FLOW[kind](t, client);
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
    Object.entries(watched).map(([name, pid], i) => [name, cpuTicks(pid) - ticksBefore[i]!]),
  );
  const self = process.cpuUsage(selfBefore);
  const selfTicks = ((self.user + self.system) / 1e6) * CLOCK_TICKS_PER_SECOND;
  const machineAfter = machineJiffies();
  // /proc/stat counts in USER_HZ, the same unit as /proc/<pid>/stat.
  const otherTicks =
    machineAfter.busy - machineBefore.busy - Object.values(ticks).reduce((a, b) => a + b, 0) - selfTicks;
  return { samples, polls, failed, wallMs, ticks, otherTicks };
}

// ---------------------------------------------------------------------------------------------------------------
// Figures

const PROCESSES = ['api', 'worker', 'ferretdb', 'redis'] as const;

/** Per flow over all of a target's chunks of one kind. */
function summarize(chunks: Chunk[]) {
  const samples = chunks.flatMap((c) => c.samples);
  const flows = Math.max(1, samples.length);
  const failed: Record<string, number> = {};
  for (const c of chunks) for (const [k, v] of Object.entries(c.failed)) failed[k] = (failed[k] ?? 0) + v;
  const msPerFlow = (ticks: number, n = flows) => round(((ticks / CLOCK_TICKS_PER_SECOND) * 1000) / n);
  const ticksOf = (name: string) => chunks.reduce((sum, c) => sum + (c.ticks[name] ?? 0), 0);
  const cpuMsPerFlow: Record<string, number> = {};
  for (const name of PROCESSES) if (chunks.some((c) => name in c.ticks)) cpuMsPerFlow[name] = msPerFlow(ticksOf(name));
  cpuMsPerFlow.apiPlusWorker = msPerFlow(ticksOf('api') + ticksOf('worker'));
  cpuMsPerFlow.total = msPerFlow(PROCESSES.reduce((sum, name) => sum + ticksOf(name), 0));
  const { p50, p95, p99 } = percentiles(samples);
  return {
    flows: samples.length,
    ...(Object.keys(failed).length > 0 ? { failed } : {}),
    flowsPerSecond: round(samples.length / (chunks.reduce((sum, c) => sum + c.wallMs, 0) / 1000), 1),
    flowMs: { p50, p95, p99 },
    pollsPerFlow: round(chunks.reduce((sum, c) => sum + c.polls, 0) / flows),
    // Clock ticks (10 ms each) summed over every chunk: a resolution of 10 ms over all the flows of the target.
    cpuMsPerFlow,
    // The total per chunk, in the order run: how much it moves from one chunk to the next.
    totalCpuMsPerFlowByChunk: chunks.map((c) =>
      msPerFlow(
        PROCESSES.reduce((sum, name) => sum + (c.ticks[name] ?? 0), 0),
        Math.max(1, c.samples.length),
      ),
    ),
    // Everything else the machine ran meanwhile (other users' work, the other target's idle processes), per flow.
    otherMachineCpuMsPerFlow: msPerFlow(chunks.reduce((sum, c) => sum + c.otherTicks, 0)),
  };
}
type Summary = ReturnType<typeof summarize>;

/** second / first for throughput, latency and every CPU figure. */
function ratios(first: Summary, second: Summary) {
  const r = (a: number, b: number) => (a > 0 ? round(b / a) : null);
  return {
    flowsPerSecond: r(first.flowsPerSecond, second.flowsPerSecond),
    p50: r(first.flowMs.p50, second.flowMs.p50),
    p95: r(first.flowMs.p95, second.flowMs.p95),
    cpuMsPerFlow: Object.fromEntries(
      Object.keys(first.cpuMsPerFlow).map((k) => [k, r(first.cpuMsPerFlow[k]!, second.cpuMsPerFlow[k] ?? 0)]),
    ),
  };
}

// ---------------------------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const loadAtStart = loadavg().map((x) => round(x));
  log(
    `load average ${loadAtStart.join(' ')}; ${CLIENTS} clients, ${FLOWS.settle} settle and ${FLOWS.gate} gate flows per target${TWINS ? ', twins' : `, baseline ${BASELINE_REF}`}`,
  );
  cleanUpOnSignals(cleanup, log);
  // Children die with us (cleanUpOnSignals kills the service processes); so do the bench's own servers (backend.ts).
  try {
    const current = buildCurrent();
    const other = TWINS ? current : buildBaseline(BASELINE_REF);
    // The reference (the ratios' denominator) is the baseline, or with --twins the first of the twins.
    const backend = OWN_BACKEND ? await startOwnBackend(log) : sharedBackend();
    const reference = await startTarget(TWINS ? 'current' : 'baseline', TWINS ? current : other, backend);
    const candidate = await startTarget(TWINS ? 'twin' : 'current', current, backend);
    const targets = [candidate, reference];
    const { ferretdbPid, redisPid } = backend;
    if (!ferretdbPid || !redisPid)
      log(`FerretDB pid ${ferretdbPid ?? 'not found'}, Redis pid ${redisPid ?? 'not found'}: their CPU is left out`);
    const servicePids = [
      ...targets.flatMap((t) => [t.api.pid, t.worker.pid]),
      ...(ferretdbPid ? [ferretdbPid] : []),
      ...(redisPid ? [redisPid] : []),
    ];
    const watchedOf = (t: Target) => ({
      api: t.api.pid,
      worker: t.worker.pid,
      ...(ferretdbPid ? { ferretdb: ferretdbPid } : {}),
      ...(redisPid ? { redis: redisPid } : {}),
    });

    const results: Record<string, unknown> = {};
    const verdict: Record<string, unknown> = {};
    const quiesceWaits: number[] = [];
    for (const kind of ['settle', 'gate'] as const) {
      log(`${kind}: warming up (${WARM_UP_FLOWS} flows per client and target, uncounted)`);
      for (const t of targets) await runChunk(t, kind, WARM_UP_FLOWS * CLIENTS, {});
      const chunks = new Map<Target, Chunk[]>(targets.map((t) => [t, []]));
      const chunkSize = Math.ceil(FLOWS[kind] / CHUNKS);
      log(`${kind}: ${FLOWS[kind]} flows per target in chunks of ${chunkSize}, alternating`);
      for (let done = 0, k = 0; done < FLOWS[kind]; done += chunkSize, k++) {
        // A B, B A, A B, ...: neither target always runs right after the other.
        for (const t of k % 2 === 0 ? targets : [...targets].reverse()) {
          quiesceWaits.push(await quiesce(servicePids, QUIESCE_LIMIT_MS));
          const chunk = await runChunk(t, kind, Math.min(chunkSize, FLOWS[kind] - done), watchedOf(t));
          chunks.get(t)!.push(chunk);
          const total = PROCESSES.reduce((sum, name) => sum + (chunk.ticks[name] ?? 0), 0);
          log(
            `${kind} chunk ${k + 1} ${t.name}: ${chunk.samples.length} flows in ${round(chunk.wallMs / 1000, 1)} s, ${round(((total / CLOCK_TICKS_PER_SECOND) * 1000) / Math.max(1, chunk.samples.length), 1)} CPU ms per flow`,
          );
        }
      }
      const ref = summarize(chunks.get(reference)!);
      const cand = summarize(chunks.get(candidate)!);
      const ratio = ratios(ref, cand);
      results[kind] = {
        [candidate.name]: cand,
        [reference.name]: ref,
        [`${candidate.name}Over${reference.name[0]!.toUpperCase()}${reference.name.slice(1)}`]: ratio,
      };
      const totalRatio = ratio.cpuMsPerFlow.total ?? null;
      verdict[kind] = { totalCpuRatio: totalRatio, withinLimit: totalRatio !== null && totalRatio <= LIMIT_RATIO };
    }

    const out = {
      benchmark: 'money-side-by-side',
      at: new Date().toISOString(),
      node: process.version,
      mode: TWINS ? 'twins: both targets run the current build' : `current checkout against ${BASELINE_REF}`,
      builds: {
        [candidate.name]: {
          commit: candidate.build.commit,
          ...(candidate.build.uncommittedFiles !== undefined
            ? { uncommittedFilesUnderSrc: candidate.build.uncommittedFiles }
            : {}),
        },
        [reference.name]: {
          commit: reference.build.commit,
          ...(reference.build.ref ? { ref: reference.build.ref } : {}),
          ...(reference.build.uncommittedFiles !== undefined
            ? { uncommittedFilesUnderSrc: reference.build.uncommittedFiles }
            : {}),
        },
      },
      limit: `CPU per flow (total of API, worker, FerretDB and Redis), ${candidate.name} over ${reference.name}, at most ${LIMIT_RATIO}x`,
      verdict,
      setup: {
        processes:
          'each target: node dist/main.js api + node dist/main.js worker (NODE_ENV=production, production node flags, compiled by tsc -p tsconfig.build.json in its own checkout), on a database and Redis prefix of its own; the load client is the bench process (keep-alive HTTP on 127.0.0.1)',
        flows: {
          settle:
            'POST /v1/runs (settlement: 1000 USD, holdbackBps 0) -> POST events (one signed metric, accuracy 1) -> POST finalize -> poll GET /v1/runs/:id until finalized -> POST settle -> poll GET /runs/:id/settlement until completed',
          gate: 'POST /x402/gate/create (1000 USD, holdbackBps 1000) -> quote -> authorize-payment -> verify, then poll GET /x402/gate/:id until decided when verify answered 202',
          idempotency: 'every POST carries an Idempotency-Key of its own',
          pollEveryMs: POLL_EVERY_MS,
        },
        clients: CLIENTS,
        flowsPerTarget: FLOWS,
        chunks: `${CHUNKS} chunks per flow kind and target, alternating between the targets (A B, B A, ...), each starting once every API, worker, FerretDB and Redis is idle (under 5% of a core over 0.5 s; at most ${QUIESCE_LIMIT_MS / 1000} s); waited ${round(quiesceWaits.reduce((a, b) => a + b, 0) / 1000, 1)} s in all, ${quiesceWaits.filter((ms) => ms >= QUIESCE_LIMIT_MS).length} of ${quiesceWaits.length} waits hit the limit`,
        cpu: 'utime + stime from /proc/<pid>/stat before and after each chunk, per process; FerretDB and Redis serve both targets, and their ticks in a chunk go to the target that ran it',
        warmUp: `${WARM_UP_FLOWS} uncounted flows per client, kind and target before the kind is measured`,
        backend: OWN_BACKEND
          ? "a FerretDB (SQLite) and a Redis of the bench's own (started as scripts/services.sh starts the shared ones, on free loopback ports), serving only the two targets"
          : 'the shared FerretDB (SQLite) on 127.0.0.1:27027 and Redis on 127.0.0.1:6390, which also serve whatever else runs on this machine (see otherMachineCpuMsPerFlow)',
        machine: {
          cpus: cpus().length,
          loadAverageAtStart: loadAtStart,
          loadAverageAtEnd: loadavg().map((x) => round(x)),
        },
      },
      ...results,
    };
    const file = join(
      ROOT,
      `bench/results/money-side-by-side${TWINS ? '-twins' : ''}${OWN_BACKEND ? '-own-backend' : ''}.json`,
    );
    writeResults(file, out, log);
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
