// Diagnostic: how many MongoDB commands each operation sends (in-process app, command monitoring on). On FerretDB
// every command is a round trip plus a SQLite statement, so this count times the round-trip time is the floor of
// an operation's latency. Usage: node --import tsx bench/growth/round-trips.ts [eventsInFinalizedRun]
// Needs the local services; uses its own database and Redis prefix, dropped at the end.
import { randomBytes } from 'node:crypto';
import type { CommandStartedEvent } from 'mongodb';
import { loadConfig } from '../../src/config.ts';
import { generateEd25519KeyPair, newId, privateKeyToPem } from '../../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents, type ChainHead } from '../../src/domain/event-chain.ts';
import { buildApp } from '../../src/http/app.ts';
import { createLogger } from '../../src/logger.ts';
import { connectRuntime, createRuntime } from '../../src/runtime.ts';
import { finalizeRun } from '../../src/services/runs.ts';

const EVENTS = Number(process.argv[2] ?? 1_000);
const suffix = randomBytes(4).toString('hex');
const adminKey = randomBytes(32).toString('base64url');
const config = loadConfig({
  NODE_ENV: 'test',
  MONGO_COMMAND_MONITORING: 'true', // this diagnostic counts the commands each request sends
  LOG_LEVEL: 'warn',
  MONGO_URL: `mongodb://127.0.0.1:27027/bench_rt_${suffix}`,
  REDIS_URL: 'redis://127.0.0.1:6390',
  REDIS_PREFIX: `benchrt${suffix}`,
  SERVICE_ADMIN_KEY: adminKey,
  SERVICE_SIGNING_KEY: privateKeyToPem(generateEd25519KeyPair().privateKey),
  RATE_LIMIT_MAX: '1000000',
});
const runtime = createRuntime(config, createLogger(config, 'bench-rt')); // command monitoring is always on
await connectRuntime(runtime);
const app = await buildApp(runtime, { logger: false, bullBoard: false });
let seen: string[] = [];
runtime.mongo.on('commandStarted', (e: CommandStartedEvent) =>
  seen.push(`${e.commandName} ${String(e.command[e.commandName])}`),
);

async function counted(label: string, work: () => Promise<unknown>): Promise<void> {
  seen = [];
  const t0 = performance.now();
  await work();
  const ms = performance.now() - t0;
  const byKind = new Map<string, number>();
  for (const s of seen) byKind.set(s, (byKind.get(s) ?? 0) + 1);
  console.log(
    `${label}: ${seen.length} commands in ${ms.toFixed(0)} ms  ${[...byKind].map(([k, n]) => `${k} x${n}`).join(', ')}`,
  );
}

async function call(method: 'GET' | 'POST', url: string, token: string, payload?: unknown) {
  const res = await app.inject({
    method,
    url,
    headers: { authorization: `Bearer ${token}` },
    ...(payload === undefined ? {} : { payload: payload as object }),
  });
  if (res.statusCode >= 300) throw new Error(`${method} ${url} -> ${res.statusCode} ${res.body.slice(0, 200)}`);
  return res.json();
}

try {
  const tenant = await call('POST', '/ops/tenants', adminKey, { name: 'rt' });
  const token = (
    await call('POST', '/ops/api-keys', adminKey, {
      tenantId: tenant.tenantId,
      scopes: ['agents:write', 'runs:write', 'runs:read'],
    })
  ).token;
  const pair = generateEd25519KeyPair();
  const agent = await call('POST', '/v1/agents', token, {
    name: 'a',
    publicKey: Buffer.from(pair.raw).toString('base64url'),
  });
  const newRun = async () =>
    (await call('POST', '/v1/runs', token, { agentId: agent.agentId, terms: { accuracy: { min: 0.9 } } }))
      .runId as string;
  const sign = (runId: string, head: ChainHead, n: number) =>
    signEvents(
      Array.from({ length: n }, (_, i) => ({
        id: newId('evt'),
        runId,
        type: 'sample',
        at: new Date().toISOString(),
        payload: { latencyMs: 100 + i, correct: true, step: head.seq + i },
      })),
      head,
      pair.privateKey,
      agent.keyId,
    );

  await newRun(); // warm the credential cache
  let runId = '';
  await counted('POST /v1/runs', async () => (runId = await newRun()));
  await counted('GET /v1/runs/:id (no events)', () => call('GET', `/v1/runs/${runId}`, token));
  let head: ChainHead = EMPTY_HEAD;
  for (let i = 0; i < 3; i++) {
    const [event] = sign(runId, head, 1);
    await counted(`POST events, 1 event (append #${i + 1})`, () =>
      call('POST', `/v1/runs/${runId}/events`, token, { event }),
    );
    head = { seq: event!.seq, chainHash: event!.chainHash };
  }
  await counted('GET /v1/runs/:id (3 events)', () => call('GET', `/v1/runs/${runId}`, token));
  const bigRun = await newRun();
  head = EMPTY_HEAD;
  for (let done = 0; done < EVENTS; done += 100) {
    const events = sign(bigRun, head, Math.min(100, EVENTS - done));
    const append = () => call('POST', `/v1/runs/${bigRun}/events`, token, { events });
    if (done === 0 || done + 100 >= EVENTS)
      await counted(`POST events, 100 events (batch at seq ${head.seq + 1})`, append);
    else await append();
    head = { seq: events.at(-1)!.seq, chainHash: events.at(-1)!.chainHash };
  }
  await counted('POST /v1/runs/:id/finalize (API side)', () => call('POST', `/v1/runs/${bigRun}/finalize`, token));
  await counted(`finalize job (worker side), ${EVENTS} events`, () => finalizeRun(runtime, tenant.tenantId, bigRun));
  await counted(`GET /v1/verify/:runId cold, ${EVENTS} events`, () => call('GET', `/v1/verify/${bigRun}`, token));
  await counted(`GET /v1/verify/:runId warm`, () => call('GET', `/v1/verify/${bigRun}`, token));
} finally {
  await app.close();
  await runtime.db.dropDatabase().catch(() => undefined);
  const keys = await runtime.redis.keys(`${config.redisPrefix}*`).catch(() => [] as string[]);
  if (keys.length) await runtime.redis.del(...keys).catch(() => undefined);
  await runtime.close();
}
