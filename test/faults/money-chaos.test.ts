import { randomBytes } from 'node:crypto';
import { MongoClient } from 'mongodb';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { newId } from '../../src/domain/crypto.ts';
import { signEvents } from '../../src/domain/event-chain.ts';
import { call, createTenant, credit, eventually, registerAgent, ServiceProcess, serviceEnv, type Agent, type Answer, type Tenant } from './service.ts';

// Issue 22's chaos run: concurrent clients drive run money flows (create with escrow, events, finalize, settle,
// some with settle-time terms) through an API process and two workers while a seeded killer SIGKILLs one of them
// every second or two and starts it again. Clients behave as honest ones do: a call that got no definitive answer
// is repeated with the same Idempotency-Key. Bounded in time; then the money must add up exactly: every flow a
// client finished was paid once, no run was minted twice, no escrow is left behind.

const LOAD_MS = 25_000;
const CLIENTS = 6;
const AMOUNT = 100;

/** mulberry32: a small seeded generator, so a failing run can be replayed with its seed. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('money under SIGKILL of the API and the workers, with clients retrying', () => {
  const processes: ServiceProcess[] = [];
  afterAll(async () => {
    for (const p of processes) await p.stop().catch(() => undefined);
  });

  it('pays every finished flow once, mints nothing twice and leaves no escrow behind', async () => {
    const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 1_000_000);
    const random = seeded(seed);
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_chaos_${randomBytes(4).toString('hex')}`;
    const env = serviceEnv(mongoUrl.toString(), inject('redisUrl'), { WORKER_CONCURRENCY: '4', SWEEP_INTERVAL_MS: '500', SWEEP_STALE_AFTER_MS: '1000' });
    const admin = env.SERVICE_ADMIN_KEY!;
    let api = await ServiceProcess.start('api', env);
    const workers = [await ServiceProcess.start('worker', env), await ServiceProcess.start('worker', env)];
    processes.push(api, ...workers);

    const tenant: Tenant = await createTenant(api.url, admin);
    const payers: Agent[] = [];
    const payees: Agent[] = [];
    for (let i = 0; i < CLIENTS; i++) {
      payers.push(await registerAgent(api.url, tenant));
      payees.push(await registerAgent(api.url, tenant));
      await credit(api.url, admin, payers[i]!.agentId, 1_000_000);
    }

    /** Calls until a definitive answer: no answer, 5xx and 409 in progress are repeated with the same key. */
    let stopAt = Date.now() + LOAD_MS + 150_000;
    const definitive = async (method: string, path: string, body: unknown, key: string | null): Promise<Answer> => {
      for (let attempt = 0; ; attempt++) {
        const answer = await call(api.url, method, path, { body, headers: { ...tenant.auth, ...(key ? { 'idempotency-key': key } : {}) }, timeoutMs: 10_000 });
        const retry = answer.status === 0 || answer.status >= 500 || answer.status === 429 || (answer.status === 409 && answer.body?.code === 'IDEMPOTENCY_IN_PROGRESS');
        if (!retry) return answer;
        if (Date.now() > stopAt) throw new Error(`${method} ${path}: no definitive answer (last ${answer.status} ${JSON.stringify(answer.body)})`);
        await sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 4)));
      }
    };

    const created: string[] = [];
    const finished: string[] = [];
    const refused: string[] = [];
    let loading = true;
    const client = async (i: number) => {
      const payer = payers[i]!;
      const worker = payees[i]!;
      for (let n = 0; loading; n++) {
        const termsAtSettle = n % 3 === 2; // a third get their terms only when settled
        const settlement = { payerAgentId: payer.agentId, amount: AMOUNT, currency: 'USD', holdbackBps: 0, disputeWindowSeconds: 3600 };
        const runAnswer = await definitive('POST', '/v1/runs', { agentId: worker.agentId, terms: { accuracy: { min: 0.9 } }, ...(termsAtSettle ? {} : { settlement }) }, newId('k'));
        expect(runAnswer.status, JSON.stringify(runAnswer.body)).toBe(201);
        const runId = runAnswer.body.runId as string;
        created.push(runId);
        const [event] = signEvents([{ id: newId('evt'), runId, type: 'metric', at: new Date().toISOString(), payload: { name: 'accuracy', value: 1 } }], { seq: 0, chainHash: null }, worker.privateKey, worker.keyId);
        expect((await definitive('POST', `/v1/runs/${runId}/events`, { event }, newId('k'))).status).toBe(201);
        expect((await definitive('POST', `/v1/runs/${runId}/finalize`, undefined, null)).status).toBe(202);
        await eventually(async () => (await call(api.url, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized', 120_000, `run ${runId} finalized`, 200);
        const settled = await definitive('POST', `/v1/runs/${runId}/settle`, termsAtSettle ? { settlement } : {}, newId('k'));
        if (settled.status === 202) finished.push(runId);
        else refused.push(`${runId}: ${settled.status} ${JSON.stringify(settled.body)}`);
      }
    };

    const kills: string[] = [];
    const killer = async () => {
      while (loading) {
        await sleep(1_000 + random() * 1_500);
        if (!loading) break;
        const victim = random() < 0.4 ? 'api' : random() < 0.5 ? 'worker0' : 'worker1';
        if (victim === 'api') {
          await api.kill('SIGKILL');
          api = await ServiceProcess.start('api', env);
          processes.push(api);
        } else {
          const index = victim === 'worker0' ? 0 : 1;
          await workers[index]!.kill('SIGKILL');
          workers[index] = await ServiceProcess.start('worker', env);
          processes.push(workers[index]!);
        }
        kills.push(victim);
      }
    };

    const clients = Array.from({ length: CLIENTS }, (_, i) => client(i));
    const chaos = killer();
    await sleep(LOAD_MS);
    loading = false;
    await chaos;
    stopAt = Date.now() + 150_000;
    await Promise.all(clients);
    console.log(JSON.stringify({ seed, kills: kills.length, created: created.length, finished: finished.length, refused }));
    expect(kills.length).toBeGreaterThan(5);
    expect(refused).toEqual([]);

    // Every settlement the clients started completes (the sweepers finish what the kills cut short).
    const client2 = new MongoClient(mongoUrl.toString());
    try {
      const db = client2.db();
      await eventually(async () => {
        const settlements = await db.collection<any>('settlements').find({}).toArray();
        return settlements.length === finished.length && settlements.every((s) => s.view?.status === 'completed');
      }, 120_000, 'every settlement completed', 500);
      // No run minted twice: the tenant's runs are exactly those the clients were told of.
      const runs = await db.collection<any>('runs').find({ tenantId: tenant.tenantId }).toArray();
      expect(runs.map((r) => r._id).sort()).toEqual([...created].sort());
      // Paid once each, and nothing left in escrow once every reserve is captured and paid out (or returned).
      await eventually(async () => {
        const answers = await Promise.all(payers.map((p) => call(api.url, 'GET', `/v1/wallets/${encodeURIComponent(p.agentId)}`, { headers: tenant.auth })));
        return answers.every((a) => a.status === 200 && a.body.balances.USD.escrow === 0);
      }, 120_000, 'every escrow empty', 500);
      for (let i = 0; i < CLIENTS; i++) {
        const paidRuns = finished.filter((runId) => runs.find((r) => r._id === runId)?.agentId === payees[i]!.agentId).length;
        const payer = await call(api.url, 'GET', `/v1/wallets/${encodeURIComponent(payers[i]!.agentId)}`, { headers: tenant.auth });
        const payee = await call(api.url, 'GET', `/v1/wallets/${encodeURIComponent(payees[i]!.agentId)}`, { headers: tenant.auth });
        expect(payer.body.balances.USD, `payer ${i}`).toEqual({ available: 1_000_000 - paidRuns * AMOUNT, escrow: 0 });
        expect(payee.body.balances.USD, `payee ${i}`).toEqual({ available: paidRuns * AMOUNT, escrow: 0 });
      }
    } finally {
      await client2.close();
    }
  });
});
