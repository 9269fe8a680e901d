// Paid calls at agent speed (issue 23): one paid call through a payment session (one request), against the
// four-request gate flow and the metered gate flow, beside two ceilings measured in the same run: bare Fastify (the
// framework alone) and "raw drivers" (a bare Fastify route doing what a durable session charge must at least do: one
// Redis script and one MongoDB insert, with the official drivers). Prints JSON (also bench/results/x402-sessions.json).
//
//   node --import tsx bench/x402-sessions.ts [--seconds 8] [--clients 32] [--gate-flows 120] [--gate-clients 8] [--own-backend]
//
// The service runs as production does (bench/production-service.ts: `node dist/main.js api` and `worker`). Per phase
// the bench reads /proc/<pid>/stat of the API, the worker, FerretDB and Redis, and reports CPU ms per call of each and
// their total, with this load generator's own CPU beside (it shares the machine). Phases:
//   saturation: `--clients` closed-loop callers, each charging its own session, for `--seconds`: calls/s and CPU;
//   open loop:  calls sent at half the saturation rate on a fixed schedule for `--seconds`; latency is counted from
//               each call's scheduled time (no coordinated omission): p50/p95/p99;
//   gate:       `--gate-flows` four-request gate flows (create, quote, authorize-payment, verify; poll while 202);
//   metered:    the same flows, verify charging a part of the authorized amount (the rest goes back at once); the
//               two kinds run in four alternating rounds each (gate, metered, metered, gate, ...), summed per kind;
//   ceilings:   the two ceilings, closed loop, `--clients` callers, `--seconds` each;
//   settld:     the original service's own four-request x402 paid call (bench/settld.ts: its in-memory store, from a
//               checkout of its mirror under /tmp), closed loop, `--clients` callers, `--seconds` (--no-settld: skip).
// --own-backend starts a FerretDB and a Redis of the bench's own (bench/backend.ts), so their CPU is this bench's
// alone; otherwise the shared ones (scripts/services.sh) are used and other work on them is counted too.
// Loopback only; stops by itself.
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { cpus, loadavg } from 'node:os';
import { MongoClient } from 'mongodb';
import { sharedBackend, startOwnBackend, stopOwnBackend, type Backend } from './backend.ts';
import { HttpClient } from './growth/http-client.ts';
import {
  CLOCK_TICKS_PER_SECOND,
  cpuTicks,
  startChild,
  stopChild,
  waitHealthy,
  type Child,
} from './growth/processes.ts';
import {
  benchService,
  buildService,
  cleanUpOnSignals,
  cpuProfileFlags,
  dropBenchData,
  freePort,
  MONGO_BASE,
  ROOT,
  startBareFastify,
  startServiceProcesses,
  type BenchService,
} from './production-service.ts';
import { startSettld, type Settld } from './settld.ts';
import { call, percentiles, positiveArg, quiesce, registerAgent, writeResults, type Caller } from './side-by-side.ts';

const SECONDS = positiveArg('--seconds', 8);
const CLIENTS = positiveArg('--clients', 32);
const GATE_FLOWS = positiveArg('--gate-flows', 120);
const GATE_CLIENTS = positiveArg('--gate-clients', 8);
/** The gate and metered flows run in this many alternating rounds each. */
const GATE_ROUNDS = 4;
const OWN_BACKEND = process.argv.includes('--own-backend');
const SETTLD = !process.argv.includes('--no-settld');
const log = (line: string) => process.stderr.write(`[x402-sessions] ${line}\n`);
const round = (x: number, digits = 2) => Number(x.toFixed(digits));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha = (s: string) => createHash('sha256').update(s).digest('hex');

type Watched = Record<string, number>;
type Measured = { value: number[]; cpuMs: Record<string, number>; wallMs: number };

/** Adds a phase's latencies, CPU and wall time to a kind's running sum. */
function addMeasured(sum: Measured, phase: Measured): void {
  sum.value.push(...phase.value);
  sum.wallMs += phase.wallMs;
  for (const [k, ms] of Object.entries(phase.cpuMs)) sum.cpuMs[k] = (sum.cpuMs[k] ?? 0) + ms;
}

/** CPU ticks of each watched process and of this one, around `work`. */
async function measured<T>(
  watched: Watched,
  work: () => Promise<T>,
): Promise<{ value: T; cpuMs: Record<string, number>; wallMs: number }> {
  const before = Object.fromEntries(Object.entries(watched).map(([k, pid]) => [k, cpuTicks(pid)]));
  const self = process.cpuUsage();
  const started = performance.now();
  const value = await work();
  const wallMs = performance.now() - started;
  const cpuMs: Record<string, number> = {};
  for (const [k, pid] of Object.entries(watched))
    cpuMs[k] = ((cpuTicks(pid) - before[k]!) * 1000) / CLOCK_TICKS_PER_SECOND;
  const used = process.cpuUsage(self);
  cpuMs.loadGenerator = (used.user + used.system) / 1000;
  return { value, cpuMs, wallMs };
}

/** CPU ms per operation of each process, their total (the load generator apart), rounded. */
function perOperation(cpuMs: Record<string, number>, operations: number) {
  const per: Record<string, number> = {};
  let total = 0;
  for (const [k, ms] of Object.entries(cpuMs)) {
    per[k] = round(ms / operations, 3);
    if (k !== 'loadGenerator') total += ms / operations;
  }
  return { ...per, total: round(total, 3) };
}

/** Closed loop: `clients` callers calling back to back for `seconds`; latencies and how many answered 2xx. */
async function closedLoop(clients: number, seconds: number, once: (client: number) => Promise<number>) {
  const stopAt = performance.now() + seconds * 1000;
  const latencies: number[] = [];
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      while (performance.now() < stopAt) latencies.push(await once(client));
    }),
  );
  return latencies;
}

/** Open loop: one call every 1/rate s for `seconds`, whatever the answers; latency from each call's scheduled time. */
async function openLoop(rate: number, seconds: number, once: (i: number) => Promise<void>) {
  const total = Math.floor(rate * seconds);
  const started = performance.now();
  const latencies: number[] = [];
  const slow: number[] = [];
  const inFlight: Array<Promise<void>> = [];
  for (let i = 0; i < total; i++) {
    const due = started + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 1) await sleep(wait);
    inFlight.push(
      once(i).then(() => {
        const ms = performance.now() - due;
        latencies.push(ms);
        if (ms >= SLOW_MS) slow.push(due - started);
      }),
    );
  }
  await Promise.all(inFlight);
  return Object.assign(latencies, { stalls: stallsOf(slow) });
}

/** A call at least this slow is the tail the open-loop target is about (its p99 must stay under 25 ms). */
const SLOW_MS = 25;

/**
 * Where the slow calls of an open loop were scheduled: in how many 100 ms windows, and the largest share of them in
 * one window. Slow calls bunched into a few windows mean something stalled every call in flight at once (a GC pause,
 * a database checkpoint); spread evenly they mean the calls queue behind each other (too little CPU).
 */
function stallsOf(slowDueMs: number[]) {
  const windows = new Map<number, number>();
  for (const at of slowDueMs) windows.set(Math.floor(at / 100), (windows.get(Math.floor(at / 100)) ?? 0) + 1);
  const sizes = [...windows.values()].sort((a, b) => b - a);
  return {
    slowCalls: slowDueMs.length,
    windows100ms: windows.size,
    largestWindow: sizes[0] ?? 0,
    top5Windows: sizes.slice(0, 5),
  };
}

/** The raw-driver ceiling: what a durable session charge must at least do, with nothing else (no auth, no checks). */
async function startRawDrivers(backend: Backend, service: BenchService): Promise<{ child: Child; http: HttpClient }> {
  const port = await freePort();
  const code = `import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { MongoClient } from 'mongodb';
const redis = new Redis(${JSON.stringify(backend.redisUrl)});
const mongo = new MongoClient(${JSON.stringify(`${backend.mongoBase}/${service.dbName}_raw`)});
const charges = mongo.db().collection('charges');
const DEBIT = "local s = redis.call('HINCRBY', KEYS[1], 'spent', ARGV[1]) redis.call('HSET', KEYS[2], ARGV[2], s) return s";
const app = Fastify({ logger: false });
app.get('/ok', async () => ({ ok: true }));
app.post('/charge', async (req) => {
  const { session, paymentId, amount } = req.body;
  const seq = await redis.eval(DEBIT, 2, '${service.redisPrefix}:raw:' + session, '${service.redisPrefix}:rawp:' + session, String(amount), paymentId);
  await charges.insertOne({ _id: session + '#' + seq, paymentId, amount, at: new Date() });
  return { seq };
});
await app.listen({ host: '127.0.0.1', port: ${port} });
process.on('SIGTERM', () => app.close().then(() => Promise.all([redis.quit(), mongo.close()])).then(() => process.exit(0)));`;
  const child = startChild(
    'raw-drivers',
    ['--input-type=module', '-e', code],
    { PATH: process.env.PATH ?? '' },
    join(service.logDir, 'raw-drivers.log'),
    ROOT,
  );
  await waitHealthy(child, `http://127.0.0.1:${port}/ok`);
  return { child, http: new HttpClient(port) };
}

const children: Child[] = [];
let service: BenchService | null = null;
let settld: Settld | null = null;

/** Settld's paid call, closed loop like the session's, with its process's CPU; or why it could not run here. */
async function measureSettld() {
  if (!SETTLD) return { skipped: '--no-settld' };
  try {
    settld = await startSettld(log);
    await settld.prepare(CLIENTS);
    const once = async (client: number) => {
      const started = performance.now();
      await settld!.paidCall(client);
      return performance.now() - started;
    };
    await closedLoop(CLIENTS, 2, once);
    await quiesce([settld.pid]);
    const run = await measured({ settld: settld.pid }, () => closedLoop(CLIENTS, SECONDS, once));
    return {
      calls: run.value.length,
      callsPerSecond: round(run.value.length / (run.wallMs / 1000), 1),
      latency: percentiles(run.value),
      cpuMsPerCall: perOperation(run.cpuMs, run.value.length),
    };
  } catch (err) {
    log(`settld skipped: ${(err as Error).message}`);
    return { skipped: (err as Error).message.slice(0, 300) };
  }
}

async function cleanup(): Promise<void> {
  await settld?.stop().catch(() => undefined);
  settld = null;
  for (const child of children.splice(0)) await stopChild(child).catch(() => undefined);
  if (OWN_BACKEND) await stopOwnBackend();
  else if (service) {
    const mongo = new MongoClient(MONGO_BASE, { serverSelectionTimeoutMS: 5_000 });
    await dropBenchData(service, mongo, log);
    await mongo
      .db(`${service.dbName}_raw`)
      .dropDatabase()
      .catch(() => undefined);
    await mongo.close().catch(() => undefined);
  }
}

async function main(): Promise<void> {
  cleanUpOnSignals(cleanup, log);
  log(
    `load average ${loadavg()
      .map((x) => round(x))
      .join(' ')}; ${cpus().length} CPUs; ${CLIENTS} clients, ${SECONDS} s per phase, ${GATE_FLOWS} gate flows`,
  );
  buildService();
  const backend = OWN_BACKEND ? await startOwnBackend(log) : sharedBackend();
  service = benchService('sessions');
  service.env.MONGO_URL = `${backend.mongoBase}/${service.dbName}`;
  service.env.REDIS_URL = backend.redisUrl;
  const { api, worker, http } = await startServiceProcesses(service, 'sessions', cpuProfileFlags('sessions'));
  children.push(api, worker);
  const watched: Watched = {
    api: api.pid,
    worker: worker.pid,
    ...(backend.ferretdbPid ? { ferretdb: backend.ferretdbPid } : {}),
    ...(backend.redisPid ? { redis: backend.redisPid } : {}),
  };
  const admin: Caller = { http, token: service.adminKey };

  const tenant = await call(admin, 'POST', '/ops/tenants', { name: 'bench' });
  const token = (
    await call(admin, 'POST', '/ops/api-keys', { tenantId: tenant.tenantId, scopes: ['agents:write', 'x402:write'] })
  ).token as string;
  const caller: Caller = { http, token };
  const payee = (await registerAgent(caller, 'tool')).agentId;
  const payers = await Promise.all(
    Array.from({ length: Math.max(CLIENTS, GATE_CLIENTS) }, async (_, i) => {
      const payer = (await registerAgent(caller, `payer${i}`)).agentId;
      await call(admin, 'POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, {
        amount: 1_000_000_000,
        currency: 'USD',
      });
      return payer;
    }),
  );
  const sessions = await Promise.all(
    payers.slice(0, CLIENTS).map(async (payer) => {
      const s = await call(
        caller,
        'POST',
        '/x402/sessions',
        {
          payerAgentId: payer,
          payeeAgentIds: [payee],
          currency: 'USD',
          budget: 100_000_000,
          maxPerCall: 100,
          ttlSeconds: 3_600,
        },
        [201],
        { 'idempotency-key': randomUUID() },
      );
      return s.sessionId as string;
    }),
  );
  let failures = 0;
  const charge = async (client: number) => {
    const res = await http.request('POST', `/x402/sessions/${sessions[client]!}/charges`, {
      token,
      body: { paymentId: randomUUID(), payeeAgentId: payee, amount: 3, requestSha256: sha(String(Math.random())) },
    });
    if (res.status !== 201) {
      failures++;
      if (failures < 5) log(`charge -> ${res.status} ${res.text.slice(0, 200)}`);
    }
    return res.ms;
  };
  const pids = Object.values(watched);

  // Warm-up, uncounted.
  await closedLoop(CLIENTS, 2, charge);
  await quiesce(pids);

  log('session: saturation');
  const saturation = await measured(watched, () => closedLoop(CLIENTS, SECONDS, charge));
  const saturationRate = saturation.value.length / (saturation.wallMs / 1000);
  await quiesce(pids);

  const openRate = saturationRate / 2;
  log(`session: open loop at ${round(openRate, 1)}/s`);
  const open = await measured(watched, () =>
    openLoop(openRate, SECONDS, async (i) => void (await charge(i % CLIENTS))),
  );
  await quiesce(pids);

  // The gate flows: create, quote, authorize-payment, verify (charging all, or a part when metered); poll while 202.
  let seq = 0;
  const gateFlow = async (client: number, metered: boolean) => {
    const started = performance.now();
    const seed = `${seq++} ${randomBytes(4).toString('hex')}`;
    const { gateId } = await call(
      caller,
      'POST',
      '/x402/gate/create',
      {
        payerAgentId: payers[client]!,
        payeeAgentId: payee,
        amount: 1_000,
        currency: 'USD',
        holdbackBps: 1_000,
        disputeWindowSeconds: 3_600,
      },
      [201],
      { 'idempotency-key': randomUUID() },
    );
    const { quoteId, requestSha256 } = await call(
      caller,
      'POST',
      '/x402/gate/quote',
      { gateId, requestSha256: sha(seed) },
      [200],
      { 'idempotency-key': randomUUID() },
    );
    await call(caller, 'POST', '/x402/gate/authorize-payment', { gateId, quoteId, requestSha256 }, [200], {
      'idempotency-key': randomUUID(),
    });
    const verified = await call(
      caller,
      'POST',
      '/x402/gate/verify',
      { gateId, evidence: { responseSha256: sha(`response ${seed}`) }, ...(metered ? { amount: 370 } : {}) },
      [200, 202],
      { 'idempotency-key': randomUUID() },
    );
    for (let decided = verified.decision !== null; !decided;) {
      await sleep(20);
      decided = (await call(caller, 'GET', `/x402/gate/${gateId}`)).decision !== null;
    }
    return performance.now() - started;
  };
  const flows = async (metered: boolean, count: number) => {
    const latencies: number[] = [];
    let next = 0;
    await Promise.all(
      Array.from({ length: GATE_CLIENTS }, async (_, client) => {
        while (next++ < count) latencies.push(await gateFlow(client, metered));
      }),
    );
    return latencies;
  };
  await flows(false, GATE_FLOWS); // warm-up
  await quiesce(pids);
  // The two kinds in alternating rounds (gate then metered, metered then gate, ...), so that the machine's drift over
  // the phases falls on both alike: run one after the other, their ratio moved by a tenth between runs of one build.
  const gate: Measured = { value: [], cpuMs: {}, wallMs: 0 };
  const metered: Measured = { value: [], cpuMs: {}, wallMs: 0 };
  let meteredFailed = false;
  for (let r = 0; r < GATE_ROUNDS; r++) {
    const count = Math.floor(GATE_FLOWS / GATE_ROUNDS) + (r < GATE_FLOWS % GATE_ROUNDS ? 1 : 0);
    for (const kind of r % 2 === 0 ? (['gate', 'metered'] as const) : (['metered', 'gate'] as const)) {
      if (kind === 'metered' && meteredFailed) continue;
      log(`${kind === 'gate' ? 'gate' : 'metered gate'} flows, round ${r + 1} of ${GATE_ROUNDS}`);
      if (kind === 'gate') addMeasured(gate, await measured(watched, () => flows(false, count)));
      else {
        const phase = await measured(watched, () =>
          flows(true, count).catch((err: Error) => (log(`metered flows failed: ${err.message}`), null)),
        );
        if (phase.value) addMeasured(metered, { ...phase, value: phase.value });
        else meteredFailed = true;
      }
      await quiesce(pids);
    }
  }
  if (meteredFailed) metered.value = [];

  log('ceilings');
  const bare = await startBareFastify(service.logDir);
  const raw = await startRawDrivers(backend, service);
  children.push(bare.child, raw.child);
  const bareWatched = { fastify: bare.child.pid };
  const bareRun = await measured(bareWatched, () =>
    closedLoop(CLIENTS, SECONDS, async () => (await bare.http.request('GET', '/ok')).ms),
  );
  await quiesce([bare.child.pid, ...pids]);
  const rawWatched = {
    fastify: raw.child.pid,
    ...(backend.ferretdbPid ? { ferretdb: backend.ferretdbPid } : {}),
    ...(backend.redisPid ? { redis: backend.redisPid } : {}),
  };
  const rawRun = await measured(rawWatched, () =>
    closedLoop(
      CLIENTS,
      SECONDS,
      async (client) =>
        (
          await raw.http.request('POST', '/charge', {
            body: { session: `s${client}`, paymentId: randomUUID(), amount: 3 },
          })
        ).ms,
    ),
  );

  await quiesce([raw.child.pid, bare.child.pid, ...pids]);
  // The same open loop against the least a durable charge needs: the tail this backend and machine give any server.
  const rawOpen = await measured(rawWatched, () =>
    openLoop(
      openRate,
      SECONDS,
      async (i) =>
        void (await raw.http.request('POST', '/charge', {
          body: { session: `s${i % CLIENTS}`, paymentId: randomUUID(), amount: 3 },
        })),
    ),
  );

  await quiesce([raw.child.pid, bare.child.pid, ...pids]);
  log('settld');
  const settldRun = await measureSettld();
  const settldRate = 'callsPerSecond' in settldRun ? settldRun.callsPerSecond! : null;
  const settldCpu = 'cpuMsPerCall' in settldRun ? settldRun.cpuMsPerCall!.total : null;

  const sessionCpu = perOperation(saturation.cpuMs, saturation.value.length);
  const gateCpu = perOperation(gate.cpuMs, gate.value.length);
  const meteredCpu = metered.value.length > 0 ? perOperation(metered.cpuMs, metered.value.length) : null;
  const rawRate = rawRun.value.length / (rawRun.wallMs / 1000);
  const openLatency = percentiles(open.value);
  const out = {
    bench: 'x402-sessions',
    at: new Date().toISOString(),
    machine: { cpus: cpus().length, loadAverageAtEnd: loadavg().map((x) => round(x)) },
    backend: OWN_BACKEND ? 'own (bench/backend.ts)' : 'shared (scripts/services.sh)',
    options: { seconds: SECONDS, clients: CLIENTS, gateFlows: GATE_FLOWS, gateClients: GATE_CLIENTS },
    session: {
      saturation: {
        calls: saturation.value.length,
        callsPerSecond: round(saturationRate, 1),
        latency: percentiles(saturation.value),
        cpuMsPerCall: sessionCpu,
      },
      openLoop: {
        ratePerSecond: round(openRate, 1),
        calls: open.value.length,
        latency: openLatency,
        stalls: open.value.stalls,
        cpuMsPerCall: perOperation(open.cpuMs, open.value.length),
      },
      failures,
    },
    gateFlow: {
      flows: gate.value.length,
      flowsPerSecond: round(gate.value.length / (gate.wallMs / 1000), 1),
      latency: percentiles(gate.value),
      cpuMsPerFlow: gateCpu,
    },
    meteredFlow: meteredCpu
      ? {
          flows: metered.value.length,
          flowsPerSecond: round(metered.value.length / (metered.wallMs / 1000), 1),
          latency: percentiles(metered.value),
          cpuMsPerFlow: meteredCpu,
        }
      : null,
    ceilings: {
      bareFastify: {
        requestsPerSecond: round(bareRun.value.length / (bareRun.wallMs / 1000), 1),
        latency: percentiles(bareRun.value),
        cpuMsPerRequest: perOperation(bareRun.cpuMs, bareRun.value.length),
      },
      rawDrivers: {
        callsPerSecond: round(rawRate, 1),
        latency: percentiles(rawRun.value),
        cpuMsPerCall: perOperation(rawRun.cpuMs, rawRun.value.length),
        openLoopAtSessionRate: {
          ratePerSecond: round(openRate, 1),
          latency: percentiles(rawOpen.value),
          stalls: rawOpen.value.stalls,
          cpuMsPerCall: perOperation(rawOpen.cpuMs, rawOpen.value.length),
        },
      },
    },
    settld: settldRun,
    ratios: {
      sessionCpuOverGateFlowCpu: round(sessionCpu.total / gateCpu.total, 3),
      sessionCpuOverRawDriversCpu: round(sessionCpu.total / perOperation(rawRun.cpuMs, rawRun.value.length).total, 3),
      sessionRateOverRawDriversRate: round(saturationRate / rawRate, 3),
      meteredCpuOverGateFlowCpu: meteredCpu ? round(meteredCpu.total / gateCpu.total, 3) : null,
      sessionRateOverSettldRate: settldRate ? round(saturationRate / settldRate, 3) : null,
      sessionCpuOverSettldCpu: settldCpu ? round(sessionCpu.total / settldCpu, 3) : null,
    },
    targets: {
      sessionCpuAtMost5Ms: sessionCpu.total <= 5,
      sessionAtLeast400PerSecond: saturationRate >= 400,
      sessionAtLeastSettldRate: settldRate ? saturationRate >= settldRate : null,
      openLoopP99Under25Ms: openLatency.p99 < 25,
      rawDriversOpenLoopP99Under25Ms: percentiles(rawOpen.value).p99 < 25,
      meteredAtMostGateFlow: meteredCpu ? meteredCpu.total <= gateCpu.total : null,
    },
  };
  writeResults(join(ROOT, `bench/results/x402-sessions${OWN_BACKEND ? '-own-backend' : ''}.json`), out, log);
}

try {
  await main();
} finally {
  await cleanup();
}
process.exit(0);
