// Diagnostic for the runs path (issue 8): per operation, the MongoDB commands and Redis commands one request sends,
// how many of them are sequential ("waves": times the in-flight count rises from zero, i.e. round trips on the
// critical path), latency at 1 and 16 clients over real HTTP, and a CPU profile of exactly the measured window
// (node:inspector, so start-up is not in it) summarised as self time by function and by module.
// The API runs in this process (production settings, logs to stdout: redirect it), so the client's HTTP code shows
// in the profiles too; events are signed before each window.
//   node --import tsx bench/growth/runs-path.ts [--events 10000] [--prof-dir /tmp/prof] > /dev/null
// Needs the local services; uses its own database and Redis prefix, dropped at the end.
import { randomBytes } from 'node:crypto';
import { writeFileSync, mkdirSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import type { CommandStartedEvent } from 'mongodb';
import { loadConfig } from '../../src/config.ts';
import { generateEd25519KeyPair, newId, privateKeyToPem } from '../../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents, type ChainHead, type EventEnvelope } from '../../src/domain/event-chain.ts';
import { buildApp } from '../../src/http/app.ts';
import { createLogger } from '../../src/logger.ts';
import { connectRuntime, createRuntime } from '../../src/runtime.ts';
import { finalizeRun } from '../../src/services/runs.ts';
import { concurrently, HttpClient, summarize } from './http-client.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks, pidOfServer } from './processes.ts';

const arg = (name: string, fallback: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : fallback;
};
const EVENTS = Number(arg('--events', '10000'));
const PROF_DIR = arg('--prof-dir', '');
const TOP = Number(arg('--top', '18'));
const out = (line: string) => process.stderr.write(`${line}\n`);

const suffix = randomBytes(4).toString('hex');
const adminKey = randomBytes(32).toString('base64url');
const config = loadConfig({
  NODE_ENV: 'production',
  MONGO_COMMAND_MONITORING: 'true', // this diagnostic counts the commands each request sends
  HOST: '127.0.0.1',
  PORT: '0',
  MONGO_URL: `mongodb://127.0.0.1:27027/bench_rp_${suffix}`,
  REDIS_URL: 'redis://127.0.0.1:6390',
  REDIS_PREFIX: `benchrp${suffix}`,
  SERVICE_ADMIN_KEY: adminKey,
  SERVICE_SIGNING_KEY: privateKeyToPem(generateEd25519KeyPair().privateKey),
  WEBHOOK_SECRET_KEY: randomBytes(32).toString('base64'),
  BUYER_SESSION_SECRET: randomBytes(32).toString('base64'),
  RATE_LIMIT_MAX: '10000000',
  // The deadline answers 503 when a command waits > 400 ms, which a loaded 2-core machine reaches under 16 clients.
  REQUEST_DEADLINE_MS: '10000',
});
const runtime = createRuntime(config, createLogger(config, 'api'));
await connectRuntime(runtime);
const app = await buildApp(runtime);
await app.listen({ host: '127.0.0.1', port: 0 });
const http = new HttpClient((app.server.address() as AddressInfo).port);

// MongoDB commands and waves.
let mongoSeen: string[] = [];
let mongoMs = 0;
let inFlight = 0;
let waves = 0;
runtime.mongo.on('commandStarted', (e: CommandStartedEvent) => {
  mongoSeen.push(`${e.commandName} ${String(e.command[e.commandName])}`);
  if (inFlight++ === 0) waves++;
});
const settle = (e: { duration: number }) => {
  inFlight = Math.max(0, inFlight - 1);
  mongoMs += e.duration;
};
runtime.mongo.on('commandSucceeded', settle);
runtime.mongo.on('commandFailed', settle);
const ferretPid = pidOfServer(27027, ['/work/main/.data/ferretdb.pid']);
// Redis commands naming our prefix, seen by MONITOR on a connection of its own.
const monitorClient = new Redis(config.redisUrl);
const monitor = await monitorClient.monitor();
let redisSeen: string[] = [];
monitor.on('monitor', (_time: string, args: string[]) => {
  if (args.some((a) => a.includes(config.redisPrefix)) && args[0] !== 'monitor') redisSeen.push(args[0]!.toLowerCase());
});
const tally = (xs: string[]) => {
  const m = new Map<string, number>();
  for (const x of xs) m.set(x, (m.get(x) ?? 0) + 1);
  return [...m].map(([k, n]) => `${k} x${n}`).join(', ');
};
async function counted(label: string, work: () => Promise<unknown>): Promise<void> {
  await new Promise((r) => setTimeout(r, 50));
  mongoSeen = [];
  redisSeen = [];
  waves = 0;
  mongoMs = 0;
  const t0 = performance.now();
  await work();
  const ms = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 100)); // MONITOR lines arrive a little later
  out(
    `${label}: ${mongoSeen.length} mongo commands in ${waves} waves (summed command time ${mongoMs.toFixed(1)} ms), ${redisSeen.length} redis, ${ms.toFixed(1)} ms\n    mongo: ${tally(mongoSeen)}\n    redis: ${tally(redisSeen)}`,
  );
}

// CPU profile of one window.
const session = new Session();
session.connect();
await session.post('Profiler.enable');
await session.post('Profiler.setSamplingInterval', { interval: 200 });
interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}
async function profiled<T>(label: string, work: () => Promise<T>, ops = 1): Promise<T> {
  const ferret0 = ferretPid ? cpuTicks(ferretPid) : 0;
  const self0 = process.cpuUsage();
  await session.post('Profiler.start');
  const result = await work();
  const selfUs = process.cpuUsage(self0);
  const ferretMs = ferretPid ? ((cpuTicks(ferretPid) - ferret0) / CLOCK_TICKS_PER_SECOND) * 1000 : NaN;
  out(
    `  cpu ${label}: this process ${((selfUs.user + selfUs.system) / 1000 / ops).toFixed(2)} ms/op, FerretDB ${(ferretMs / ops).toFixed(2)} ms/op (${ops} ops)`,
  );
  const { profile } = (await session.post('Profiler.stop')) as unknown as {
    profile: { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] };
  };
  if (PROF_DIR) {
    mkdirSync(PROF_DIR, { recursive: true });
    writeFileSync(join(PROF_DIR, `${label.replace(/\W+/g, '-')}.cpuprofile`), JSON.stringify(profile));
  }
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const byFn = new Map<string, number>();
  const byModule = new Map<string, number>();
  let busy = 0;
  let total = 0;
  profile.samples.forEach((id, i) => {
    const { functionName, url, lineNumber } = byId.get(id)!.callFrame;
    const us = profile.timeDeltas[i] ?? 0;
    total += us;
    if (functionName === '(idle)' || (functionName === 'dispatch' && !url)) return; // dispatch: the profiler's own stop
    busy += us;
    const where = url.replace(/^file:\/\/.*?\/(node_modules|src|bench)\//, '$1/');
    byFn.set(
      `${functionName || '(anon)'} ${where}:${lineNumber + 1}`,
      (byFn.get(`${functionName || '(anon)'} ${where}:${lineNumber + 1}`) ?? 0) + us,
    );
    const mod = where.startsWith('node_modules/')
      ? where
          .split('/')
          .slice(0, where.split('/')[1]!.startsWith('@') ? 3 : 2)
          .join('/')
      : where.startsWith('node:')
        ? where.replace(/^node:(internal\/)?/, 'node:').split('/')[0]!
        : where || functionName;
    byModule.set(mod, (byModule.get(mod) ?? 0) + us);
  });
  const top = (m: Map<string, number>, n: number) =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(
        ([k, us]) =>
          `      ${(us / 1e3).toFixed(0).padStart(6)} ms ${((us / busy) * 100).toFixed(1).padStart(5)}%  ${k}`,
      )
      .join('\n');
  out(
    `  profile ${label}: ${(total / 1e6).toFixed(2)} s window, ${(busy / 1e6).toFixed(2)} s busy (${((busy / total) * 100).toFixed(0)}%)\n    by function:\n${top(byFn, TOP)}\n    by module:\n${top(byModule, 12)}`,
  );
  return result;
}

const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.max(0, Math.ceil((p / 100) * xs.length) - 1)]!;

try {
  const tenant = (await http.expect(201, 'POST', '/ops/tenants', { token: adminKey, body: { name: 'rp' } })).json;
  const token = (
    await http.expect(201, 'POST', '/ops/api-keys', {
      token: adminKey,
      body: { tenantId: tenant.tenantId, scopes: ['agents:write', 'runs:write', 'runs:read'] },
    })
  ).json.token as string;
  const pair = generateEd25519KeyPair();
  const agent = (
    await http.expect(201, 'POST', '/v1/agents', {
      token,
      body: { name: 'a', publicKey: Buffer.from(pair.raw).toString('base64url') },
    })
  ).json;
  const newRun = async () =>
    (
      await http.expect(201, 'POST', '/v1/runs', {
        token,
        body: { agentId: agent.agentId, terms: { accuracy: { min: 0.9 } } },
      })
    ).json.runId as string;
  const sign = (runId: string, head: ChainHead, n: number) =>
    signEvents(
      Array.from({ length: n }, (_, i) => ({
        id: newId('evt'),
        runId,
        type: 'sample',
        at: new Date().toISOString(),
        payload: { latencyMs: 100 + i, correct: true, step: head.seq + i, note: 'tool output digest 0123456789abcdef' },
      })),
      head,
      pair.privateKey,
      agent.keyId,
    );
  const chain = (runId: string, batches: number, size: number) => {
    const outB: EventEnvelope[][] = [];
    let head: ChainHead = EMPTY_HEAD;
    for (let b = 0; b < batches; b++) {
      const batch = sign(runId, head, size);
      head = { seq: batch.at(-1)!.seq, chainHash: batch.at(-1)!.chainHash };
      outB.push(batch);
    }
    return outB;
  };

  // --- round trips of one request each
  await newRun();
  const runId = await newRun();
  await counted('POST /v1/runs', () => newRun());
  await counted('GET /v1/runs/:id (no events)', () => http.expect(200, 'GET', `/v1/runs/${runId}`, { token }));
  const [e1, e2, e3] = sign(runId, EMPTY_HEAD, 3);
  await counted('POST events, 1 event (first append: agent not cached)', () =>
    http.expect(201, 'POST', `/v1/runs/${runId}/events`, { token, body: { event: e1 } }),
  );
  await counted('POST events, 1 event', () =>
    http.expect(201, 'POST', `/v1/runs/${runId}/events`, { token, body: { event: e2 } }),
  );
  await counted('POST events, 1 event resent (no-op)', () =>
    http.expect(201, 'POST', `/v1/runs/${runId}/events`, { token, body: { event: e2 } }),
  );
  await counted('POST events, 1 event', () =>
    http.expect(201, 'POST', `/v1/runs/${runId}/events`, { token, body: { event: e3 } }),
  );
  await counted('GET /v1/runs/:id (3 events)', () => http.expect(200, 'GET', `/v1/runs/${runId}`, { token }));
  const batchRun = await newRun();
  const [b1, b2] = chain(batchRun, 2, 100);
  await counted('POST events, 100 events', () =>
    http.expect(201, 'POST', `/v1/runs/${batchRun}/events`, { token, body: { events: b1 } }),
  );
  await counted('POST events, 100 events', () =>
    http.expect(201, 'POST', `/v1/runs/${batchRun}/events`, { token, body: { events: b2 } }),
  );

  // --- latency windows
  const runs = await Promise.all(Array.from({ length: 40 }, () => newRun()));
  const raw = runtime.db.collection<{ _id: string }>('runs');
  for (const c of [1, 16]) {
    const n = c === 1 ? 300 : 40;
    const rawR = await concurrently(c, n, async (k, i) => {
      const t0 = performance.now();
      await raw.findOne({ _id: runs[(k * 7 + i) % runs.length]! });
      return performance.now() - t0;
    });
    const r = await profiled(
      `GET run c${c}`,
      () =>
        concurrently(
          c,
          n,
          async (k, i) => (await http.expect(200, 'GET', `/v1/runs/${runs[(k * 7 + i) % runs.length]}`, { token })).ms,
        ),
      n * c,
    );
    out(
      `GET run c${c}: p50 ${pct(r.latencies, 50).toFixed(2)} ms (raw findOne p50 ${pct(rawR.latencies, 50).toFixed(2)}, diff ${(pct(r.latencies, 50) - pct(rawR.latencies, 50)).toFixed(2)}), ${summarize(r.latencies, r.wallMs).opsPerSecond}/s`,
    );
  }
  for (const c of [1, 16]) {
    const n = c === 1 ? 200 : 30;
    const own = await Promise.all(Array.from({ length: c }, () => newRun()));
    const evs = own.map((id) => sign(id, EMPTY_HEAD, n));
    const r = await profiled(
      `single append c${c}`,
      () =>
        concurrently(
          c,
          n,
          async (k, i) =>
            (await http.expect(201, 'POST', `/v1/runs/${own[k]}/events`, { token, body: { event: evs[k]![i] } })).ms,
        ),
      n * c,
    );
    out(
      `single append c${c}: p50 ${pct(r.latencies, 50).toFixed(2)} ms, ${(r.latencies.length / (r.wallMs / 1000)).toFixed(0)} events/s`,
    );
  }
  {
    const c = 16;
    const n = 5;
    const own = await Promise.all(Array.from({ length: c }, () => newRun()));
    const bs = own.map((id) => chain(id, n, 100));
    const r = await profiled(
      `batch append c${c}`,
      () =>
        concurrently(
          c,
          n,
          async (k, i) =>
            (await http.expect(201, 'POST', `/v1/runs/${own[k]}/events`, { token, body: { events: bs[k]![i] } })).ms,
        ),
      n * c,
    );
    out(
      `batch append c${c}: p50 ${pct(r.latencies, 50).toFixed(2)} ms, ${((r.latencies.length * 100) / (r.wallMs / 1000)).toFixed(0)} events/s`,
    );
  }

  // --- finalize and cold verify of a big run
  const bigRun = await newRun();
  for (const batch of chain(bigRun, Math.ceil(EVENTS / 100), 100))
    await http.expect(201, 'POST', `/v1/runs/${bigRun}/events`, { token, body: { events: batch } });
  await counted('POST /v1/runs/:id/finalize (API side)', () =>
    http.expect(202, 'POST', `/v1/runs/${bigRun}/finalize`, { token }),
  );
  await profiled(`finalize job ${EVENTS}`, () =>
    counted(`finalize job (worker side), ${EVENTS} events`, () => finalizeRun(runtime, tenant.tenantId, bigRun)),
  );
  await profiled(`verify cold ${EVENTS}`, () =>
    counted(`GET /v1/verify/:runId cold, ${EVENTS} events`, () => http.expect(200, 'GET', `/v1/verify/${bigRun}`)),
  );
  await counted('GET /v1/verify/:runId warm', () => http.expect(200, 'GET', `/v1/verify/${bigRun}`));
  await counted(`GET /v1/artifacts/:id, ${EVENTS} events`, async () => {
    const run = (await http.expect(200, 'GET', `/v1/runs/${bigRun}`, { token })).json;
    mongoSeen = [];
    redisSeen = [];
    waves = 0;
    await http.expect(200, 'GET', `/v1/artifacts/${run.artifactId}`, { token });
  });
  out(`memory: rss ${(process.memoryUsage().rss / 1048576).toFixed(0)} MiB`);
} finally {
  session.disconnect();
  monitorClient.disconnect();
  await app.close();
  await runtime.db.dropDatabase().catch(() => undefined);
  const keys = await runtime.redis.keys(`${config.redisPrefix}*`).catch(() => [] as string[]);
  if (keys.length) await runtime.redis.del(...keys).catch(() => undefined);
  await runtime.close();
}
