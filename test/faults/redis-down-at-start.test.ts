// A deployment that starts while Redis is down (a host reboot where the service comes up first, a Redis being
// restored): the API and a worker are started with their Redis stopped, and must come up by themselves once it is
// started, process jobs, and ride out a second outage just as well. Every line either process writes is JSON, with
// exactly one "redis down" and one "redis up" line per outage.
import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { bullPrefix, type QueueName } from '../../src/queues/index.ts';
import { freePort, RedisServer } from './servers.ts';
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
  type Agent,
  type Tenant,
} from './service.ts';

interface Line {
  msg: string;
  dependency?: string;
  state?: string;
  failures?: number;
}

function parsedLines(text: string, who: string): Line[] {
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((line) => {
      try {
        return JSON.parse(line) as Line;
      } catch {
        throw new Error(`${who} wrote a line that is not JSON: ${line.slice(0, 300)}`);
      }
    });
}

/** The "redis down" and "redis up" lines in `text`. */
function redisStates(text: string, who: string): { down: Line[]; up: Line[] } {
  const lines = parsedLines(text, who).filter((l) => l.dependency === 'redis');
  return { down: lines.filter((l) => l.state === 'down'), up: lines.filter((l) => l.state === 'up') };
}

describe('API and worker started while Redis is down (a Redis of this test only)', () => {
  let redis: RedisServer;
  let api: ServiceProcess;
  let worker: ServiceProcess;
  let env: Record<string, string>;
  let tenant: Tenant;
  let payer: Agent;
  let payee: Agent;

  beforeAll(async () => {
    // As production runs it (scripts/services.sh): AOF on, so a restart keeps the queues and the sweepers' schedules.
    // Not started yet: the service comes up first.
    redis = new RedisServer(await freePort(), ['--appendonly', 'yes', '--appendfsync', 'everysec']);
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_redis_at_start_${randomBytes(4).toString('hex')}`;
    env = serviceEnv(mongoUrl.toString(), redis.url, { LOG_LEVEL: 'info' });
  });
  afterAll(async () => {
    await api?.stop().catch(() => undefined);
    await worker?.stop().catch(() => undefined);
    await redis?.destroy();
  });

  /** On a failure, what the processes wrote is what explains it. */
  async function explained(work: () => Promise<void>): Promise<void> {
    try {
      await work();
    } catch (err) {
      const besidesAccess = (text = '') =>
        text
          .split('\n')
          .filter((l) => !l.includes('"request completed"'))
          .slice(-40)
          .join('\n');
      console.log(
        `api log (no access lines):\n${besidesAccess(api?.logs)}\nworker log (no access lines):\n${besidesAccess(worker?.logs)}`,
      );
      throw err;
    }
  }

  async function finalizes(runId: string): Promise<void> {
    await must(api.url, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
    await eventually(
      async () =>
        (await call(api.url, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized',
      60_000,
      `run ${runId} finalized`,
      250,
    );
  }

  it('comes up by itself once Redis starts, and processes jobs', () =>
    explained(async () => {
      api = await ServiceProcess.start('api', env);
      worker = await ServiceProcess.start('worker', env);
      await eventually(() => worker.logs.includes('"workers started"'), 60_000, 'the worker started');
      // Up without Redis: the API answers, 503 for what needs Redis.
      const meanwhile = await call(api.url, 'POST', '/ops/tenants', {
        headers: { authorization: `Bearer ${env.SERVICE_ADMIN_KEY}`, 'idempotency-key': 'k1' },
        body: { name: 'early' },
      });
      expect(meanwhile.status, 'answers 503 while Redis is down').toBe(503);
      for (const [who, p] of [
        ['api', api],
        ['worker', worker],
      ] as const) {
        await eventually(() => redisStates(p.logs, who).down.length > 0, 30_000, `${who} logs redis down`);
      }

      await redis.up();
      tenant = await createTenant(api.url, env.SERVICE_ADMIN_KEY!);
      payer = await registerAgent(api.url, tenant);
      payee = await registerAgent(api.url, tenant);
      await credit(api.url, env.SERVICE_ADMIN_KEY!, payer.agentId, 10_000);
      await finalizes(await createRunWithEvidence(api.url, tenant, payer, payee, { pass: true, amount: 100 }));

      // The worker's own worker took the job: it was not a dead one replaced by the idle watchdog (workers/runner.ts).
      expect(worker.logs, 'the worker started during the outage works without being replaced').not.toContain(
        'worker idle while jobs wait',
      );
      // And its sweepers are scheduled: they repair work an outage leaves behind (a job out of retries, one never enqueued).
      const connection = new Redis(redis.url, { maxRetriesPerRequest: null });
      try {
        for (const name of ['finalize', 'settle', 'x402-verify', 'webhook-dispatch'] satisfies QueueName[]) {
          const queue = new Queue(name, { connection, prefix: bullPrefix(env.REDIS_PREFIX!) });
          await eventually(
            async () => ((await queue.getJobScheduler(`${name}-sweeper`)) ?? null) !== null,
            30_000,
            `the ${name} sweeper scheduled`,
          );
          await queue.close();
        }
      } finally {
        connection.disconnect();
      }

      for (const [who, p] of [
        ['api', api],
        ['worker', worker],
      ] as const) {
        await eventually(() => redisStates(p.logs, who).up.length > 0, 30_000, `${who} logs redis up`);
        const { down, up } = redisStates(p.logs, who);
        expect(down, `${who}: one "redis down" line for the outage at start`).toHaveLength(1);
        expect(up, `${who}: one "redis up" line for the outage at start`).toHaveLength(1);
        expect(up[0]!.failures, `${who}: failures counted while Redis was down`).toBeGreaterThan(0);
      }
    }));

  it('rides out a second outage: stopped, started again, and the next job is processed', () =>
    explained(async () => {
      expect(tenant, 'the first test set the deployment up').toBeDefined();
      const runId = await createRunWithEvidence(api.url, tenant, payer, payee, { pass: true, amount: 101 });
      // A job accepted just before: the worker meets the outage in the middle of work.
      const accepted = await createRunWithEvidence(api.url, tenant, payer, payee, { pass: true, amount: 102 });
      await must(api.url, 'POST', `/v1/runs/${accepted}/finalize`, 202, { headers: tenant.auth });
      const from = { api: api.logs.length, worker: worker.logs.length };

      await redis.down();
      const downAt = Date.now();
      while (Date.now() - downAt < 5_000) {
        const answer = await call(api.url, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth, timeoutMs: 10_000 });
        expect(answer.status, 'answers 503 while Redis is down').toBe(503);
        await new Promise((r) => setTimeout(r, 200));
      }
      await redis.up();

      await finalizes(runId);
      await eventually(
        async () =>
          (await call(api.url, 'GET', `/v1/runs/${accepted}`, { headers: tenant.auth })).body?.status === 'finalized',
        60_000,
        `run ${accepted} finalized`,
        250,
      );
      for (const [who, text] of [
        ['api', () => api.logs.slice(from.api)],
        ['worker', () => worker.logs.slice(from.worker)],
      ] as const) {
        await eventually(() => redisStates(text(), who).up.length > 0, 30_000, `${who} logs redis up`);
        const { down, up } = redisStates(text(), who);
        expect(down, `${who}: one "redis down" line for the second outage`).toHaveLength(1);
        expect(up, `${who}: one "redis up" line for the second outage`).toHaveLength(1);
        expect(up[0]!.failures, `${who}: failures counted while Redis was down`).toBeGreaterThan(0);
      }
      // Nothing unparsable over the whole life of either process.
      for (const [who, p] of [
        ['api', api],
        ['worker', worker],
      ] as const) {
        const others = parsedLines(p.logs, who).filter(
          (l) => l.msg !== 'request completed' && l.dependency !== 'redis',
        );
        console.log(
          `${who} wrote, besides the access log and the redis down/up lines: ${JSON.stringify(others.map((l) => l.msg))}`,
        );
      }
    }));
});
