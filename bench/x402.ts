// Latency of the x402 hot path over real HTTP: create, quote, authorize-payment and verify, with 1 and with 50
// concurrent clients, beside two ceilings measured in the same run at the same concurrency: a bare Fastify route (in
// a child process of its own) and a raw driver findOne({_id}) (from this process). Prints JSON (also written to
// bench/results/x402.json; x402-seeded.json with --seed-gates, x402-twin.json with --twins).
//
// The service runs as production runs it, as in the growth bench (bench/growth.ts): `tsc -p tsconfig.build.json`,
// then `node dist/main.js api` and `node dist/main.js worker` as child processes (NODE_ENV=production) on a database
// and Redis prefix of their own, dropped at the end (also on Ctrl-C). This process is only the load client (keep-alive
// HTTP on 127.0.0.1), so at 50 clients its own work no longer shares a core's event loop with the service's.
//
// `node --import tsx bench/x402.ts [--ops N] [--seed-gates N] [--seed-flows N] [--clients 1,50]`: --seed-gates runs a
// second service beside the first, on a database that holds N gates (whole flows through the same service code the
// API uses, run from this process against that database and Redis prefix, its worker deciding them; then clones of
// their records), alternates every step between the two in chunks, and prints each figure's ratio: cost follows the
// work, not the data, and the shared machine's drift falls on both alike. --twins runs the second service unseeded:
// the ratios a run shows when nothing differs. Needs the local services (FerretDB 27027, Redis 6390); stops by itself.
// BENCH_CPU_PROF=<dir> makes the APIs and workers write .cpuprofile files there.
import { createHash } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { MongoClient, type Collection } from 'mongodb';
import { loadConfig } from '../src/config.ts';
import { createLogger } from '../src/logger.ts';
import { connectRuntime, createRuntime } from '../src/runtime.ts';
import { X402Service } from '../src/services/x402/service.ts';
import { HttpClient } from './growth/http-client.ts';
import {
  benchService,
  buildService,
  cleanUpOnSignals,
  CPU_PROF_DIR,
  cpuProfileFlags,
  dropBenchData,
  MONGO_BASE,
  ROOT,
  startBareFastify,
  startServiceProcesses,
  type BenchService,
} from './production-service.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks, pidOfServer, stopChild, type Child } from './growth/processes.ts';
import { call, percentiles, quiesce, Refused, registerAgent, writeResults, type Caller } from './side-by-side.ts';

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
};
const OPS = arg('--ops', 1_200);
const SEED_GATES = arg('--seed-gates', 0);
/** A second, unseeded target alternating with the first: the comparison's own noise (what a ratio of 1 looks like). */
const TWINS = process.argv.includes('--twins');
/** Gates seeded through the service (whole flows); the rest of --seed-gates are clones of their records. */
const SEED_REAL_FLOWS = arg('--seed-flows', 1_000);
/** What a paid call adds to: every collection that grows with gates (due-work and head caches excepted). */
const SEEDED_COLLECTIONS = [
  'x402_gates',
  'x402_quotes',
  'x402_quote_slots',
  'x402_gate_commitments',
  'x402_verifications',
  'x402_agent_gates',
  'ledger_entries',
  'ledger_postings',
  'settlements',
  'settlement_facts',
  'outbox_events',
];
/** Uncounted whole flows per client pair before anything is measured. */
const WARM_UP_ROUNDS = 3;
/** Chunks per step and target (they alternate between the targets with --seed-gates or --twins). */
const CHUNKS = 6;
const CONCURRENCY = (process.argv.includes('--clients') ? process.argv[process.argv.indexOf('--clients') + 1]! : '1,50')
  .split(',')
  .map(Number);

const log = (line: string) => console.error(`[bench x402 ${new Date().toISOString().slice(11, 19)}] ${line}`);

/** One chunk's latencies, refusals and service CPU (clock ticks per watched process). */
interface Chunk {
  samples: number[];
  failed: Record<string, number>;
  ticks: Record<string, number>;
}

/**
 * Runs calls `from..to-1` of `work(i)` with `clients` callers at once; the latency of each call in ms. A call the
 * service refuses (say a 503 from the request deadline under load) is counted under `failed` by status, not timed,
 * and the later steps of that gate are skipped; anything else stops the benchmark.
 */
async function runChunk(
  clients: number,
  from: number,
  to: number,
  work: (i: number) => Promise<unknown>,
  skip: Set<number>,
  watched: Record<string, number> = {},
): Promise<Chunk> {
  const samples: number[] = [];
  const ticksBefore = Object.values(watched).map(cpuTicks);
  // Profiles' sample times are on the same monotonic clock: the window lets a reader cut out one chunk.
  const windowStartUs = process.hrtime.bigint() / 1000n;
  const failed: Record<string, number> = {};
  let next = from;
  await Promise.all(
    Array.from({ length: clients }, async () => {
      for (let i = next++; i < to; i = next++) {
        if (skip.has(i)) continue;
        const started = performance.now();
        try {
          await work(i);
        } catch (err) {
          if (!(err instanceof Refused)) throw err;
          failed[err.message] = (failed[err.message] ?? 0) + 1;
          skip.add(i);
          continue;
        }
        samples.push(performance.now() - started);
      }
    }),
  );
  const ticks = Object.fromEntries(
    Object.entries(watched).map(([name, pid], i) => [name, cpuTicks(pid) - ticksBefore[i]!]),
  );
  if (CPU_PROF_DIR && Object.keys(watched).length > 0)
    log(`profile window (monotonic µs): ${windowStartUs}..${process.hrtime.bigint() / 1000n}`);
  return { samples, failed, ticks };
}

/** Percentiles over all chunks of one step, its refusals, and the CPU each service process spent per timed call. */
function summarize(chunks: Chunk[]) {
  const samples = chunks.flatMap((c) => c.samples);
  const failed: Record<string, number> = {};
  const ticks: Record<string, number> = {};
  for (const c of chunks) {
    for (const [k, v] of Object.entries(c.failed)) failed[k] = (failed[k] ?? 0) + v;
    for (const [k, v] of Object.entries(c.ticks)) ticks[k] = (ticks[k] ?? 0) + v;
  }
  // Clock ticks, so ±10 ms over the whole step: where the time went, not a precise figure.
  const cpuMsPerCall = Object.fromEntries(
    Object.entries(ticks).map(([name, t]) => [
      name,
      Number((((t / CLOCK_TICKS_PER_SECOND) * 1000) / Math.max(1, samples.length)).toFixed(2)),
    ]),
  );
  return {
    ...percentiles(samples),
    ...(Object.keys(failed).length > 0 ? { failed } : {}),
    ...(Object.keys(ticks).length > 0 ? { cpuMsPerCall } : {}),
  };
}

/** second / first for every percentile of every step and ceiling. */
function ratios(first: Record<string, unknown>, second: Record<string, unknown>): Record<string, unknown> {
  const walk = (a: unknown, b: unknown): unknown => {
    if (typeof a !== 'object' || a === null || typeof b !== 'object' || b === null) return undefined;
    const x = a as Record<string, unknown>;
    const y = b as Record<string, unknown>;
    if (typeof x.p50 === 'number' && typeof y.p50 === 'number') {
      return Object.fromEntries(
        (['p50', 'p95', 'p99'] as const).map((p) => [p, Number(((y[p] as number) / (x[p] as number)).toFixed(2))]),
      );
    }
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(x)) {
      const r = walk(x[key], y[key]);
      if (r !== undefined) out[key] = r;
    }
    return Object.keys(out).length > 0 ? out : undefined;
  };
  return (walk(first, second) ?? {}) as Record<string, unknown>;
}

const requestSha = (i: number) => createHash('sha256').update(`bench request ${i}`).digest('hex');

/** One service under test: its own database, Redis prefix, API and worker processes, tenant and agents. */
interface Target {
  name: 'empty' | 'seeded' | 'twin';
  service: BenchService;
  api: Child;
  worker: Child;
  http: HttpClient;
  token: string;
  tenantId: string;
  pairs: Array<{ payer: string; payee: string }>;
  /** The database's own probe document, for the raw driver ceiling. */
  probe: Collection<{ _id: string }>;
}

const running = new Set<Child>();
const services: BenchService[] = [];
const mongoClients: MongoClient[] = [];

/** Stops the children, then drops every benchmark database and Redis prefix. */
async function cleanup(): Promise<void> {
  for (const child of [...running]) await stopChild(child).catch(() => undefined);
  for (const [i, service] of services.entries()) await dropBenchData(service, mongoClients[i] ?? null, log);
  for (const client of mongoClients) await client.close().catch(() => undefined);
}

/** Starts a service on a database of its own and gives it a tenant, a key and one payer/payee pair per client. */
async function startTarget(name: Target['name']): Promise<Target> {
  const service = benchService(`x402${name === 'empty' ? '' : name}`);
  services.push(service);
  // The same pool size as the service's own client (src/store/mongo.ts), so the driver ceiling is the service's.
  const mongo = new MongoClient(`${MONGO_BASE}/${service.dbName}`, { maxPoolSize: 50 });
  mongoClients.push(mongo);
  await mongo.connect();
  log(`${name}: database ${service.dbName}, Redis prefix ${service.redisPrefix}; child logs in ${service.logDir}`);
  const { api, worker, http } = await startServiceProcesses(service, name, cpuProfileFlags(`x402-${name}`));
  running.add(api).add(worker);
  const admin: Caller = { http, token: service.adminKey };
  const tenant = await call(admin, 'POST', '/ops/tenants', { name: 'bench' });
  const tenantKey: Caller = {
    http,
    token: (
      await call(admin, 'POST', '/ops/api-keys', {
        tenantId: tenant.tenantId,
        scopes: ['agents:write', 'x402:write', 'wallets:write'],
      })
    ).token,
  };
  const probe = mongo.db(service.dbName).collection<{ _id: string }>('bench_probe');
  await probe.insertOne({ _id: 'probe' });
  // One payer and one payee per client, as independent agents paying for their own calls would be.
  const pairs = await Promise.all(
    Array.from({ length: Math.max(...CONCURRENCY) }, async (_, i) => {
      const agent = async (role: string) => (await registerAgent(tenantKey, `${role}${i}`)).agentId;
      const payer = await agent('payer');
      const payee = await agent('payee');
      await call(admin, 'POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, {
        amount: 1_000_000_000,
        currency: 'USD',
      });
      return { payer, payee };
    }),
  );
  return { name, service, api, worker, http, token: tenantKey.token, tenantId: tenant.tenantId, pairs, probe };
}

/** Uncounted whole flows, so that no measured step pays for compiling its code. */
async function warmUp(target: Target): Promise<void> {
  await Promise.all(
    target.pairs.map(async (p, k) => {
      for (let round = 0; round < WARM_UP_ROUNDS; round++) {
        const sha = requestSha(2e9 + round * target.pairs.length + k);
        const { gateId } = await call(target, 'POST', '/x402/gate/create', {
          payerAgentId: p.payer,
          payeeAgentId: p.payee,
          amount: 1,
          currency: 'USD',
        });
        const { quoteId } = await call(target, 'POST', '/x402/gate/quote', { gateId, requestSha256: sha });
        await call(target, 'POST', '/x402/gate/authorize-payment', { gateId, quoteId, requestSha256: sha });
        await call(target, 'POST', '/x402/gate/verify', { gateId, evidence: { responseSha256: sha } }, [200, 202]);
      }
    }),
  );
}

/**
 * Stores SEED_GATES gates in the target's database; the seconds it took. Whole flows through the service code
 * (create, quote, authorize, verify decided by the target's worker) for the first gates, from a runtime of this
 * process on the same database and Redis prefix; then the records of every stored gate cloned under other ids until
 * every collection a gate grows holds SEED_GATES gates' worth: cost follows the stored data only if a request reads
 * more of a larger collection, and the clones are never read.
 */
async function seed(target: Target): Promise<number> {
  const started = Date.now();
  const config = loadConfig({ ...target.service.env, LOG_LEVEL: 'warn' });
  const runtime = createRuntime(config, createLogger(config, 'bench-seed'));
  try {
    await connectRuntime(runtime);
    const seeder = new X402Service(runtime);
    const { pairs, tenantId } = target;
    const real = Math.min(SEED_GATES, SEED_REAL_FLOWS);
    for (let done = 0; done < real; done += pairs.length) {
      await Promise.all(
        pairs.slice(0, Math.min(pairs.length, real - done)).map(async (p, k) => {
          const sha = requestSha(1e9 + done + k);
          const { gate } = await seeder.gates.createGate(tenantId, {
            payerAgentId: p.payer,
            payeeAgentId: p.payee,
            amount: 1,
            currency: 'USD',
          });
          const { quote } = await seeder.quotes.quote(tenantId, { gateId: gate._id, requestSha256: sha });
          await seeder.authorization.authorizePayment(tenantId, {
            gateId: gate._id,
            quoteId: quote._id,
            requestSha256: sha,
          });
          await seeder.verification.verify(tenantId, { gateId: gate._id, evidence: { responseSha256: sha } });
        }),
      );
    }
    await seeder.close();
    // As many clones of every stored gate's records as make SEED_GATES gates in all.
    const stored = await runtime.db.collection('x402_gates').countDocuments();
    const copies = Math.max(0, Math.ceil(SEED_GATES / stored) - 1);
    for (const name of SEEDED_COLLECTIONS) {
      const collection = runtime.db.collection<{ _id: string }>(name);
      const docs = await collection.find({}).toArray();
      for (let copy = 1; copy <= copies; copy++) {
        // settlements are unique by runId (which holds the gate id): the clones get their own.
        const clones = docs.map((d) => ({
          ...d,
          _id: `${d._id}~seed${copy}`,
          ...('runId' in d ? { runId: `${String(d.runId)}~seed${copy}` } : {}),
        }));
        for (let i = 0; i < clones.length; i += 1_000)
          await collection.insertMany(clones.slice(i, i + 1_000), { ordered: false });
      }
    }
    const seconds = Math.round((Date.now() - started) / 1000);
    log(
      `seeded ${real} gates through the service, then ${copies} clones of the records of each of the ${stored} gates stored, in ${seconds} s`,
    );
    return seconds;
  } finally {
    await runtime.close();
  }
}

async function main(): Promise<void> {
  const loadAtStart = loadavg().map((x) => Number(x.toFixed(2)));
  log(`load average ${loadAtStart.join(' ')}`);
  log('building: tsc -p tsconfig.build.json');
  buildService();
  cleanUpOnSignals(cleanup, log);

  try {
    // With --seed-gates, a second service runs beside the first on a database that holds SEED_GATES gates (with
    // --twins, on an empty one), and every step alternates between the two in chunks: the shared machine's speed
    // drifts by more than the 1.3x being checked within minutes, and alternating puts both under the same drift.
    const targets = [
      await startTarget('empty'),
      ...(SEED_GATES > 0 ? [await startTarget('seeded')] : TWINS ? [await startTarget('twin')] : []),
    ];
    const bare = await startBareFastify(targets[0]!.service.logDir);
    running.add(bare.child);
    const ferretdbPid = pidOfServer(27027, [join(ROOT, '.data/ferretdb.pid')]);
    const redisPid = pidOfServer(6390, [join(ROOT, '.data/redis.pid')]);
    const seeded = targets.find((t) => t.name === 'seeded');
    const second = targets[1];
    const seedSeconds = seeded ? await seed(seeded) : null;
    for (const target of targets) await warmUp(target);

    // Every process of every target: each chunk starts with all of them idle (the worker fans out webhook events after
    // verify; after seeding, SQLite's checkpoint of what was written runs on for a while).
    const servicePids = [...targets.flatMap((t) => [t.api.pid, t.worker.pid]), ...(ferretdbPid ? [ferretdbPid] : [])];
    const watchedOf = (t: Target) => ({
      api: t.api.pid,
      worker: t.worker.pid,
      ...(ferretdbPid ? { ferretdb: ferretdbPid } : {}),
      ...(redisPid ? { redis: redisPid } : {}),
    });
    log(
      `waited ${Math.round((await quiesce(servicePids, seeded ? 180_000 : 30_000)) / 1000)} s for the service processes and FerretDB to go idle`,
    );

    const results = new Map<Target, Record<string, unknown>>(targets.map((t) => [t, {}]));
    for (const clients of CONCURRENCY) {
      const ops = clients === 1 ? Math.ceil(OPS / 2) : OPS;
      // A chunk keeps every client busy for at least two calls, or it would not measure this concurrency.
      const chunkSize = Math.max(Math.ceil(ops / CHUNKS), clients * 2);
      log(`${clients} client(s), ${ops} paid calls per target, in chunks of ${chunkSize}`);
      const state = new Map(
        targets.map((t) => [
          t,
          {
            gates: [] as string[],
            quotes: [] as Array<{ quoteId: string; requestSha256: string }>,
            skip: new Set<number>(),
            undecided: 0,
          },
        ]),
      );
      /** One step: its chunks alternate between the targets, each chunk starting with every process idle. */
      const step = async (work: (t: Target, i: number) => Promise<unknown>, watch = true) => {
        const chunks = new Map<Target, Chunk[]>(targets.map((t) => [t, []]));
        for (let from = 0, k = 0; from < ops; from += chunkSize, k++) {
          // A B, B A, A B, ...: neither target always runs right after the other.
          for (const t of k % 2 === 0 ? targets : [...targets].reverse()) {
            await quiesce(servicePids);
            chunks
              .get(t)!
              .push(
                await runChunk(
                  clients,
                  from,
                  Math.min(ops, from + chunkSize),
                  (i) => work(t, i),
                  state.get(t)!.skip,
                  watch ? watchedOf(t) : {},
                ),
              );
          }
        }
        return new Map(targets.map((t) => [t, summarize(chunks.get(t)!)]));
      };
      const pairOf = (t: Target, i: number) => t.pairs[i % clients]!;
      const create = await step(async (t, i) => {
        const p = pairOf(t, i);
        state.get(t)!.gates[i] = (
          await call(t, 'POST', '/x402/gate/create', {
            payerAgentId: p.payer,
            payeeAgentId: p.payee,
            amount: 1_000,
            currency: 'USD',
            holdbackBps: 1_000,
            disputeWindowSeconds: 3_600,
          })
        ).gateId;
      });
      const quote = await step(async (t, i) => {
        const s = state.get(t)!;
        s.quotes[i] = await call(t, 'POST', '/x402/gate/quote', { gateId: s.gates[i], requestSha256: requestSha(i) });
      });
      const authorize = await step((t, i) => {
        const s = state.get(t)!;
        return call(t, 'POST', '/x402/gate/authorize-payment', {
          gateId: s.gates[i],
          quoteId: s.quotes[i]!.quoteId,
          requestSha256: s.quotes[i]!.requestSha256,
        });
      });
      const verify = await step(async (t, i) => {
        const s = state.get(t)!;
        const res = await call(
          t,
          'POST',
          '/x402/gate/verify',
          { gateId: s.gates[i], evidence: { responseSha256: requestSha(-i) } },
          [200, 202],
        );
        // A 202 may already carry the decision (recorded, its money still moving): undecided is the gate's status.
        if (!['released', 'refunded', 'expired'].includes(res.status)) s.undecided++;
      });
      // The ceilings are warmed like the service was (its sockets and pool were opened while the agents were set up):
      // a first round at this concurrency opens the connections and is not counted. The raw driver reads each
      // target's own database.
      const barePing = async () => {
        const res = await bare.http.request('GET', '/ok');
        if (res.status !== 200) throw new Error(`bare route -> ${res.status}`);
      };
      const findProbe = async (t: Target) => {
        if (!(await t.probe.findOne({ _id: 'probe' }))) throw new Error('raw findOne found nothing');
      };
      await runChunk(clients, 0, clients * 2, barePing, new Set());
      for (const t of targets) await runChunk(clients, 0, clients * 2, () => findProbe(t), new Set());
      const bareRoute = summarize([await runChunk(clients, 0, ops, barePing, new Set())]);
      const findById = await step((t) => findProbe(t), false);
      for (const t of targets) {
        results.get(t)![`clients_${clients}`] = {
          ops,
          create: create.get(t),
          quote: quote.get(t),
          authorizePayment: authorize.get(t),
          verify: { ...verify.get(t)!, answered202: state.get(t)!.undecided },
          ceiling: { bareFastifyRoute: bareRoute, driverFindOneById: findById.get(t) },
        };
      }
    }

    const empty = results.get(targets[0]!)!;
    const out = {
      benchmark: 'x402-hot-path',
      at: new Date().toISOString(),
      node: process.version,
      seededGates: SEED_GATES,
      setup: {
        processes:
          'service as production runs it: node dist/main.js api + node dist/main.js worker (NODE_ENV=production, compiled by tsc -p tsconfig.build.json), each a child process; the load client is the bench process (keep-alive HTTP on 127.0.0.1)',
        ceilings:
          "bareFastifyRoute: one Fastify route in a child process of its own, called like the API; driverFindOneById: raw driver findOne({_id}) from the bench process on the target's database (pool of 50, as the service); both at the same concurrency, in the same run, after an uncounted round that opens their connections",
        chunks: `each step runs in ${CHUNKS} chunks per target (at least two calls per client each), each starting once every service process is idle (the worker fans out webhook events after verify); with a second target the chunks alternate between the two (A B, B A, ...)`,
        warmUp: `${WARM_UP_ROUNDS} uncounted whole flows per client pair and target before anything is measured`,
        backend:
          'FerretDB 1.24 (SQLite) on 127.0.0.1:27027, Redis on 127.0.0.1:6390, a database and Redis prefix per target (dropped at the end)',
        seeding: seeded
          ? `a second service on a database of its own, seeded before the warm-up: whole flows through the service code from the bench process (its worker deciding), then clones of their records, until ${SEED_GATES} gates were stored; ${seedSeconds} s`
          : null,
        machine: {
          cpus: cpus().length,
          loadAverageAtStart: loadAtStart,
          loadAverageAtEnd: loadavg().map((x) => Number(x.toFixed(2))),
        },
      },
      latencyMs: empty,
      // The second target (seeded, or an unseeded twin) and each of its figures over the first's.
      ...(second
        ? {
            [`${second.name}LatencyMs`]: results.get(second),
            [`${second.name}OverEmpty`]: ratios(empty, results.get(second)!),
          }
        : {}),
    };
    const file = join(ROOT, `bench/results/${second ? `x402-${second.name}` : 'x402'}.json`);
    writeResults(file, out, log);
  } finally {
    await cleanup();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
