// Latency of the x402 hot path over real HTTP: create, quote, authorize-payment and verify, with 1 and with 50
// concurrent clients, beside two ceilings measured in the same run at the same concurrency: a bare Fastify route (in
// a child process of its own) and a raw driver findOne({_id}) (from this process). Prints JSON (also written to
// bench/results/x402.json, or x402-seeded.json with --seed-gates).
//
// The service runs as production runs it, as in the growth bench (bench/growth.ts): `tsc -p tsconfig.build.json`,
// then `node dist/main.js api` and `node dist/main.js worker` as child processes (NODE_ENV=production) on a database
// and Redis prefix of their own, dropped at the end (also on Ctrl-C). This process is only the load client (keep-alive
// HTTP on 127.0.0.1), so at 50 clients its own work no longer shares a core's event loop with the service's.
//
// `node --import tsx bench/x402.ts [--ops N] [--seed-gates N] [--seed-flows N] [--clients 1,50]`: --seed-gates stores
// N gates first (whole flows through the same service code the API uses, run from this process against the same
// database and Redis prefix, the child worker deciding them; then clones of their records) to show that cost follows
// the work, not the data. Needs the local services (FerretDB 27027, Redis 6390); stops by itself.
// BENCH_CPU_PROF=<dir> makes the API and worker write .cpuprofile files there.
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { MongoClient } from 'mongodb';
import { loadConfig } from '../src/config.ts';
import { generateEd25519KeyPair } from '../src/domain/crypto.ts';
import { createLogger } from '../src/logger.ts';
import { connectRuntime, createRuntime } from '../src/runtime.ts';
import { X402Service } from '../src/services/x402.ts';
import { HttpClient } from './growth/http-client.ts';
import { benchService, buildService, cleanUpOnSignals, CPU_PROF_DIR, cpuProfileFlags, dropBenchData, MONGO_BASE, ROOT, startBareFastify, startServiceProcesses } from './production-service.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks, pidOfServer, stopChild, type Child } from './growth/processes.ts';

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
};
const OPS = arg('--ops', 300);
const SEED_GATES = arg('--seed-gates', 0);
/** Gates seeded through the service (whole flows); the rest of --seed-gates are clones of their records. */
const SEED_REAL_FLOWS = arg('--seed-flows', 1_000);
/** What a paid call adds to: every collection that grows with gates (due-work and head caches excepted). */
const SEEDED_COLLECTIONS = [
  'x402_gates', 'x402_quotes', 'x402_quote_slots', 'x402_gate_commitments', 'x402_verifications', 'x402_agent_gates',
  'ledger_entries', 'ledger_postings', 'settlements', 'settlement_facts', 'outbox_events',
];
const CONCURRENCY = (process.argv.includes('--clients') ? process.argv[process.argv.indexOf('--clients') + 1]! : '1,50').split(',').map(Number);

const service = benchService('x402');
const { dbName, redisPrefix, adminKey, logDir } = service;
const serviceEnv = service.env;

const log = (line: string) => console.error(`[bench x402 ${new Date().toISOString().slice(11, 19)}] ${line}`);

async function startService(): Promise<{ api: Child; worker: Child; http: HttpClient; port: number }> {
  return startServiceProcesses(service, 'x402', cpuProfileFlags('x402'));
}

class Refused extends Error {}

/**
 * Waits until the service's processes are idle (under 5% of a core each over half a second; at most `limitMs`), so
 * that what a measurement times is not the tail of the previous one (the worker fans out webhook events after verify).
 */
async function quiesce(pids: number[], limitMs = 30_000): Promise<number> {
  const started = Date.now();
  while (Date.now() - started < limitMs) {
    const before = pids.map(cpuTicks);
    await new Promise((r) => setTimeout(r, 500));
    const busiest = Math.max(...pids.map((pid, i) => cpuTicks(pid) - before[i]!));
    if (busiest / CLOCK_TICKS_PER_SECOND / 0.5 < 0.05) break;
  }
  return Date.now() - started;
}

function percentiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (p: number) => Number(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!.toFixed(2));
  return { n: sorted.length, p50: at(50), p95: at(95), p99: at(99) };
}

/**
 * Runs `ops` calls of `work(i)` with `clients` callers at once; the latency of each call in ms. A call the service
 * refuses (say a 503 from the request deadline under load) is counted under `failed` by status, not timed, and the
 * later steps of that gate are skipped; anything else stops the benchmark.
 */
async function measure(clients: number, ops: number, work: (i: number) => Promise<unknown>, skip: Set<number>, watched: Record<string, number> = {}) {
  const samples: number[] = [];
  const ticksBefore = Object.values(watched).map(cpuTicks);
  // Profiles' sample times are on the same monotonic clock: the window lets a reader cut out one step.
  const windowStartUs = process.hrtime.bigint() / 1000n;
  const failed: Record<string, number> = {};
  let next = 0;
  await Promise.all(
    Array.from({ length: clients }, async () => {
      for (let i = next++; i < ops; i = next++) {
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
  // CPU each service process spent per timed call (clock ticks, so ±10 ms over the whole step): where the time went.
  const cpuMsPerCall = Object.fromEntries(
    Object.entries(watched).map(([name, pid], i) => [name, Number((((cpuTicks(pid) - ticksBefore[i]!) / CLOCK_TICKS_PER_SECOND) * 1000 / Math.max(1, samples.length)).toFixed(2))]),
  );
  if (CPU_PROF_DIR && Object.keys(watched).length > 0) log(`profile window of this step (monotonic µs): ${windowStartUs}..${process.hrtime.bigint() / 1000n}`);
  return { ...percentiles(samples), ...(Object.keys(failed).length > 0 ? { failed } : {}), ...(Object.keys(watched).length > 0 ? { cpuMsPerCall } : {}) };
}

const requestSha = (i: number) => createHash('sha256').update(`bench request ${i}`).digest('hex');

/** Stops the children, then drops the benchmark's database and Redis keys. */
async function cleanup(mongo: MongoClient): Promise<void> {
  for (const child of [...running]) await stopChild(child).catch(() => undefined);
  await dropBenchData(service, mongo, log);
}

const running = new Set<Child>();

async function main(): Promise<void> {
  const loadAtStart = loadavg().map((x) => Number(x.toFixed(2)));
  log(`database ${dbName}, Redis prefix ${redisPrefix}; child logs in ${logDir}; load average ${loadAtStart.join(' ')}`);
  log('building: tsc -p tsconfig.build.json');
  buildService();

  // The same pool size as the service's own client (src/store/mongo.ts), so the driver ceiling is the service's.
  const mongo = new MongoClient(`${MONGO_BASE}/${dbName}`, { maxPoolSize: 50 });
  cleanUpOnSignals(() => cleanup(mongo), log);

  try {
    await mongo.connect();
    const service = await startService();
    running.add(service.api).add(service.worker);
    const bare = await startBareFastify(logDir);
    running.add(bare.child);
    const { http } = service;

    class Rejected extends Error {}
    const call = async (method: string, path: string, token: string, body?: unknown, expect = [200, 201]) => {
      const res = await http.request(method, path, { token, body });
      if (res.status === 503 || res.status === 429) throw new Refused(String(res.status));
      if (!expect.includes(res.status)) throw new Rejected(`${method} ${path} -> ${res.status} ${res.text.slice(0, 300)}`);
      return JSON.parse(res.text);
    };

    const ferretdbPid = pidOfServer(27027, [join(ROOT, '.data/ferretdb.pid')]);
    const redisPid = pidOfServer(6390, [join(ROOT, '.data/redis.pid')]);
    const tenant = await call('POST', '/ops/tenants', adminKey, { name: 'bench' });
    const token = (await call('POST', '/ops/api-keys', adminKey, { tenantId: tenant.tenantId, scopes: ['agents:write', 'x402:write', 'wallets:write'] })).token;
    // One payer and one payee per client, as independent agents paying for their own calls would be.
    const pairs = await Promise.all(
      Array.from({ length: Math.max(...CONCURRENCY) }, async (_, i) => {
        const agent = async (name: string) => (await call('POST', '/v1/agents', token, { name: `${name}${i}`, publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url') })).agentId as string;
        const payer = await agent('payer');
        const payee = await agent('payee');
        await call('POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, adminKey, { amount: 1_000_000_000, currency: 'USD' });
        return { payer, payee };
      }),
    );

    let seedSeconds: number | null = null;
    if (SEED_GATES > 0) {
      // Whole flows through the service code (create, quote, authorize, verify decided by the child worker) for the
      // first gates, from a runtime of this process on the same database and Redis prefix; then their records cloned
      // under other ids until every collection a gate grows holds SEED_GATES gates' worth: cost follows the stored
      // data only if a request reads more of a larger collection, and the clones are never read.
      const started = Date.now();
      const config = loadConfig({ ...serviceEnv, LOG_LEVEL: 'warn' });
      const runtime = createRuntime(config, createLogger(config, 'bench-seed'));
      try {
        await connectRuntime(runtime);
        const seeder = new X402Service(runtime);
        const real = Math.min(SEED_GATES, SEED_REAL_FLOWS);
        for (let done = 0; done < real; done += pairs.length) {
          await Promise.all(pairs.slice(0, Math.min(pairs.length, real - done)).map(async (p, k) => {
            const sha = requestSha(1e9 + done + k);
            const { gate } = await seeder.createGate(tenant.tenantId, { payerAgentId: p.payer, payeeAgentId: p.payee, amount: 1, currency: 'USD' });
            const { quote } = await seeder.quote(tenant.tenantId, { gateId: gate._id, requestSha256: sha });
            await seeder.authorizePayment(tenant.tenantId, { gateId: gate._id, quoteId: quote._id, requestSha256: sha });
            await seeder.verify(tenant.tenantId, { gateId: gate._id, evidence: { responseSha256: sha } });
          }));
        }
        await seeder.close();
        const copies = Math.ceil(SEED_GATES / real) - 1;
        for (const name of SEEDED_COLLECTIONS) {
          const collection = runtime.db.collection<{ _id: string }>(name);
          const docs = await collection.find({}).toArray();
          for (let copy = 1; copy <= copies; copy++) {
            // settlements are unique by runId (which holds the gate id): the clones get their own.
            const clones = docs.map((d) => ({ ...d, _id: `${d._id}~seed${copy}`, ...('runId' in d ? { runId: `${String(d.runId)}~seed${copy}` } : {}) }));
            for (let i = 0; i < clones.length; i += 1_000) await collection.insertMany(clones.slice(i, i + 1_000), { ordered: false });
          }
        }
        seedSeconds = Math.round((Date.now() - started) / 1000);
        log(`seeded ${real} gates through the service and ${copies} clones of each of their records in ${seedSeconds} s`);
      } finally {
        await runtime.close();
      }
    }

    const probe = mongo.db(dbName).collection<{ _id: string }>('bench_probe');
    await probe.insertOne({ _id: 'probe' });
    const results: Record<string, unknown> = {};
    for (const clients of CONCURRENCY) {
      const ops = clients === 1 ? Math.ceil(OPS / 2) : OPS;
      log(`${clients} client(s), ${ops} paid calls`);
      const gates: string[] = [];
      const quotes: Array<{ quoteId: string; requestSha256: string }> = [];
      const pairOf = (i: number) => pairs[i % clients]!;
      const skip = new Set<number>();
      // FerretDB too: after seeding, SQLite's checkpoint of what was just written runs on for a while.
      const servicePids = [service.api.pid, service.worker.pid, ...(ferretdbPid ? [ferretdbPid] : [])];
      const watched = { api: service.api.pid, worker: service.worker.pid, ...(ferretdbPid ? { ferretdb: ferretdbPid } : {}), ...(redisPid ? { redis: redisPid } : {}) };
      log(`waited ${Math.round((await quiesce(servicePids, SEED_GATES > 0 ? 180_000 : 30_000)) / 1000)} s for the API, worker and FerretDB to go idle`);
      const create = await measure(clients, ops, async (i) => {
        const p = pairOf(i);
        gates[i] = (await call('POST', '/x402/gate/create', token, { payerAgentId: p.payer, payeeAgentId: p.payee, amount: 1_000, currency: 'USD', holdbackBps: 1_000, disputeWindowSeconds: 3_600 })).gateId;
      }, skip, watched);
      // Each step is timed on its own: the worker's tail of the previous step (its webhook events) is not counted in it.
      await quiesce(servicePids);
      const quote = await measure(clients, ops, async (i) => {
        quotes[i] = await call('POST', '/x402/gate/quote', token, { gateId: gates[i], requestSha256: requestSha(i) });
      }, skip, watched);
      await quiesce(servicePids);
      const authorize = await measure(clients, ops, (i) => call('POST', '/x402/gate/authorize-payment', token, { gateId: gates[i], quoteId: quotes[i]!.quoteId, requestSha256: quotes[i]!.requestSha256 }), skip, watched);
      let undecided = 0;
      await quiesce(servicePids);
      const verify = await measure(clients, ops, async (i) => {
        const res = await call('POST', '/x402/gate/verify', token, { gateId: gates[i], evidence: { responseSha256: requestSha(-i) } }, [200, 202]);
        if (res.decision === null) undecided++;
      }, skip, watched);
      await quiesce(servicePids);
      // The ceilings are warmed like the service was (its sockets and pool were opened while the agents were set up):
      // a first round at this concurrency opens the connections and is not counted.
      const barePing = async () => {
        const res = await bare.http.request('GET', '/ok');
        if (res.status !== 200) throw new Error(`bare route -> ${res.status}`);
      };
      const findProbe = async () => {
        if (!(await probe.findOne({ _id: 'probe' }))) throw new Error('raw findOne found nothing');
      };
      await measure(clients, clients * 2, barePing, new Set());
      const bareRoute = await measure(clients, ops, barePing, new Set());
      await measure(clients, clients * 2, findProbe, new Set());
      const findById = await measure(clients, ops, findProbe, new Set());
      results[`clients_${clients}`] = { ops, create, quote, authorizePayment: authorize, verify: { ...verify, answered202: undecided }, ceiling: { bareFastifyRoute: bareRoute, driverFindOneById: findById } };
    }
    const out = {
      benchmark: 'x402-hot-path',
      at: new Date().toISOString(),
      node: process.version,
      seededGates: SEED_GATES,
      setup: {
        processes: 'service as production runs it: node dist/main.js api + node dist/main.js worker (NODE_ENV=production, compiled by tsc -p tsconfig.build.json), each a child process; the load client is the bench process (keep-alive HTTP on 127.0.0.1)',
        ceilings: 'bareFastifyRoute: one Fastify route in a child process of its own, called like the API; driverFindOneById: raw driver findOne({_id}) from the bench process (pool of 50, as the service); both at the same concurrency, in the same run, after an uncounted round that opens their connections; every measurement starts once the API and worker are idle (the worker fans out webhook events after verify)',
        backend: 'FerretDB 1.24 (SQLite) on 127.0.0.1:27027, Redis on 127.0.0.1:6390, own database and Redis prefix (dropped at the end)',
        seeding: SEED_GATES > 0 ? `whole flows through the service code from the bench process (the child worker deciding), then clones of their records; ${seedSeconds} s` : null,
        machine: { cpus: cpus().length, loadAverageAtStart: loadAtStart, loadAverageAtEnd: loadavg().map((x) => Number(x.toFixed(2))) },
      },
      latencyMs: results,
    };
    const file = join(ROOT, `bench/results/${SEED_GATES > 0 ? 'x402-seeded' : 'x402'}.json`);
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
    console.log(JSON.stringify(out, null, 2));
    log(`written to ${file}`);
  } finally {
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
