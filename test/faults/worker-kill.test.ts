import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { auditDatabase } from './audit.ts';
import { CountingReceiver } from './receiver.ts';
import {
  createRunWithEvidence,
  createTenant,
  credit,
  eventually,
  must,
  registerAgent,
  ServiceProcess,
  serviceEnv,
} from './service.ts';

const RUNS = 200;
const CONCURRENCY = 8;

async function pool<T>(items: T[], width: number, work: (item: T) => Promise<void>): Promise<void> {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (queue.length > 0) await work(queue.shift()!);
    }),
  );
}

describe('a worker process killed with SIGKILL mid-batch, twice, and restarted', () => {
  const processes: ServiceProcess[] = [];
  const receiver = new CountingReceiver();
  beforeAll(async () => {
    await receiver.start();
  });
  afterAll(async () => {
    for (const p of processes) await p.stop().catch(() => undefined);
    await receiver.close();
  });

  it(`finishes ${RUNS} runs through finalize and settle with every effect once and every event delivered`, async () => {
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_kill_${randomBytes(4).toString('hex')}`;
    const env = serviceEnv(mongoUrl.toString(), inject('redisUrl'), { WORKER_CONCURRENCY: '8' });
    const api = await ServiceProcess.start('api', env);
    processes.push(api);
    const base = api.url;
    const admin = env.SERVICE_ADMIN_KEY!;
    const tenant = await createTenant(base, admin);
    const hook = await must(base, 'POST', '/v1/webhooks', 201, {
      headers: tenant.auth,
      body: { url: receiver.url, events: ['run.finalized', 'settlement.completed', 'settlement.held'] },
    });
    receiver.secret = hook.secret;
    const payer = await registerAgent(base, tenant);
    const payee = await registerAgent(base, tenant);
    await credit(base, admin, payer.agentId, RUNS * 1_000);
    const runIds: string[] = [];
    await pool(
      Array.from({ length: RUNS }, (_, i) => i),
      CONCURRENCY,
      async (i) => {
        // Two in three pass (some with a holdback that stays in escrow), one in three fails and is held.
        runIds.push(
          await createRunWithEvidence(base, tenant, payer, payee, {
            pass: i % 3 !== 0,
            amount: 100 + i,
            holdbackBps: i % 5 === 0 ? 1_000 : 0,
          }),
        );
      },
    );

    const kills: Array<{ phase: string; signal: string | null; deliveredBefore: number }> = [];
    const killWorkerWhen = async (phase: string, ready: () => boolean, current: ServiceProcess) => {
      await eventually(ready, 120_000, `${phase} progress before the kill`, 20);
      const deliveredBefore = receiver.seen.size;
      await current.kill('SIGKILL');
      kills.push({ phase, signal: current.child.signalCode, deliveredBefore });
      const next = await ServiceProcess.start('worker', env);
      processes.push(next);
      return next;
    };

    // Finalize: kill the worker when a third of the runs are finalized, jobs still queued and running.
    let worker = await ServiceProcess.start('worker', env);
    processes.push(worker);
    await pool(runIds, CONCURRENCY, async (runId) => {
      await must(base, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
    });
    worker = await killWorkerWhen('finalize', () => receiver.count('run.finalized') >= RUNS / 3, worker);
    await eventually(() => receiver.count('run.finalized') === RUNS, 180_000, 'every run.finalized delivered', 200);

    // Settle: the same, a third of the way through the decisions.
    await pool(runIds, CONCURRENCY, async (runId) => {
      await must(base, 'POST', `/v1/runs/${runId}/settle`, 202, {
        headers: { ...tenant.auth, 'idempotency-key': `settle-${runId}` },
        body: {},
      });
    });
    worker = await killWorkerWhen('settle', () => receiver.count('settlement.*') >= RUNS / 3, worker);
    await eventually(() => receiver.count('settlement.*') === RUNS, 180_000, 'every settlement event delivered', 200);

    // Every effect once, every currency balanced, nothing pending: read from the database itself.
    const audit = await auditDatabase(env.MONGO_URL!, runIds);
    const expectedPass = Array.from({ length: RUNS }, (_, i) => i).filter((i) => i % 3 !== 0).length;
    expect(audit.verdicts).toEqual({ pass: expectedPass, fail: RUNS - expectedPass });
    expect(audit.settlements).toEqual({ completed: expectedPass, held: RUNS - expectedPass });

    // Every outbox event reached the receiver, signed; nothing else did.
    const outboxIds = audit.outboxEvents.map((e) => e._id).sort();
    expect(outboxIds).toHaveLength(2 * RUNS);
    expect([...receiver.seen.keys()].sort()).toEqual(outboxIds);
    expect(receiver.badSignatures).toBe(0);
    expect(kills.map((k) => k.signal)).toEqual(['SIGKILL', 'SIGKILL']);
    // Receivers dedupe by id, so a repeat after a kill is allowed; it is counted and reported, not hidden.
    console.log(
      `fault figures (worker kill -9): ${JSON.stringify({ runs: RUNS, kills, events: outboxIds.length, deliveries: [...receiver.seen.values()].reduce((a, b) => a + b, 0), duplicates: receiver.duplicates, audit: { verdicts: audit.verdicts, settlements: audit.settlements, credited: audit.credited, heldInAccounts: audit.held } })}`,
    );
  }, 600_000);
});
