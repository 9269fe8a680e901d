// A run of N signed events (default 10,000) appended over HTTP in batches of 100, then finalized by the real
// worker. Prints JSON: append throughput, finalize latency, artifact size, public verification time.
// Needs the local services (scripts/services.sh up) or MONGO_URL / REDIS_URL. Loopback only; stops by itself.
import { mkdirSync, writeFileSync } from 'node:fs';
import { generateEd25519KeyPair, newId } from '../src/domain/crypto.ts';
import { signEvents, type ChainHead } from '../src/domain/event-chain.ts';
import { startInProcessService } from './in-process.ts';

const EVENTS = Number(process.argv[2] ?? 10_000);
const BATCH = 100;
const service = await startInProcessService(['finalize'], 1_000_000);
const { base, adminKey } = service;

async function call(method: string, path: string, token: string, body?: unknown) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (res.status >= 300) throw new Error(`${method} ${path} -> ${res.status} ${text.slice(0, 300)}`);
  return { text, json: () => JSON.parse(text) };
}

try {
  const tenant = (await call('POST', '/ops/tenants', adminKey, { name: 'bench' })).json();
  const token = (
    await call('POST', '/ops/api-keys', adminKey, { tenantId: tenant.tenantId, scopes: ['agents:write', 'runs:write'] })
  ).json().token;
  const pair = generateEd25519KeyPair();
  const agent = (
    await call('POST', '/v1/agents', token, { name: 'bench', publicKey: Buffer.from(pair.raw).toString('base64url') })
  ).json();
  const run = (
    await call('POST', '/v1/runs', token, {
      agentId: agent.agentId,
      terms: { accuracy: { min: 0.9 }, latencyP95: { max: 800 } },
    })
  ).json();

  let head: ChainHead = { seq: 0, chainHash: null };
  let signMs = 0;
  const batchMs: number[] = [];
  const appendStarted = performance.now();
  for (let done = 0; done < EVENTS; done += BATCH) {
    const signStarted = performance.now();
    const batch = signEvents(
      Array.from({ length: Math.min(BATCH, EVENTS - done) }, (_, i) => ({
        id: newId('evt'),
        runId: run.runId,
        type: 'sample',
        at: new Date().toISOString(),
        payload: {
          latencyMs: 100 + ((done + i) % 700),
          correct: (done + i) % 20 !== 0,
          step: done + i,
          note: 'tool output digest 0123456789abcdef',
        },
      })),
      head,
      pair.privateKey,
      agent.keyId,
    );
    signMs += performance.now() - signStarted;
    const started = performance.now();
    head = (await call('POST', `/v1/runs/${run.runId}/events`, token, { events: batch })).json().head;
    batchMs.push(performance.now() - started);
  }
  const appendMs = performance.now() - appendStarted - signMs;

  const finalizeStarted = performance.now();
  await call('POST', `/v1/runs/${run.runId}/finalize`, token);
  let finalized;
  for (;;) {
    finalized = (await call('GET', `/v1/runs/${run.runId}`, token)).json();
    if (finalized.status === 'finalized') break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const finalizeMs = performance.now() - finalizeStarted;

  const fetchStarted = performance.now();
  const artifact = await call('GET', `/v1/artifacts/${finalized.artifactId}`, token);
  const fetchMs = performance.now() - fetchStarted;
  const verifyStarted = performance.now();
  const verification = (await call('GET', `/v1/verify/${finalized.artifactId}`, token)).json();
  const verifyMs = performance.now() - verifyStarted;

  batchMs.sort((a, b) => a - b);
  const result = {
    bench: 'run-10k',
    events: EVENTS,
    batchSize: BATCH,
    appendSeconds: +(appendMs / 1000).toFixed(2),
    appendEventsPerSecond: Math.round(EVENTS / (appendMs / 1000)),
    batchLatencyMs: {
      p50: +batchMs[Math.floor(batchMs.length * 0.5)]!.toFixed(1),
      p95: +batchMs[Math.ceil(batchMs.length * 0.95) - 1]!.toFixed(1),
      max: +batchMs.at(-1)!.toFixed(1),
    },
    finalizeSeconds: +(finalizeMs / 1000).toFixed(2),
    artifactBytes: Buffer.byteLength(artifact.text),
    artifactFetchMs: Math.round(fetchMs),
    publicVerifyMs: Math.round(verifyMs),
    verified: verification.verified,
    verdict: finalized.verdict,
    rssMiB: Math.round(process.memoryUsage().rss / 2 ** 20),
    backend: process.env.MONGO_URL ? 'MONGO_URL' : 'FerretDB 1.24.2 (SQLite)',
  };
  console.log(JSON.stringify(result, null, 2));
  mkdirSync('bench/results', { recursive: true });
  writeFileSync(`bench/results/run-${EVENTS}.json`, `${JSON.stringify(result, null, 2)}\n`);
} finally {
  await service.close();
}
