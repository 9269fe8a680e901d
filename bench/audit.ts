// Ledger audit benchmark (issue 22): seeds BENCH_AUDIT_RUNS runs' worth of ledger activity (100,000 by default)
// straight into the ledger collections as correctly chained postings (a credit per payer, then per run its escrow
// lock and, for 99 of 100 runs, its settlement release; the other run stays in progress with its reserve open and
// its run record stored), then times the first audit (no checkpoints: every posting read by `_id`, without the time
// budget so the whole catch-up is measured) and an incremental one after BENCH_AUDIT_NEW_RUNS more runs went
// through LedgerStore.apply. Prints `{ runs, firstAuditMs, incrementalAuditMs, postingsRead, ... }` as JSON.
//
//   node --import tsx bench/audit.ts              # BENCH_AUDIT_RUNS=20000 for a quicker look
// Env: BENCH_AUDIT_RUNS, BENCH_AUDIT_WALLETS (payers and payees each, 200), BENCH_AUDIT_NEW_RUNS (100),
//      BENCH_KEEP_DATA=1 (skip the cleanup).
import { MongoClient, type AnyBulkWriteOperation } from 'mongodb';
import { loadConfig } from '../src/config.ts';
import { entryIds } from '../src/domain/settlement.ts';
import { createLogger } from '../src/logger.ts';
import { connectRuntime, createRuntime } from '../src/runtime.ts';
import { escrowEntryIds } from '../src/services/escrow.ts';
import { auditLedger } from '../src/services/ledger-audit.ts';
import { accountOf, bucketMove, positionId, type Bucket, type PostingDoc } from '../src/store/ledger.ts';
import { settlementIdFor } from '../src/store/settlements.ts';
import { benchService, dropBenchData, MONGO_BASE } from './production-service.ts';

function envInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw.replace(/_/g, ''));
  if (!Number.isSafeInteger(value) || value < 1) throw new Error(`${name} must be a positive integer, got "${raw}"`);
  return value;
}

const RUNS = envInt('BENCH_AUDIT_RUNS', 100_000);
const WALLETS = envInt('BENCH_AUDIT_WALLETS', 200);
const NEW_RUNS = envInt('BENCH_AUDIT_NEW_RUNS', 100);
const OPEN_EVERY = 100;
const TENANT = 'ten_bench_audit';
const CURRENCY = 'USD';
const INSERT_BATCH = 5_000;
const log = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}`);

const payerOf = (i: number) => `bench:agent:payer-${i % WALLETS}`;
const payeeOf = (i: number) => `bench:agent:payee-${(i * 7) % WALLETS}`;
const amountOf = (i: number) => 100 + (i % 50);
const runIdOf = (i: number) => `run_bench${String(i).padStart(8, '0')}`;

/** Appends postings to accounts' chains in memory, each at the next position with its running balance. */
class Chains {
  private readonly heads = new Map<string, { seq: number; balance: number }>();
  readonly postings: PostingDoc[] = [];
  post(walletId: string, bucket: Bucket, delta: number, entryId: string, kind: string, leg: number, at: Date): void {
    const account = accountOf(walletId, CURRENCY, bucket);
    const head = this.heads.get(account) ?? { seq: 0, balance: 0 };
    const next = { seq: head.seq + 1, balance: head.balance + delta };
    if (next.balance < 0) throw new Error(`seed would overdraw ${account}`);
    this.heads.set(account, next);
    this.postings.push({
      _id: positionId(account, next.seq),
      account,
      walletId,
      currency: CURRENCY,
      bucket,
      seq: next.seq,
      entryId,
      attempt: 1,
      leg,
      delta,
      balanceAfter: next.balance,
      refused: false,
      kind,
      at,
    });
  }
}

async function seed(mongo: MongoClient, dbName: string): Promise<{ postings: number; openRuns: number }> {
  const db = mongo.db(dbName);
  const chains = new Chains();
  const at = new Date();
  const perPayer = Math.ceil(RUNS / WALLETS) * 150 + 1_000_000;
  const wallets = new Set<string>();
  for (let w = 0; w < WALLETS; w++) {
    const payer = payerOf(w);
    wallets.add(payer);
    chains.post(payer, 'available', perPayer, `credit:${payer}:seed`, 'credit', 0, at);
  }
  const runs: Array<Record<string, unknown>> = [];
  for (let i = 0; i < RUNS; i++) {
    const [payer, payee, amount, runId] = [payerOf(i), payeeOf(i), amountOf(i), runIdOf(i)];
    wallets.add(payee);
    const lock = escrowEntryIds.lock(runId);
    chains.post(payer, 'available', -amount, lock, 'escrow_lock', 0, at);
    chains.post(payer, 'escrow', amount, lock, 'escrow_lock', 1, at);
    if (i % OPEN_EVERY === 0) {
      runs.push({
        _id: runId,
        tenantId: TENANT,
        agentId: payee,
        terms: {},
        settlement: { payerAgentId: payer, amount, currency: CURRENCY, holdbackBps: 0, disputeWindowSeconds: 3600 },
        status: 'in_progress',
        verdict: null,
        artifactId: null,
        createdAt: at,
        finalizeRequestedAt: null,
        finalHead: null,
        finalizedAt: null,
        finalizeError: null,
      });
      continue;
    }
    const release = entryIds.release(settlementIdFor(runId));
    chains.post(payer, 'escrow', -amount, release, 'settlement_release', 0, at);
    chains.post(payee, 'available', amount, release, 'settlement_release', 1, at);
  }
  log(`seeding ${chains.postings.length} postings, ${wallets.size} wallets, ${runs.length} open runs`);
  const started = Date.now();
  await db
    .collection('wallets')
    .insertMany([...wallets].map((_id) => ({ _id, tenantId: TENANT, kind: 'agent', createdAt: at })) as never[]);
  await db
    .collection('wallet_currencies')
    .insertMany([...wallets].map((w) => ({ _id: `${w}#cur#1`, walletId: w, currency: CURRENCY })) as never[]);
  for (let i = 0; i < runs.length; i += INSERT_BATCH)
    await db.collection('runs').insertMany(runs.slice(i, i + INSERT_BATCH) as never[], { ordered: false });
  const postings = db.collection<PostingDoc>('ledger_postings');
  // A few batches in flight at once: FerretDB costs about the same per command, whatever it carries.
  let next = 0;
  await Promise.all(
    Array.from({ length: 3 }, async () => {
      while (next < chains.postings.length) {
        const slice = chains.postings.slice(next, (next += INSERT_BATCH));
        await postings.bulkWrite(
          slice.map((document) => ({ insertOne: { document } }) as AnyBulkWriteOperation<PostingDoc>),
          { ordered: false },
        );
      }
    }),
  );
  log(`seeded in ${Date.now() - started} ms`);
  return { postings: chains.postings.length, openRuns: runs.length };
}

async function main(): Promise<void> {
  const service = benchService('audit');
  const mongo = new MongoClient(`${MONGO_BASE}/${service.dbName}`);
  await mongo.connect();
  const config = loadConfig(service.env);
  const runtime = createRuntime(config, createLogger({ ...config, logLevel: 'warn' }, 'bench'));
  try {
    const seeded = await seed(mongo, service.dbName);
    await connectRuntime(runtime, 10_000);

    log('first audit (no checkpoints)');
    const first = await auditLedger(runtime, { budgetMs: 3_600_000 });
    log(`first audit: ${first.tookMs} ms, ${first.checked.postingsRead} postings, clean ${first.clean}`);
    if (!first.clean) log(JSON.stringify(first.violations.slice(0, 5)));

    // New activity through the ledger itself: each new run locks and is released.
    for (let i = RUNS; i < RUNS + NEW_RUNS; i++) {
      const [payer, payee, amount, runId] = [payerOf(i), payeeOf(i), amountOf(i), runIdOf(i)];
      const settlementId = settlementIdFor(runId);
      await runtime.stores.ledger.apply({
        _id: escrowEntryIds.lock(runId),
        tenantId: TENANT,
        kind: 'escrow_lock',
        currency: CURRENCY,
        legs: bucketMove(payer, 'available', 'escrow', amount),
        ref: { runId, generation: '1' },
      });
      await runtime.stores.ledger.apply({
        _id: entryIds.release(settlementId),
        tenantId: TENANT,
        kind: 'settlement_release',
        currency: CURRENCY,
        legs: [
          { walletId: payer, bucket: 'escrow', delta: -amount },
          { walletId: payee, bucket: 'available', delta: amount },
        ],
        ref: { settlementId, runId },
      });
    }
    const incremental = await auditLedger(runtime);
    log(
      `incremental audit: ${incremental.tookMs} ms, ${incremental.checked.postingsRead} postings, clean ${incremental.clean}`,
    );
    console.log(
      JSON.stringify(
        {
          runs: RUNS,
          wallets: first.checked.wallets,
          postingsSeeded: seeded.postings,
          openReserves: incremental.checked.openReserves,
          firstAuditMs: first.tookMs,
          firstPostingsRead: first.checked.postingsRead,
          newRuns: NEW_RUNS,
          incrementalAuditMs: incremental.tookMs,
          postingsRead: incremental.checked.postingsRead,
          clean: first.clean && incremental.clean,
        },
        null,
        2,
      ),
    );
  } finally {
    await runtime.close();
    if (process.env.BENCH_KEEP_DATA !== '1') await dropBenchData(service, mongo, log);
    await mongo.close();
  }
}

await main();
