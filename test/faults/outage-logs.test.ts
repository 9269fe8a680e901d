// What an operator reads during an outage: Redis, then FerretDB, is stopped for some seconds under a trickle of
// requests, with the API and a worker running as real processes at LOG_LEVEL=info. Every line either process writes
// in that time parses as JSON; each process writes exactly one "down" and one "up" line for the dependency that went
// away (the "up" line counting the failures in between and how long it was down), and only a bounded number of other
// lines: not one stack trace per reconnect attempt, failed command or failed job. A freeze (the server hangs, its
// connections stay up) gets one line for the requests the deadline answered, and none when their handlers finish.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WORK_STEPS } from '../../src/services/work-log.ts';
import { FerretDbServer, RedisServer } from './servers.ts';
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
  type Tenant,
} from './service.ts';

const OUTAGE_MS = 6_000;
/**
 * Lines other than the access log (one per request), the down/up pair and the work's step lines a process may write
 * in one outage: a bound that does not grow with the requests. A Redis restart alone accounts for 7 (the lineage
 * watch's "masters changed" and one audit line per due index, six of them), a sweep that failed while it was away
 * for a few more.
 */
const MAX_OTHER_LINES = 16;

interface Line {
  level: number;
  msg: string;
  dependency?: string;
  state?: string;
  failures?: number;
  downMs?: number;
}

function linesOf(text: string): string[] {
  return text.split('\n').filter((l) => l.trim() !== '');
}

function parseAll(lines: string[], who: string): Line[] {
  return lines.map((line) => {
    try {
      return JSON.parse(line) as Line;
    } catch {
      throw new Error(`${who} wrote a line that is not JSON: ${line.slice(0, 300)}`);
    }
  });
}

describe('logs during an outage: JSON only, one line down and one up per dependency, bounded (servers of this test only)', () => {
  let redis: RedisServer;
  let ferret: FerretDbServer;
  let api: ServiceProcess;
  let worker: ServiceProcess;
  let tenant: Tenant;
  let runIds: string[] = [];
  beforeAll(async () => {
    // As production runs it (scripts/services.sh): AOF on, so a restart keeps the queues and the sweepers' schedules.
    redis = await RedisServer.start(['--appendonly', 'yes', '--appendfsync', 'everysec']);
    ferret = await FerretDbServer.start();
    const env = serviceEnv(ferret.url('outage_logs'), redis.url, { LOG_LEVEL: 'info' });
    api = await ServiceProcess.start('api', env);
    worker = await ServiceProcess.start('worker', env);
    await eventually(() => worker.logs.includes('"workers started"'), 60_000, 'the worker started');
    tenant = await createTenant(api.url, env.SERVICE_ADMIN_KEY!);
    const payer = await registerAgent(api.url, tenant);
    const payee = await registerAgent(api.url, tenant);
    await credit(api.url, env.SERVICE_ADMIN_KEY!, payer.agentId, 10_000);
    for (let i = 0; i < 4; i++)
      runIds.push(await createRunWithEvidence(api.url, tenant, payer, payee, { pass: true, amount: 100 + i }));
  });
  afterAll(async () => {
    await api?.stop().catch(() => undefined);
    await worker?.stop().catch(() => undefined);
    await redis?.destroy();
    await ferret?.destroy();
  });

  async function outage(
    server: RedisServer | FerretDbServer,
    dependency: 'redis' | 'mongodb',
    runs: string[],
  ): Promise<void> {
    // Jobs accepted just before: the worker meets the outage in the middle of work, as in production.
    for (const runId of runs) await must(api.url, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
    const from = { api: api.logs.length, worker: worker.logs.length };
    await server.down();
    const downAt = Date.now();
    let requests = 0;
    while (Date.now() - downAt < OUTAGE_MS) {
      const answer = await call(api.url, 'GET', `/v1/runs/${runs[requests % runs.length]}`, {
        headers: tenant.auth,
        timeoutMs: 10_000,
      });
      expect(answer.status, 'answers 503 while a dependency is down').toBe(503);
      requests++;
      await new Promise((r) => setTimeout(r, 100));
    }
    await server.up();
    await eventually(
      async () => (await call(api.url, 'GET', `/v1/runs/${runs[0]}`, { headers: tenant.auth })).status === 200,
      30_000,
      'requests succeed again',
    );
    for (const runId of runs) {
      await eventually(
        async () =>
          (await call(api.url, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized',
        60_000,
        `run ${runId} finalized`,
        250,
      );
    }
    const upLine = (text: string) =>
      parseAll(linesOf(text), dependency).some((l) => l.dependency === dependency && l.state === 'up');
    await eventually(
      () => upLine(api.logs.slice(from.api)) && upLine(worker.logs.slice(from.worker)),
      30_000,
      `both processes log ${dependency} back`,
    );

    for (const [who, text] of [
      ['api', api.logs.slice(from.api)],
      ['worker', worker.logs.slice(from.worker)],
    ] as const) {
      const lines = linesOf(text);
      const parsed = parseAll(lines, who);
      const down = parsed.filter((l) => l.dependency === dependency && l.state === 'down');
      const up = parsed.filter((l) => l.dependency === dependency && l.state === 'up');
      expect(down, `${who}: one "${dependency} down" line`).toHaveLength(1);
      expect(up, `${who}: one "${dependency} up" line`).toHaveLength(1);
      expect(up[0]!.failures, `${who}: failures counted while ${dependency} was down`).toBeGreaterThan(0);
      // A process notices the loss when it next talks to the server (an idle one a little later), and the return at once.
      expect(up[0]!.downMs, `${who}: how long ${dependency} was down`).toBeGreaterThanOrEqual(1_000);
      // The work's own step lines (a run finalized once the outage is over) are not outage noise.
      const others = parsed.filter(
        (l) =>
          l.msg !== 'request completed' &&
          l.dependency !== dependency &&
          !(WORK_STEPS as readonly string[]).includes(l.msg),
      );
      console.log(
        `outage log (${dependency}, ${who}): ${lines.length} lines, ${requests} requests, down ${JSON.stringify(down[0])}, up ${JSON.stringify(up[0])}, other lines: ${JSON.stringify(others.map((l) => l.msg))}`,
      );
      expect(
        others.length,
        `${who}: lines besides the access log and the down/up pair: ${JSON.stringify(others.map((l) => l.msg))}`,
      ).toBeLessThanOrEqual(MAX_OTHER_LINES);
    }
  }

  /** On a failure, what the processes wrote is what explains it. */
  async function explained(work: Promise<void>): Promise<void> {
    try {
      await work;
    } catch (err) {
      const besidesAccess = (text: string) =>
        linesOf(text)
          .filter((l) => !l.includes('"request completed"'))
          .slice(-40)
          .join('\n');
      console.log(
        `api log (no access lines):\n${besidesAccess(api.logs)}\nworker log (no access lines):\n${besidesAccess(worker.logs)}`,
      );
      throw err;
    }
  }

  it('Redis stopped for some seconds', async () => {
    await explained(outage(redis, 'redis', runIds.slice(0, 2)));
  });

  it('FerretDB stopped for some seconds', async () => {
    await explained(outage(ferret, 'mongodb', runIds.slice(2)));
  });

  it('FerretDB frozen for 2 s: the requests the deadline answered finish later without a line each', async () => {
    await explained(
      (async () => {
        const from = api.logs.length;
        const reads = Array.from({ length: 8 }, (_, i) =>
          call(api.url, 'GET', `/v1/runs/${runIds[i % runIds.length]}`, { headers: tenant.auth, timeoutMs: 10_000 }),
        );
        await new Promise((r) => setTimeout(r, 20));
        ferret.freeze();
        const stalled = await Promise.all(
          Array.from({ length: 8 }, () =>
            call(api.url, 'GET', `/v1/runs/${runIds[0]}`, { headers: tenant.auth, timeoutMs: 10_000 }),
          ),
        );
        await new Promise((r) => setTimeout(r, 2_000));
        ferret.thaw();
        await Promise.all(reads);
        expect(
          stalled.map((a) => a.status),
          'the deadline answered the requests the freeze held',
        ).toContain(503);
        // The handlers held by the freeze finish once it thaws; their late results are dropped without a word.
        await eventually(
          async () => (await call(api.url, 'GET', `/v1/runs/${runIds[0]}`, { headers: tenant.auth })).status === 200,
          30_000,
          'requests succeed again',
        );
        await new Promise((r) => setTimeout(r, 500));
        const parsed = parseAll(linesOf(api.logs.slice(from)), 'api');
        const others = parsed.filter((l) => l.msg !== 'request completed');
        console.log(`freeze log (api): other lines: ${JSON.stringify(others.map((l) => l.msg))}`);
        expect(
          others.filter((l) => /already sent/i.test(l.msg)),
          'no "Reply was already sent" line for a request the deadline answered',
        ).toEqual([]);
        const answered = stalled.filter((a) => a.status === 503).length;
        // At most one (none when another such line went out in the last 10 s, as the stray lines go).
        expect(
          others.filter((l) => l.msg.startsWith('request deadline passed')).length,
          `one deadline line at most for the ${answered} requests it answered`,
        ).toBeLessThanOrEqual(1);
        expect(
          others.length,
          `lines besides the access log: ${JSON.stringify(others.map((l) => l.msg))}`,
        ).toBeLessThanOrEqual(MAX_OTHER_LINES);
      })(),
    );
  });
});
