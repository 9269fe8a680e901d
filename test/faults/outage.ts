// One scenario for either backing service (Redis or MongoDB/FerretDB), run against a server of the test's own with
// the API and a worker as real processes:
//   1. the server hangs (SIGSTOP) for 2 s under a stream of requests: every request, those in flight included,
//      answers within 1 s (contract section 2: 503 fast, never hang);
//   2. with finalize jobs just accepted, the server is killed and stays down 10 s: every request answers 503 in the
//      contract's shape within 1 s;
//   3. it restarts: requests succeed again within 5 s, the worker resumes by itself, every run finalizes and settles,
//      and the database audit finds each effect once and every currency balanced.
import { expect } from 'vitest';
import { auditDatabase, eventuallyAnnounced } from './audit.ts';
import {
  call,
  createRunWithEvidence,
  createTenant,
  credit,
  eventually,
  expectErrorShape,
  must,
  registerAgent,
  ServiceProcess,
  serviceEnv,
  type Answer,
} from './service.ts';

export interface Backend {
  name: string;
  mongoUrl: string;
  redisUrl: string;
  freeze(): void;
  thaw(): void;
  down(): Promise<void>;
  up(): Promise<void>;
}

const CONTRACT_503_MS = 1_000;
const CONTRACT_RECOVERY_MS = 5_000;
const OUTAGE_MS = 10_000;
const RUNS = 16;
/**
 * After the outage, the sweepers (every second here) run a finalize job out of its retry backoff (Producers.ensure);
 * without that, a job that failed all through the outage would wait out a 32-64 s backoff.
 */
const FINISH_WITHIN_MS = 30_000;

export interface OutageFigures {
  backend: string;
  inFlight: { requests: number; overlappingFreeze: number; unavailable: number; maxMs: number };
  outage: { requests: number; maxMs: number; meanMs: number };
  recoveryMs: number;
  settledAfterMs: number;
}

export async function outageScenario(backend: Backend, processes: ServiceProcess[]): Promise<OutageFigures> {
  const env = serviceEnv(backend.mongoUrl, backend.redisUrl);
  const api = await ServiceProcess.start('api', env);
  processes.push(api);
  processes.push(await ServiceProcess.start('worker', env));
  const base = api.url;
  const tenant = await createTenant(base, env.SERVICE_ADMIN_KEY!);
  const payer = await registerAgent(base, tenant);
  const payee = await registerAgent(base, tenant);
  await credit(base, env.SERVICE_ADMIN_KEY!, payer.agentId, 100_000);
  const runIds: string[] = [];
  for (let i = 0; i < RUNS; i++)
    runIds.push(await createRunWithEvidence(base, tenant, payer, payee, { pass: i % 2 === 0, amount: 100 + i }));

  // 1. A hang under load: four clients keep asking while the server is frozen for 2 s.
  const answers: Array<Answer & { startedAt: number; endedAt: number }> = [];
  const streamUntil = performance.now() + 3_500;
  let freezeAt = 0;
  let thawAt = 0;
  const stream = Promise.all(
    Array.from({ length: 4 }, async (_, client) => {
      for (let n = 0; performance.now() < streamUntil && n < 1_000; n++) {
        const startedAt = performance.now();
        const path =
          n % 2 === 0 ? `/v1/runs/${runIds[(client + n) % RUNS]}` : `/v1/wallets/${encodeURIComponent(payer.agentId)}`;
        const answer = await call(base, 'GET', path, { headers: tenant.auth, timeoutMs: 15_000 });
        answers.push({ ...answer, startedAt, endedAt: performance.now() });
      }
    }),
  );
  await new Promise((r) => setTimeout(r, 700));
  freezeAt = performance.now();
  backend.freeze();
  await new Promise((r) => setTimeout(r, 2_000));
  backend.thaw();
  thawAt = performance.now();
  await stream;
  const overlapping = answers.filter((a) => a.endedAt > freezeAt && a.startedAt < thawAt);
  const inFlight = {
    requests: answers.length,
    overlappingFreeze: overlapping.length,
    unavailable: overlapping.filter((a) => a.status === 503).length,
    maxMs: Math.round(Math.max(...overlapping.map((a) => a.ms))),
  };
  console.log(`fault figures (${backend.name} hang): ${JSON.stringify(inFlight)}`);
  for (const a of overlapping) {
    if (a.status !== 200) expectErrorShape(a, 503, 'UNAVAILABLE');
  }
  expect(inFlight.unavailable, 'requests answered 503 while frozen').toBeGreaterThan(0);
  expect(inFlight.maxMs, `slowest answer while ${backend.name} hung`).toBeLessThan(CONTRACT_503_MS);

  // Let the service see the server again before the next fault.
  await eventually(
    async () => (await call(base, 'GET', `/v1/runs/${runIds[0]}`, { headers: tenant.auth })).status === 200,
    15_000,
    'service back after the hang',
  );

  // 2. Finalize jobs accepted, then the server is gone for 10 s.
  for (const runId of runIds) await must(base, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
  await backend.down();
  const downSince = Date.now();
  const during: Answer[] = [];
  for (let n = 0; Date.now() - downSince < OUTAGE_MS && n < 200; n++) {
    const runId = runIds[n % RUNS]!;
    const answer =
      n % 2 === 0
        ? await call(base, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth, timeoutMs: 15_000 })
        : await call(base, 'POST', `/v1/runs/${runId}/settle`, {
            headers: { ...tenant.auth, 'idempotency-key': `outage-${n}` },
            body: {},
            timeoutMs: 15_000,
          });
    during.push(answer);
    expectErrorShape(answer, 503, 'UNAVAILABLE');
    expect(answer.headers.get('retry-after')).toBe('1');
    await new Promise((r) => setTimeout(r, 150));
  }
  const outage = {
    requests: during.length,
    maxMs: Math.round(Math.max(...during.map((a) => a.ms))),
    meanMs: Math.round(during.reduce((s, a) => s + a.ms, 0) / during.length),
  };
  console.log(`fault figures (${backend.name} down): ${JSON.stringify(outage)}`);
  expect(outage.maxMs, `slowest 503 while ${backend.name} was down`).toBeLessThan(CONTRACT_503_MS);

  // 3. Back: requests succeed within 5 s, the worker resumes, everything finalizes and settles.
  await backend.up();
  const upAt = Date.now();
  await eventually(
    async () =>
      (await call(base, 'GET', `/v1/runs/${runIds[0]}`, { headers: tenant.auth, timeoutMs: 5_000 })).status === 200,
    30_000,
    'the first success after restart',
    50,
  );
  const recoveryMs = Date.now() - upAt;
  expect(recoveryMs, `first success after ${backend.name} restarted`).toBeLessThan(CONTRACT_RECOVERY_MS);

  for (const runId of runIds) {
    await eventually(
      async () => (await call(base, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized',
      FINISH_WITHIN_MS,
      `run ${runId} finalized`,
      250,
    );
  }
  for (const runId of runIds)
    await must(base, 'POST', `/v1/runs/${runId}/settle`, 202, {
      headers: { ...tenant.auth, 'idempotency-key': `settle-${runId}` },
      body: {},
    });
  for (const runId of runIds) {
    await eventually(
      async () =>
        ['completed', 'held'].includes(
          (await call(base, 'GET', `/runs/${runId}/settlement`, { headers: tenant.auth })).body?.status,
        ),
      60_000,
      `settlement of ${runId}`,
      250,
    );
  }
  const settledAfterMs = Date.now() - upAt;

  await eventuallyAnnounced(env.MONGO_URL!, runIds, 30_000);
  const audit = await auditDatabase(env.MONGO_URL!, runIds);
  expect(audit.verdicts).toEqual({ pass: RUNS / 2, fail: RUNS / 2 });
  expect(audit.settlements).toEqual({ completed: RUNS / 2, held: RUNS / 2 });
  return { backend: backend.name, inFlight, outage, recoveryMs, settledAfterMs };
}
