import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it, onTestFailed } from 'vitest';
import { auditDatabase } from './audit.ts';
import { CountingReceiver } from './receiver.ts';
import { RedisCluster, type RedisServer } from './servers.ts';
import {
  call,
  createRunWithEvidence,
  createTenant,
  credit,
  eventually,
  must,
  registerAgent,
  ServiceProcess,
  serviceEnv,
} from './service.ts';

const RUNS = 20;

/** The master currently serving `slot`, from `cluster nodes` as a live node sees it. */
async function masterOfSlot(cluster: RedisCluster, slot: number): Promise<RedisServer> {
  const alive = cluster.nodes.filter((n) => n.pid !== undefined);
  const lines = (await cluster.cli(alive[0]!.port, 'cluster', 'nodes'))
    .split('\n')
    .filter((l) => l.includes('master') && !l.includes('fail'));
  for (const line of lines) {
    const fields = line.split(' ');
    const port = Number(fields[1]!.split(':')[1]!.split('@')[0]);
    const ranges = fields.slice(8).filter((r) => /^\d/.test(r));
    if (
      ranges.some((r) => {
        const [a, b = a] = r.split('-').map(Number);
        return slot >= a! && slot <= b!;
      })
    ) {
      return cluster.nodes.find((n) => n.port === port)!;
    }
  }
  throw new Error(`no master serves slot ${slot}`);
}

describe('on a six-node Redis Cluster, with the master of the queues killed mid-flow', () => {
  let cluster: RedisCluster;
  const processes: ServiceProcess[] = [];
  const receiver = new CountingReceiver();
  beforeAll(async () => {
    cluster = await RedisCluster.start();
    await receiver.start();
  });
  afterAll(async () => {
    for (const p of processes) await p.stop().catch(() => undefined);
    await receiver.close();
    await cluster?.destroy(); // every node, also when the test failed
  });

  it('runs the whole flow, fails over, and completes with nothing lost', async () => {
    onTestFailed(() => {
      console.log(
        `receiver: ${receiver.count('run.finalized')} run.finalized, ${receiver.count('settlement.*')} settlement events`,
      );
      for (const p of processes) console.log(`--- ${p.mode} log tail ---\n${p.logs.slice(-20_000)}`);
    });
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_cluster_${randomBytes(4).toString('hex')}`;
    const env = serviceEnv(mongoUrl.toString(), cluster.url, { LOG_LEVEL: process.env.FAULT_LOG_LEVEL ?? 'warn' });
    const api = await ServiceProcess.start('api', env);
    processes.push(api);
    processes.push(await ServiceProcess.start('worker', env));
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
    await credit(base, admin, payer.agentId, 100_000);

    // Idempotency and rate limits work across slots: a replay, and the limit headers.
    const key = `cluster-${randomBytes(4).toString('hex')}`;
    const first = await call(base, 'POST', '/ops/tenants', {
      headers: { authorization: `Bearer ${admin}`, 'idempotency-key': key },
      body: { name: 'replayed' },
    });
    const again = await call(base, 'POST', '/ops/tenants', {
      headers: { authorization: `Bearer ${admin}`, 'idempotency-key': key },
      body: { name: 'replayed' },
    });
    expect(first.status).toBe(201);
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.body).toEqual(first.body);
    expect(first.headers.get('ratelimit')).toMatch(/^"default";r=\d+;t=\d+$/);

    const runIds: string[] = [];
    for (let i = 0; i < RUNS; i++)
      runIds.push(await createRunWithEvidence(base, tenant, payer, payee, { pass: i % 2 === 0, amount: 100 + i }));
    const half = runIds.slice(0, RUNS / 2);
    const rest = runIds.slice(RUNS / 2);

    // The first half finalized and settling; then the master holding the finalize queue is killed (each queue has a
    // hash tag of its own on a cluster: src/queues/index.ts QueueLayout).
    for (const runId of half) await must(base, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
    await eventually(() => receiver.count('run.finalized') >= RUNS / 4, 60_000, 'some runs finalized before the kill');
    const queueSlot = Number(
      (await cluster.cli(cluster.nodes[0]!.port, 'cluster', 'keyslot', `{${env.REDIS_PREFIX}:bull:finalize}`)).trim(),
    );
    const victim = await masterOfSlot(cluster, queueSlot);
    await victim.down(); // SIGKILL
    const killedAt = Date.now();

    // The rest of the flow goes on through the failover (503s are retried by `must`, with the same keys).
    for (const runId of rest) await must(base, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
    await eventually(() => receiver.count('run.finalized') === RUNS, 120_000, 'every run.finalized delivered', 200);
    for (const runId of runIds)
      await must(base, 'POST', `/v1/runs/${runId}/settle`, 202, {
        headers: { ...tenant.auth, 'idempotency-key': `settle-${runId}` },
        body: {},
      });
    await eventually(() => receiver.count('settlement.*') === RUNS, 120_000, 'every settlement event delivered', 200);
    const completedAfterKillMs = Date.now() - killedAt;

    // A replica took over the slot.
    const newMaster = await masterOfSlot(cluster, queueSlot);
    expect(newMaster.port).not.toBe(victim.port);

    const audit = await auditDatabase(env.MONGO_URL!, runIds);
    expect(audit.settlements).toEqual({ completed: RUNS / 2, held: RUNS / 2 });
    expect([...receiver.seen.keys()].sort()).toEqual(audit.outboxEvents.map((e) => e._id).sort());
    expect(receiver.badSignatures).toBe(0);
    // Paid calls through the x402 gate after the failover. Verify waits for its job's completion event, which it
    // must hear on the cluster (a cluster client, the queue's hash-tagged prefix): then it answers the decision. A
    // 202 is a fair answer while the worker's blocking connection is still catching up after the failover, so each
    // call's decision is awaited, and one of a few calls must be answered with it (one that hears no event never is).
    const x402 = {
      authorization: `Bearer ${(await must(base, 'POST', '/ops/api-keys', 201, { headers: { authorization: `Bearer ${admin}` }, body: { tenantId: tenant.tenantId, scopes: ['x402:write', 'x402:read'] } })).token}`,
    };
    const verifyAnswers: number[] = [];
    while (!verifyAnswers.includes(200) && verifyAnswers.length < 5) {
      const gate = await must(base, 'POST', '/x402/gate/create', 201, {
        headers: x402,
        body: { payerAgentId: payer.agentId, payeeAgentId: payee.agentId, amount: 250, currency: 'USD' },
      });
      const requestSha256 = randomBytes(32).toString('hex');
      const quote = await must(base, 'POST', '/x402/gate/quote', 200, {
        headers: x402,
        body: { gateId: gate.gateId, requestSha256 },
      });
      await must(base, 'POST', '/x402/gate/authorize-payment', 200, {
        headers: x402,
        body: { gateId: gate.gateId, quoteId: quote.quoteId, requestSha256 },
      });
      const verified = await call(base, 'POST', '/x402/gate/verify', {
        headers: x402,
        body: { gateId: gate.gateId, evidence: { responseSha256: requestSha256 } },
      });
      expect([200, 202], JSON.stringify(verified.body)).toContain(verified.status);
      verifyAnswers.push(verified.status);
      await eventually(
        async () =>
          (await must(base, 'GET', `/x402/gate/${gate.gateId}`, 200, { headers: x402 })).status === 'released',
        60_000,
        `gate ${gate.gateId} released`,
      );
    }
    expect(verifyAnswers).toContain(200);

    console.log(
      `fault figures (redis cluster): ${JSON.stringify({ verifyAnswers, runs: RUNS, killedMaster: victim.port, promoted: newMaster.port, queueSlot, completedAfterKillMs, events: audit.outboxEvents.length, duplicates: receiver.duplicates })}`,
    );
  }, 300_000);
});
