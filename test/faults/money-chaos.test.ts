import { createHash, randomBytes } from 'node:crypto';
import { MongoClient } from 'mongodb';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { newId } from '../../src/domain/crypto.ts';
import { signEvents } from '../../src/domain/event-chain.ts';
import { settlementStatuses } from './audit.ts';
import {
  call,
  credit,
  eventually,
  must,
  registerAgent,
  ServiceProcess,
  serviceEnv,
  type Agent,
  type Answer,
  type Tenant,
} from './service.ts';

// Issue 22's chaos run: concurrent clients drive run money flows (create with escrow, events, finalize, settle,
// some with settle-time terms), x402 paid calls (gate create, quote, authorize-payment, verify) and payment sessions
// (open, three charges, close: issue 23) through an API
// process and two workers while a seeded killer SIGKILLs one of them every second or two and starts it again. Clients behave as honest ones do: a call that got no definitive answer
// is repeated with the same Idempotency-Key. Bounded in time; then the money must add up exactly: every flow a
// client finished was paid once, no run was minted twice, no escrow is left behind.

/** The load runs at least this long and until MIN_KILLS kills, at most MAX_LOAD_MS (a restart takes longer on a busy machine). */
const LOAD_MS = 25_000;
const MIN_KILLS = 8;
const MAX_LOAD_MS = 75_000;
const CLIENTS = 6;
const AMOUNT = 100;
const GATE_AMOUNT = 30;

/** A tenant whose key drives runs and gates. */
async function chaosTenant(base: string, adminKey: string): Promise<Tenant> {
  const admin = { authorization: `Bearer ${adminKey}` };
  const { tenantId } = await must(base, 'POST', '/ops/tenants', 201, {
    headers: { ...admin, 'idempotency-key': newId('k') },
    body: { name: 'chaos' },
  });
  const { token } = await must(base, 'POST', '/ops/api-keys', 201, {
    headers: { ...admin, 'idempotency-key': newId('k') },
    body: { tenantId, scopes: ['agents:write', 'runs:write', 'wallets:write', 'x402:write'] },
  });
  return { tenantId, token, auth: { authorization: `Bearer ${token}` } };
}

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
    const env = serviceEnv(mongoUrl.toString(), inject('redisUrl'), {
      WORKER_CONCURRENCY: '4',
      SWEEP_INTERVAL_MS: '500',
      SWEEP_STALE_AFTER_MS: '1000',
    });
    const admin = env.SERVICE_ADMIN_KEY!;
    let api = await ServiceProcess.start('api', env);
    const workers = [await ServiceProcess.start('worker', env), await ServiceProcess.start('worker', env)];
    processes.push(api, ...workers);

    const tenant: Tenant = await chaosTenant(api.url, admin);
    const payers: Agent[] = [];
    const payees: Agent[] = [];
    for (let i = 0; i < CLIENTS; i++) {
      payers.push(await registerAgent(api.url, tenant));
      payees.push(await registerAgent(api.url, tenant));
      await credit(api.url, admin, payers[i]!.agentId, 1_000_000);
    }

    /** Calls until a definitive answer: no answer, 5xx and 409 in progress are repeated with the same key. */
    let stopAt = Date.now() + MAX_LOAD_MS + 150_000;
    const definitive = async (method: string, path: string, body: unknown, key: string | null): Promise<Answer> => {
      for (let attempt = 0; ; attempt++) {
        const answer = await call(api.url, method, path, {
          body,
          headers: { ...tenant.auth, ...(key ? { 'idempotency-key': key } : {}) },
          timeoutMs: 10_000,
        });
        const retry =
          answer.status === 0 ||
          answer.status >= 500 ||
          answer.status === 429 ||
          (answer.status === 409 && answer.body?.code === 'IDEMPOTENCY_IN_PROGRESS');
        if (!retry) return answer;
        if (Date.now() > stopAt)
          throw new Error(
            `${method} ${path}: no definitive answer (last ${answer.status} ${JSON.stringify(answer.body)})`,
          );
        await sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 4)));
      }
    };

    const created: string[] = [];
    const finished: string[] = [];
    const refused: string[] = [];
    /** Gates per client whose verify was answered: paid once each. */
    const gatesPaid = new Map<number, string[]>();
    let loading = true;
    /** One paid call through the x402 gate, each step repeated with its own key until it is definitive. */
    const paidCall = async (i: number) => {
      const gate = await definitive(
        'POST',
        '/x402/gate/create',
        { payerAgentId: payers[i]!.agentId, payeeAgentId: payees[i]!.agentId, amount: GATE_AMOUNT, currency: 'USD' },
        newId('k'),
      );
      expect(gate.status, JSON.stringify(gate.body)).toBe(201);
      const gateId = gate.body.gateId as string;
      const requestSha256 = createHash('sha256').update(gateId).digest('hex');
      const quote = await definitive('POST', '/x402/gate/quote', { gateId, requestSha256 }, newId('k'));
      expect(quote.status, JSON.stringify(quote.body)).toBe(200);
      const authorized = await definitive(
        'POST',
        '/x402/gate/authorize-payment',
        { gateId, quoteId: quote.body.quoteId, requestSha256 },
        newId('k'),
      );
      expect(authorized.status, JSON.stringify(authorized.body)).toBe(200);
      const verified = await definitive(
        'POST',
        '/x402/gate/verify',
        { gateId, evidence: { responseSha256: requestSha256 } },
        newId('k'),
      );
      expect([200, 202], JSON.stringify(verified.body)).toContain(verified.status);
      gatesPaid.set(i, [...(gatesPaid.get(i) ?? []), gateId]);
    };
    /** Sessions per client and what they charged in all: paid once each, the rest of each budget returned. */
    const sessionsCharged = new Map<number, number>();
    const sessions: string[] = [];
    /** One payment session: open, three paid calls (each its own payment id, repeated until definitive), close. */
    const sessionCalls = async (i: number) => {
      const opened = await definitive(
        'POST',
        '/x402/sessions',
        {
          payerAgentId: payers[i]!.agentId,
          payeeAgentIds: [payees[i]!.agentId],
          currency: 'USD',
          budget: 100,
          maxPerCall: 20,
        },
        newId('k'),
      );
      expect(opened.status, JSON.stringify(opened.body)).toBe(201);
      const sessionId = opened.body.sessionId as string;
      for (let c = 0; c < 3; c++) {
        const charged = await definitive(
          'POST',
          `/x402/sessions/${sessionId}/charges`,
          { paymentId: newId('pay'), payeeAgentId: payees[i]!.agentId, amount: 7 },
          null,
        );
        expect(charged.status, JSON.stringify(charged.body)).toBe(201);
      }
      const closed = await definitive('POST', `/x402/sessions/${sessionId}/close`, {}, null);
      expect(closed.status, JSON.stringify(closed.body)).toBe(200);
      expect(closed.body).toMatchObject({ status: 'closed', spent: 21, refunded: 79 });
      sessions.push(sessionId);
      sessionsCharged.set(i, (sessionsCharged.get(i) ?? 0) + 21);
    };
    const client = async (i: number) => {
      const payer = payers[i]!;
      const worker = payees[i]!;
      for (let n = 0; loading; n++) {
        if (n % 4 === 3) {
          await sessionCalls(i);
          continue;
        }
        if (n % 2 === 1) {
          await paidCall(i);
          continue;
        }
        const termsAtSettle = n % 3 === 2; // a third get their terms only when settled
        const settlement = {
          payerAgentId: payer.agentId,
          amount: AMOUNT,
          currency: 'USD',
          holdbackBps: 0,
          disputeWindowSeconds: 3600,
        };
        const runAnswer = await definitive(
          'POST',
          '/v1/runs',
          { agentId: worker.agentId, terms: { accuracy: { min: 0.9 } }, ...(termsAtSettle ? {} : { settlement }) },
          newId('k'),
        );
        expect(runAnswer.status, JSON.stringify(runAnswer.body)).toBe(201);
        const runId = runAnswer.body.runId as string;
        created.push(runId);
        const [event] = signEvents(
          [
            {
              id: newId('evt'),
              runId,
              type: 'metric',
              at: new Date().toISOString(),
              payload: { name: 'accuracy', value: 1 },
            },
          ],
          { seq: 0, chainHash: null },
          worker.privateKey,
          worker.keyId,
        );
        expect((await definitive('POST', `/v1/runs/${runId}/events`, { event }, newId('k'))).status).toBe(201);
        expect((await definitive('POST', `/v1/runs/${runId}/finalize`, undefined, null)).status).toBe(202);
        await eventually(
          async () =>
            (await call(api.url, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized',
          120_000,
          `run ${runId} finalized`,
          200,
        );
        const settled = await definitive(
          'POST',
          `/v1/runs/${runId}/settle`,
          termsAtSettle ? { settlement } : {},
          newId('k'),
        );
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
    const loadStarted = Date.now();
    while ((Date.now() - loadStarted < LOAD_MS || kills.length < MIN_KILLS) && Date.now() - loadStarted < MAX_LOAD_MS)
      await sleep(250);
    loading = false;
    await chaos;
    stopAt = Date.now() + 150_000;
    await Promise.all(clients);
    const gates = [...gatesPaid.values()].flat();
    console.log(
      JSON.stringify({
        seed,
        kills: kills.length,
        created: created.length,
        finished: finished.length,
        gates: gates.length,
        sessions: sessions.length,
        refused,
      }),
    );
    expect(kills.length).toBeGreaterThanOrEqual(3); // the run did meet crashes (MIN_KILLS unless the machine crawled)
    expect(refused).toEqual([]);

    // Every settlement the clients started completes (the sweepers finish what the kills cut short).
    const client2 = new MongoClient(mongoUrl.toString());
    try {
      const db = client2.db();
      await eventually(
        async () => {
          const statuses = [...(await settlementStatuses(db)).values()];
          return (
            statuses.length === finished.length + gates.length + sessions.length &&
            statuses.every((status) => status === 'completed')
          );
        },
        120_000,
        'every settlement completed',
        500,
      );
      // No run minted twice: the tenant's runs are exactly those the clients were told of.
      const runs = await db.collection<any>('runs').find({ tenantId: tenant.tenantId }).toArray();
      expect(runs.map((r) => r._id).sort()).toEqual([...created].sort());
      // Paid once each, and nothing left in escrow once every reserve is captured and paid out (or returned).
      await eventually(
        async () => {
          const answers = await Promise.all(
            payers.map((p) =>
              call(api.url, 'GET', `/v1/wallets/${encodeURIComponent(p.agentId)}`, { headers: tenant.auth }),
            ),
          );
          return answers.every((a) => a.status === 200 && a.body.balances.USD.escrow === 0);
        },
        120_000,
        'every escrow empty',
        500,
      );
      for (let i = 0; i < CLIENTS; i++) {
        const paidRuns = finished.filter(
          (runId) => runs.find((r) => r._id === runId)?.agentId === payees[i]!.agentId,
        ).length;
        const paid = paidRuns * AMOUNT + (gatesPaid.get(i)?.length ?? 0) * GATE_AMOUNT + (sessionsCharged.get(i) ?? 0);
        const payer = await call(api.url, 'GET', `/v1/wallets/${encodeURIComponent(payers[i]!.agentId)}`, {
          headers: tenant.auth,
        });
        const payee = await call(api.url, 'GET', `/v1/wallets/${encodeURIComponent(payees[i]!.agentId)}`, {
          headers: tenant.auth,
        });
        expect(payer.body.balances.USD, `payer ${i}`).toEqual({ available: 1_000_000 - paid, escrow: 0 });
        expect(payee.body.balances.USD, `payee ${i}`).toEqual({ available: paid, escrow: 0 });
      }
      // No gate minted twice either: the tenant's gates are exactly those the clients were told of.
      const storedGates = await db.collection<any>('x402_gates').find({ tenantId: tenant.tenantId }).toArray();
      expect(storedGates.map((g) => g._id).sort()).toEqual([...gates].sort());
      for (const gateId of gates) {
        const state = await call(api.url, 'GET', `/x402/gate/${gateId}`, { headers: tenant.auth });
        expect(state.body.status, gateId).toBe('released');
      }
      // And the service's own audit of the books agrees: nothing moved twice, no reserve left open or overdue.
      let audit: Answer | null = null;
      await eventually(
        async () => {
          audit = await call(api.url, 'GET', '/ops/ledger/audit', {
            headers: { authorization: `Bearer ${admin}` },
            timeoutMs: 60_000,
          });
          return audit.status === 200 && audit.body.complete === true; // 409 while the sweeper's own audit runs
        },
        120_000,
        'a complete ledger audit',
        1_000,
      );
      expect(audit!.body.violations).toEqual([]);
      expect(audit!.body.clean).toBe(true);
    } finally {
      await client2.close();
    }
  });
});
