// Latency of the x402 hot path over real HTTP: create, quote, authorize-payment and verify, with 1 and with 50
// concurrent clients, beside two ceilings measured in the same run at the same concurrency: a bare Fastify route
// and a raw driver findOne({_id}). Prints JSON (also written to bench/results/x402.json).
// `node --import tsx bench/x402.ts [--ops N] [--seed-gates N] [--clients 1,50]`: --seed-gates stores N gates first (whole
// flows through the same service the API uses, then clones of their records) to show that cost follows the work, not the data. Needs the local services; stops by itself.
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import Fastify from 'fastify';
import { generateEd25519KeyPair } from '../src/domain/crypto.ts';
import { X402Service } from '../src/services/x402.ts';
import { startInProcessService } from './in-process.ts';

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

const host = await startInProcessService(['x402-verify', 'settle']);
const { runtime, base, adminKey } = host;
const bare = Fastify({ logger: false });
bare.get('/ping', async () => ({ ok: true }));
await bare.listen({ host: '127.0.0.1', port: 0 });
const bareBase = `http://127.0.0.1:${(bare.server.address() as { port: number }).port}`;

async function call(method: string, path: string, token: string, body?: unknown, expect = [200, 201]) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (res.status === 503 || res.status === 429) throw new Refused(String(res.status));
  if (!expect.includes(res.status)) throw new Error(`${method} ${path} -> ${res.status} ${text.slice(0, 300)}`);
  return JSON.parse(text);
}

function percentiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (p: number) => Number(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!.toFixed(2));
  return { n: sorted.length, p50: at(50), p95: at(95), p99: at(99) };
}

class Refused extends Error {}

/**
 * Runs `ops` calls of `work(i)` with `clients` callers at once; the latency of each call in ms. A call the service
 * refuses (say a 503 from the request deadline under load) is counted under `failed` by status, not timed, and the
 * later steps of that gate are skipped; anything else stops the benchmark.
 */
async function measure(clients: number, ops: number, work: (i: number) => Promise<unknown>, skip: Set<number>) {
  const samples: number[] = [];
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
  return { ...percentiles(samples), ...(Object.keys(failed).length > 0 ? { failed } : {}) };
}

const requestSha = (i: number) => createHash('sha256').update(`bench request ${i}`).digest('hex');

try {
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

  if (SEED_GATES > 0) {
    // Whole flows through the service (create, quote, authorize, verify by the worker) for the first gates, then
    // their records cloned under other ids until every collection a gate grows holds SEED_GATES gates' worth: cost
    // follows the stored data only if a request reads more of a larger collection, and the clones are never read.
    const started = Date.now();
    const service = new X402Service(runtime);
    const real = Math.min(SEED_GATES, SEED_REAL_FLOWS);
    for (let done = 0; done < real; done += pairs.length) {
      await Promise.all(pairs.slice(0, Math.min(pairs.length, real - done)).map(async (p, k) => {
        const sha = requestSha(1e9 + done + k);
        const { gate } = await service.createGate(tenant.tenantId, { payerAgentId: p.payer, payeeAgentId: p.payee, amount: 1, currency: 'USD' });
        const { quote } = await service.quote(tenant.tenantId, { gateId: gate._id, requestSha256: sha });
        await service.authorizePayment(tenant.tenantId, { gateId: gate._id, quoteId: quote._id, requestSha256: sha });
        await service.verify(tenant.tenantId, { gateId: gate._id, evidence: { responseSha256: sha } });
      }));
    }
    await service.close();
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
    console.error(`seeded ${real} gates through the service and ${copies} clones of each of their records in ${Math.round((Date.now() - started) / 1000)} s`);
  }

  const probe = runtime.db.collection<{ _id: string }>('bench_probe');
  await probe.insertOne({ _id: 'probe' });
  const results: Record<string, unknown> = {};
  for (const clients of CONCURRENCY) {
    const ops = clients === 1 ? Math.ceil(OPS / 2) : OPS;
    const gates: string[] = [];
    const quotes: Array<{ quoteId: string; requestSha256: string }> = [];
    const pairOf = (i: number) => pairs[i % clients]!;
    const skip = new Set<number>();
    const create = await measure(clients, ops, async (i) => {
      const p = pairOf(i);
      gates[i] = (await call('POST', '/x402/gate/create', token, { payerAgentId: p.payer, payeeAgentId: p.payee, amount: 1_000, currency: 'USD', holdbackBps: 1_000, disputeWindowSeconds: 3_600 })).gateId;
    }, skip);
    const quote = await measure(clients, ops, async (i) => {
      quotes[i] = await call('POST', '/x402/gate/quote', token, { gateId: gates[i], requestSha256: requestSha(i) });
    }, skip);
    const authorize = await measure(clients, ops, (i) => call('POST', '/x402/gate/authorize-payment', token, { gateId: gates[i], quoteId: quotes[i]!.quoteId, requestSha256: quotes[i]!.requestSha256 }), skip);
    let undecided = 0;
    const verify = await measure(clients, ops, async (i) => {
      const res = await call('POST', '/x402/gate/verify', token, { gateId: gates[i], evidence: { responseSha256: requestSha(-i) } }, [200, 202]);
      if (res.decision === null) undecided++;
    }, skip);
    const bareRoute = await measure(clients, ops, async () => (await fetch(`${bareBase}/ping`)).text(), new Set());
    const findById = await measure(clients, ops, () => probe.findOne({ _id: 'probe' }), new Set());
    results[`clients_${clients}`] = { ops, create, quote, authorizePayment: authorize, verify: { ...verify, answered202: undecided }, ceiling: { bareFastifyRoute: bareRoute, driverFindOneById: findById } };
  }
  const out = { benchmark: 'x402-hot-path', at: new Date().toISOString(), node: process.version, seededGates: SEED_GATES, latencyMs: results };
  mkdirSync('bench/results', { recursive: true });
  writeFileSync('bench/results/x402.json', `${JSON.stringify(out, null, 2)}\n`);
  console.log(JSON.stringify(out, null, 2));
} finally {
  await bare.close();
  await host.close();
}
