// List benchmark (issue 24): the cost of one page of runs (`GET /v1/runs?limit=50`, through the real app, in
// process) with 100 and with 100,000 runs stored, measured in the same run; target: seeded p50 <= 1.5x empty p50.
// Each phase has its own database and Redis prefix, seeded directly through the stores (documents by insertMany,
// index entries by ListIndex.addMany), never through HTTP. Writes bench/results/lists.json and prints it.
//   node --import tsx bench/lists.ts        Env: BENCH_LIST_RUNS (default 100000), BENCH_LIST_CALLS (default 300)
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { MongoClient } from 'mongodb';
import { loadConfig } from '../src/config.ts';
import { newId } from '../src/domain/crypto.ts';
import { buildApp } from '../src/http/app.ts';
import { createLogger } from '../src/logger.ts';
import { connectRuntime, createRuntime } from '../src/runtime.ts';
import { issueApiKey, createTenant } from '../src/services/tenants.ts';
import { runListEntry, type RunDoc } from '../src/store/runs.ts';
import { benchService, dropBenchData, MONGO_BASE, ROOT } from './production-service.ts';

const SEEDED = Number(process.env.BENCH_LIST_RUNS ?? 100_000);
const CALLS = Number(process.env.BENCH_LIST_CALLS ?? 300);
const log = (line: string) => console.error(`[bench lists ${new Date().toISOString().slice(11, 19)}] ${line}`);
const quantile = (sorted: number[], q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
const round = (x: number) => Number(x.toFixed(3));

async function phase(runs: number) {
  const service = benchService('lists', { LOG_LEVEL: 'warn' });
  const config = loadConfig({ ...service.env, NODE_ENV: 'test' });
  const runtime = createRuntime(config, createLogger(config, 'bench'));
  await connectRuntime(runtime);
  try {
    const app = await buildApp(runtime, { logger: false });
    await app.ready();
    const tenant = await createTenant(runtime, { name: 'bench' });
    const { token } = await issueApiKey(runtime, { tenantId: tenant._id, scopes: ['runs:read'], expiresAt: null });
    const seedStarted = performance.now();
    const start = Date.now() - runs * 10;
    for (let i = 0; i < runs; i += 5_000) {
      const docs: RunDoc[] = Array.from({ length: Math.min(5_000, runs - i) }, (_, j) => ({
        _id: newId('run'),
        tenantId: tenant._id,
        agentId: `bench:agent:a${(i + j) % 10}`,
        terms: {},
        settlement: null,
        status: 'in_progress',
        verdict: null,
        artifactId: null,
        createdAt: new Date(start + (i + j) * 10),
        finalizeRequestedAt: null,
        finalHead: null,
        finalizedAt: null,
        finalizeError: null,
      }));
      await runtime.stores.runs.runs.insertMany(docs, { ordered: false });
      await runtime.stores.lists.addMany(docs.map(runListEntry));
    }
    const seedSeconds = (performance.now() - seedStarted) / 1000;
    const headers = { authorization: `Bearer ${token}` };
    const call = async (url: string) => {
      const res = await app.inject({ method: 'GET', url, headers });
      if (res.statusCode !== 200) throw new Error(`${url}: ${res.statusCode} ${res.body}`);
      return res.json() as { items: unknown[]; nextCursor: string | null };
    };
    for (let i = 0; i < 30; i++) await call('/v1/runs?limit=50'); // warm up
    const firstPage: number[] = [];
    const deepPage: number[] = [];
    let cursor = (await call('/v1/runs?limit=50')).nextCursor;
    for (let i = 0; i < CALLS; i++) {
      let t = performance.now();
      const page = await call('/v1/runs?limit=50');
      firstPage.push(performance.now() - t);
      if (page.items.length !== Math.min(50, runs)) throw new Error(`page of ${page.items.length}`);
      t = performance.now();
      const next = cursor ? await call(`/v1/runs?limit=50&cursor=${cursor}`) : { nextCursor: null };
      deepPage.push(performance.now() - t);
      cursor = next.nextCursor ?? (await call('/v1/runs?limit=50')).nextCursor;
    }
    await app.close();
    const summary = (xs: number[]) => {
      const s = [...xs].sort((a, b) => a - b);
      return {
        p50: round(quantile(s, 0.5)),
        p95: round(quantile(s, 0.95)),
        mean: round(s.reduce((a, b) => a + b, 0) / s.length),
      };
    };
    return {
      runsStored: runs,
      seedSeconds: round(seedSeconds),
      firstPageMs: summary(firstPage),
      nextPageMs: summary(deepPage),
    };
  } finally {
    const mongo = new MongoClient(MONGO_BASE);
    await runtime.close();
    await dropBenchData(service, mongo, log).finally(() => mongo.close());
  }
}

async function main() {
  log(`100 runs stored`);
  const small = await phase(100);
  log(`${SEEDED} runs stored`);
  const large = await phase(SEEDED);
  const ratios = {
    firstPageP50: round(large.firstPageMs.p50 / small.firstPageMs.p50),
    nextPageP50: round(large.nextPageMs.p50 / small.nextPageMs.p50),
  };
  const result = {
    benchmark: 'lists',
    page: 'GET /v1/runs?limit=50',
    calls: CALLS,
    small,
    large,
    ratios,
    target: 'ratio <= 1.5',
    met: ratios.firstPageP50 <= 1.5 && ratios.nextPageP50 <= 1.5,
  };
  const json = JSON.stringify(result, null, 2);
  mkdirSync(join(ROOT, 'bench/results'), { recursive: true });
  writeFileSync(join(ROOT, 'bench/results/lists.json'), `${json}\n`);
  console.log(json);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
