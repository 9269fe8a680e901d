import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { MongoClient } from 'mongodb';
import { afterAll, beforeAll, describe, expect, inject, it, onTestFailed } from 'vitest';
import { signEvents } from '../../src/domain/event-chain.ts';
import { PARTITIONED_QUEUES, partitionQueueName } from '../../src/queues/index.ts';
import { createRedisClient } from '../../src/redis.ts';
import { auditDatabase } from './audit.ts';
import { CountingReceiver } from './receiver.ts';
import { RedisCluster, type RedisServer } from './servers.ts';
import {
  call,
  createTenant,
  credit,
  eventually,
  must,
  registerAgent,
  ServiceProcess,
  serviceEnv,
  type Tenant,
} from './service.ts';

// The production topology in small: a Redis Cluster of three masters (each with a replica), two API processes
// behind a round-robin client, three worker processes and one FerretDB, the hot queues split over K partitions.
// A mixed load of a fixed size (runs with escrow and settlement, x402 gate flows, session charges, webhook
// deliveries); a worker SIGKILLed and a master killed in its middle. Then every run settled once, every delivery
// arrived, the ledger audit is clean, and the queue commands were spread over the masters.

/**
 * K: 6 partitions per hot queue, under a prefix whose tags land 2 / 2 / 2 per hot queue on the three masters of a
 * cluster made by `redis-cli --cluster create` (its even slot ranges). With `topo` and K=8 the tags fell 10 / 12 / 10
 * and one master's share of the queue commands reached 50.0 % in a run: the spread measured is the layout's, not the
 * luck of CRC16 placement.
 */
const K = 6;
const PREFIX = 'topo95';
const RUNS = 24;
const GATES = 16;
const SESSIONS = 4;
const CHARGES_PER_SESSION = 8;
const WIDTH = 6;
const EVENTS = [
  'run.finalized',
  'settlement.completed',
  'settlement.held',
  'x402.session.opened',
  'x402.session.closed',
];

/**
 * `must` with patience: a call on this loaded topology (two cores, eleven processes) may answer 503 past its
 * deadline or 409 while its first attempt's idempotency record is still in progress; it is repeated, with the same
 * keys, until it answers `expected` or two minutes have gone.
 */
async function persist(
  base: () => string,
  method: string,
  path: string,
  expected: number,
  options: { body?: unknown; headers?: Record<string, string> } = {},
): Promise<any> {
  const deadline = Date.now() + 120_000;
  const seen: string[] = [];
  for (let attempt = 1; ; attempt++) {
    const answer = await call(base(), method, path, options);
    if (answer.status === expected) return answer.body;
    seen.push(`${answer.status} ${answer.body?.code ?? ''}`);
    if (![0, 409, 503].includes(answer.status) || Date.now() > deadline)
      throw new Error(
        `${method} ${path}: expected ${expected}, got ${JSON.stringify(answer.body)} (${seen.join('; ')})`,
      );
    await new Promise((r) => setTimeout(r, Math.min(250 * attempt, 3_000)));
  }
}

async function pool<T>(items: T[], width: number, work: (item: T) => Promise<void>): Promise<void> {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (queue.length > 0) await work(queue.shift()!);
    }),
  );
}

/** The master serving `slot` and the slot ranges of every master, from `cluster nodes` as a live node sees it. */
async function slotOwners(cluster: RedisCluster): Promise<Array<{ port: number; ranges: Array<[number, number]> }>> {
  const alive = cluster.nodes.filter((n) => n.pid !== undefined);
  return (await cluster.cli(alive[0]!.port, 'cluster', 'nodes'))
    .split('\n')
    .filter((l) => l.includes('master') && !l.includes('fail'))
    .map((line) => {
      const fields = line.split(' ');
      const ranges = fields
        .slice(8)
        .filter((r) => /^\d/.test(r))
        .map((r) => r.split('-').map(Number) as [number, number?])
        .map(([a, b]) => [a, b ?? a] as [number, number]);
      return { port: Number(fields[1]!.split(':')[1]!.split('@')[0]), ranges };
    });
}

/** Commands that are queue work: BullMQ's scripts (EVALSHA), its workers' waits (BZPOPMIN), its event streams (XREAD). */
const QUEUE_COMMANDS = ['evalsha', 'bzpopmin', 'xread'];

async function queueCommandCount(cluster: RedisCluster, node: RedisServer): Promise<{ queue: number; all: number }> {
  const stats = await cluster.cli(node.port, 'info', 'commandstats');
  let queue = 0;
  let all = 0;
  for (const m of stats.matchAll(/^cmdstat_([a-z|]+):calls=(\d+)/gm)) {
    all += Number(m[2]);
    if (QUEUE_COMMANDS.includes(m[1]!)) queue += Number(m[2]);
  }
  return { queue, all };
}

describe('two APIs, three workers, a three-master Redis Cluster with the hot queues partitioned', () => {
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
    await cluster?.destroy();
  });

  it('spreads the queue load over the masters and loses nothing to a worker SIGKILL and a master failover', async () => {
    onTestFailed(() => {
      for (const p of processes) console.log(`--- ${p.mode} log tail ---\n${p.logs.slice(-8_000)}`);
    });
    const started = Date.now();
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_topology_${randomBytes(4).toString('hex')}`;
    const env = serviceEnv(mongoUrl.toString(), cluster.url, {
      REDIS_PREFIX: PREFIX,
      QUEUE_PARTITIONS: String(K),
      WORKER_CONCURRENCY: '4',
      // Eleven processes and six Redis nodes on two cores: an event loop held by a neighbour must not turn a reply
      // that arrived into a timeout (the deadlines themselves are tested in the outage tests, with their defaults).
      REDIS_COMMAND_TIMEOUT_MS: '2000',
      REQUEST_DEADLINE_MS: '5000',
      LOG_LEVEL: process.env.FAULT_LOG_LEVEL ?? 'warn',
    });
    const admin = env.SERVICE_ADMIN_KEY!;

    // Where each partition's hash tag lands: every master holds some of every hot queue.
    const masters = await cluster.masters();
    const owners = await slotOwners(cluster);
    const masterOf = (slot: number) => owners.find((o) => o.ranges.some(([a, b]) => slot >= a && slot <= b))!.port;
    const tagsPerMaster = new Map<number, number>(masters.map((m) => [m.port, 0]));
    const partitionMasters: Array<{ queue: (typeof PARTITIONED_QUEUES)[number]; p: number; port: number }> = [];
    for (const queue of PARTITIONED_QUEUES) {
      for (let p = 0; p < K; p++) {
        const tag = `{${PREFIX}:bull:${partitionQueueName(queue, p)}}`;
        const slot = Number((await cluster.cli(masters[0]!.port, 'cluster', 'keyslot', tag)).trim());
        const port = masterOf(slot);
        tagsPerMaster.set(port, (tagsPerMaster.get(port) ?? 0) + 1);
        partitionMasters.push({ queue, p, port });
      }
    }
    const jobsPerPartition: Record<string, number> = {};
    /** The jobs each master's partitions have held so far (every state), the load's and the sweeps'. */
    const jobsPerMaster = async (): Promise<Map<number, number>> => {
      const counter = createRedisClient(cluster.url, { maxRetriesPerRequest: null });
      const jobs = new Map<number, number>(masters.map((m) => [m.port, 0]));
      try {
        for (const { queue, p, port } of partitionMasters) {
          const partition = new Queue(partitionQueueName(queue, p), {
            connection: counter,
            prefix: `{${PREFIX}:bull:${partitionQueueName(queue, p)}}`,
          });
          // The sweeps counted too: they are scheduled on every partition now, each sweeping its share (docs/queues.md).
          const all = await partition.getJobs(['completed', 'failed', 'active', 'waiting', 'delayed', 'prioritized']);
          const held = all.filter((job) => job).length;
          jobs.set(port, (jobs.get(port) ?? 0) + held);
          jobsPerPartition[`${partitionQueueName(queue, p)}@${port}`] = held;
          await partition.close();
        }
      } finally {
        counter.disconnect();
      }
      return jobs;
    };
    expect([...tagsPerMaster.values()].every((n) => n > 0)).toBe(true);

    const apis = [
      await ServiceProcess.start('api', env, [], 90_000),
      await ServiceProcess.start('api', env, [], 90_000),
    ];
    processes.push(...apis);
    const workers: ServiceProcess[] = [];
    for (let i = 0; i < 3; i++) workers.push(await ServiceProcess.start('worker', env));
    processes.push(...workers);
    // Every partition of every hot queue has its three workers before the load starts (a worker process takes a few
    // seconds to start; an enqueue to a partition nobody consumes yet is reported, rightly).
    const watcher = createRedisClient(cluster.url, { maxRetriesPerRequest: null });
    try {
      for (const queue of PARTITIONED_QUEUES) {
        for (let p = 0; p < K; p++) {
          const partition = new Queue(partitionQueueName(queue, p), {
            connection: watcher,
            prefix: `{${PREFIX}:bull:${partitionQueueName(queue, p)}}`,
          });
          await eventually(
            async () => (await partition.getWorkersCount()) >= 3,
            90_000,
            `workers of ${partition.name}`,
            250,
          );
          await partition.close();
        }
      }
    } finally {
      watcher.disconnect();
    }
    // Round-robin over the two APIs: each call goes to the next one.
    let next = 0;
    const api = () => apis[next++ % apis.length]!.url;

    const tenant = await createTenant(api(), admin);
    const x402: Tenant = {
      ...tenant,
      auth: {
        authorization: `Bearer ${(await must(api(), 'POST', '/ops/api-keys', 201, { headers: { authorization: `Bearer ${admin}` }, body: { tenantId: tenant.tenantId, scopes: ['x402:write', 'x402:read'] } })).token}`,
      },
    };
    const hook = await must(api(), 'POST', '/v1/webhooks', 201, {
      headers: tenant.auth,
      body: { url: receiver.url, events: EVENTS },
    });
    receiver.secret = hook.secret;
    const payer = await registerAgent(api(), tenant);
    const payee = await registerAgent(api(), tenant);
    await credit(api(), admin, payer.agentId, 1_000_000);

    // The work, in a fixed count: each item one whole flow, retried through 503s with the same keys.
    const runIds: string[] = [];
    const gateIds: string[] = [];
    const sessionIds: string[] = [];
    type Item = { kind: 'run' | 'gate' | 'session'; i: number };
    const items: Item[] = [
      ...Array.from({ length: RUNS }, (_, i) => ({ kind: 'run' as const, i })),
      ...Array.from({ length: GATES }, (_, i) => ({ kind: 'gate' as const, i })),
      ...Array.from({ length: SESSIONS }, (_, i) => ({ kind: 'session' as const, i })),
    ].sort((a, b) => (a.i % 4) - (b.i % 4) || a.kind.localeCompare(b.kind)); // interleaved
    let finished = 0;
    const flow = async (item: Item) => {
      await oneFlow(item);
      finished++;
    };
    const oneFlow = async ({ kind, i }: Item) => {
      if (kind === 'run') {
        const { runId } = await persist(api, 'POST', '/v1/runs', 201, {
          headers: { ...tenant.auth, 'idempotency-key': `run-${i}` },
          body: {
            agentId: payee.agentId,
            terms: { accuracy: { min: 0.9 } },
            settlement: {
              payerAgentId: payer.agentId,
              amount: 100 + i,
              currency: 'USD',
              holdbackBps: 0,
              disputeWindowSeconds: 3600,
            },
          },
        });
        const [event] = signEvents(
          [
            {
              id: `evt_topo_${i}`,
              runId,
              type: 'metric',
              at: new Date().toISOString(),
              payload: { name: 'accuracy', value: i % 2 === 0 ? 1 : 0 },
            },
          ],
          { seq: 0, chainHash: null },
          payee.privateKey,
          payee.keyId,
        );
        await persist(api, 'POST', `/v1/runs/${runId}/events`, 201, {
          headers: { ...tenant.auth, 'idempotency-key': `event-${i}` },
          body: { event },
        });
        runIds.push(runId);
        await persist(api, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
        await eventually(
          async () =>
            (await call(api(), 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized',
          90_000,
          `run ${runId} finalized`,
          250,
        );
        await persist(api, 'POST', `/v1/runs/${runId}/settle`, 202, {
          headers: { ...tenant.auth, 'idempotency-key': `settle-${runId}` },
          body: {},
        });
      } else if (kind === 'gate') {
        const gate = await persist(api, 'POST', '/x402/gate/create', 201, {
          headers: { ...x402.auth, 'idempotency-key': `gate-${i}` },
          body: { payerAgentId: payer.agentId, payeeAgentId: payee.agentId, amount: 50 + i, currency: 'USD' },
        });
        gateIds.push(gate.gateId);
        const requestSha256 = randomBytes(32).toString('hex');
        const quote = await persist(api, 'POST', '/x402/gate/quote', 200, {
          headers: x402.auth,
          body: { gateId: gate.gateId, requestSha256 },
        });
        await persist(api, 'POST', '/x402/gate/authorize-payment', 200, {
          headers: x402.auth,
          body: { gateId: gate.gateId, quoteId: quote.quoteId, requestSha256 },
        });
        // 200 with the decision, or 202 while its job runs (a failover in between): both are fair answers.
        for (let attempt = 0; ; attempt++) {
          const verified = await call(api(), 'POST', '/x402/gate/verify', {
            headers: x402.auth,
            body: { gateId: gate.gateId, evidence: { responseSha256: requestSha256 } },
          });
          if (verified.status === 200 || verified.status === 202) break;
          if (attempt > 8)
            throw new Error(`verify ${gate.gateId}: ${verified.status} ${JSON.stringify(verified.body)}`);
          await new Promise((r) => setTimeout(r, 500 * (attempt + 1)));
        }
      } else {
        const session = await persist(api, 'POST', '/x402/sessions', 201, {
          headers: { ...x402.auth, 'idempotency-key': `session-${i}` },
          body: {
            currency: 'USD',
            payerAgentId: payer.agentId,
            payeeAgentIds: [payee.agentId],
            budget: 1_000,
            maxPerCall: 50,
          },
        });
        sessionIds.push(session.sessionId);
        for (let c = 0; c < CHARGES_PER_SESSION; c++) {
          await persist(api, 'POST', `/x402/sessions/${session.sessionId}/charges`, 201, {
            headers: x402.auth,
            body: { paymentId: `pay-${i}-${c}`, payeeAgentId: payee.agentId, amount: 10 + c },
          });
        }
        await persist(api, 'POST', `/x402/sessions/${session.sessionId}/close`, 200, { headers: x402.auth, body: {} });
      }
    };

    // First half: the load with nothing failing, measured per master (INFO commandstats deltas).
    const half = Math.floor(items.length / 2);
    const before = await Promise.all(masters.map((m) => queueCommandCount(cluster, m)));
    await pool(items.slice(0, half), WIDTH, flow);
    const after = await Promise.all(masters.map((m) => queueCommandCount(cluster, m)));
    const queueDeltas = masters.map((_, i) => after[i]!.queue - before[i]!.queue);
    const allDeltas = masters.map((_, i) => after[i]!.all - before[i]!.all);
    const total = queueDeltas.reduce((a, b) => a + b, 0);
    const shares = queueDeltas.map((d) => Math.round((1_000 * d) / total) / 10);
    // The queue commands above include every EVALSHA (session and rate-limit scripts too, on their own tags): the
    // jobs each master's partitions held is the queue load itself.
    const jobs = await jobsPerMaster();
    const totalJobs = [...jobs.values()].reduce((a, b) => a + b, 0);
    const jobShares = masters.map((m) => Math.round((1_000 * jobs.get(m.port)!) / totalJobs) / 10);

    // Second half, with a worker SIGKILLed and then a master killed while it runs.
    const faults = (async () => {
      await eventually(() => finished >= half + 4, 120_000, 'the second half under way', 100);
      await workers[0]!.kill('SIGKILL');
      await eventually(() => finished >= half + 8, 120_000, 'more of the second half', 100);
      const victim = masters[1]!;
      await victim.down(); // SIGKILL; its replica takes over its slots
      return victim.port;
    })();
    await pool(items.slice(half), WIDTH, flow);
    const killedMaster = await faults;

    // Everything settles once, every delivery arrives.
    await eventually(
      async () => {
        const client = new MongoClient(env.MONGO_URL!, { serverSelectionTimeoutMS: 5_000 });
        try {
          const db = client.db();
          const settled = await db.collection('settlement_facts').countDocuments({ kind: 'decision' });
          return settled >= RUNS + GATES;
        } finally {
          await client.close();
        }
      },
      120_000,
      'every run and gate settled',
      500,
    );
    // A decision is recorded before its settlement completes and its event is recorded (and after a failover a
    // sweeper may finish that work): the books are read until they are whole, or the last finding is the failure.
    let audit: Awaited<ReturnType<typeof auditDatabase>> | null = null;
    for (const deadline = Date.now() + 180_000; audit === null;) {
      try {
        const found = await auditDatabase(env.MONGO_URL!, runIds);
        expect(found.settlements.pending ?? 0, 'pending settlements').toBe(0);
        audit = found;
      } catch (err) {
        if (Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 1_000));
      }
    }
    const subscribed = audit.outboxEvents.filter((e) => EVENTS.includes(e.type));
    await eventually(
      () => subscribed.every((e) => receiver.seen.has(e._id)),
      120_000,
      'every subscribed event delivered',
      250,
    );
    expect(receiver.badSignatures).toBe(0);
    expect(subscribed.filter((e) => e.type === 'run.finalized')).toHaveLength(RUNS);
    expect(subscribed.filter((e) => e.type === 'x402.session.closed')).toHaveLength(SESSIONS);
    for (const gateId of gateIds) {
      const gate = await must(api(), 'GET', `/x402/gate/${gateId}`, 200, { headers: x402.auth });
      expect(gate.status, gateId).toBe('released');
    }

    // The money invariants, checked by the service itself.
    const ledger = await must(api(), 'GET', '/ops/ledger/audit?full=true', 200, {
      headers: { authorization: `Bearer ${admin}` },
    });
    expect(ledger.violations).toEqual([]);
    expect(ledger).toMatchObject({ clean: true, complete: true });

    // The lists, spread over the cluster with K > 1 (a hash tag per tenant and agent set, the operator's list over
    // shards merged on read): every run listed once, in one order whichever way it is read and paged.
    const runsOf = (body: { items: Array<{ runId: string }> }) => body.items.map((r) => r.runId);
    const tenantList = runsOf(await must(api(), 'GET', '/v1/runs?limit=100', 200, { headers: tenant.auth }));
    expect([...tenantList].sort()).toEqual([...runIds].sort());
    const agentList = await must(api(), 'GET', `/v1/runs?agentId=${payee.agentId}&limit=100`, 200, {
      headers: tenant.auth,
    });
    expect(runsOf(agentList)).toEqual(tenantList);
    const operatorPages: string[] = [];
    for (let cursor: string | null = null, pages = 0; pages === 0 || cursor; pages++) {
      const page: { items: Array<{ runId: string }>; nextCursor: string | null } = await must(
        api(),
        'GET',
        `/ops/runs?limit=5${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`,
        200,
        { headers: { authorization: `Bearer ${admin}` } },
      );
      operatorPages.push(...runsOf(page));
      cursor = page.nextCursor;
    }
    expect(operatorPages).toEqual(tenantList);

    const figures = {
      K,
      tagsPerMaster: Object.fromEntries(tagsPerMaster),
      queueCommandsPerMaster: Object.fromEntries(masters.map((m, i) => [m.port, queueDeltas[i]])),
      queueSharePercent: Object.fromEntries(masters.map((m, i) => [m.port, shares[i]])),
      allCommandsPerMaster: Object.fromEntries(masters.map((m, i) => [m.port, allDeltas[i]])),
      jobsPerMaster: Object.fromEntries(jobs),
      jobSharePercent: Object.fromEntries(masters.map((m, i) => [m.port, jobShares[i]])),
      jobsPerPartition,
      killedMaster,
      runs: RUNS,
      gates: GATES,
      sessions: SESSIONS,
      events: subscribed.length,
      duplicates: receiver.duplicates,
      seconds: Math.round((Date.now() - started) / 1000),
    };
    console.log(`topology figures: ${JSON.stringify(figures)}`);
    // The load is spread: no master holds more than half of the jobs (one shared tag put all on one), nor takes more
    // than two thirds of the queue commands (which count other scripts too).
    for (const share of jobShares) expect(share, JSON.stringify(figures)).toBeLessThanOrEqual(50);
    for (const share of shares) expect(share, JSON.stringify(figures)).toBeLessThanOrEqual(67);
  }, 600_000); // about 2 minutes on an idle machine with two cores; 5.5 minutes measured at a load average of 20
});
