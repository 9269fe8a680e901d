// Payment sessions under a sustained mix (issue 40, item 6): session charges at a fixed rate on one payer, over a few
// sessions open at once that each close after a fixed count of charges (staggered, so one closes every
// count / rate seconds), plus gate flows at a fixed rate over their own payers; for a fixed time. Does a close stall
// the calls of the sessions still open, and does Redis keep growing with what closed sessions leave behind?
//
//   node --import tsx bench/x402-sessions-sustained.ts [--own-backend] [--seconds 600] [--rate 500]
//     [--session-charges 20000] [--sessions 4] [--gate-rate 5] [--gate-payers 19] [--window-seconds 30]
//
// Open loop: every call is sent at its scheduled time whatever the answers, and its latency counts from that time (no
// coordinated omission); a charge answered 503 is sent again with its payment id, as a client would. Reports, per
// window of `--window-seconds`: the charges' p50/p99, the gate flows' p99, errors, whether a close was in flight (from its POST to its answer), the API's and the worker's RSS and Redis' used_memory.
// Then the ratio p99(charges in windows with a close) / p99(charges in windows without), pooled per kind of window,
// Redis' used_memory per charge (after every close answered, less before the first charge), and each close's time.
// `BENCH_CPU_PROF=<dir>` writes the API's and the worker's CPU profiles there. Writes
// bench/results/x402-sessions-sustained[-own-backend].json. Loopback only; stops by itself.
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { MongoClient } from 'mongodb';
import { sharedBackend, startOwnBackend, stopOwnBackend } from './backend.ts';
import { memoryMiB, stopChild, type Child } from './growth/processes.ts';
import {
  benchService,
  buildService,
  cleanUpOnSignals,
  cpuProfileFlags,
  dropBenchData,
  MONGO_BASE,
  ROOT,
  startServiceProcesses,
  type BenchService,
} from './production-service.ts';
import { call, percentiles, positiveArg, Refused, registerAgent, writeResults, type Caller } from './side-by-side.ts';

const SECONDS = positiveArg('--seconds', 600);
const RATE = positiveArg('--rate', 500);
const SESSION_CHARGES = positiveArg('--session-charges', 20_000, { integer: true });
const SESSIONS = positiveArg('--sessions', 4, { integer: true });
const GATE_RATE = positiveArg('--gate-rate', 5);
const GATE_PAYERS = positiveArg('--gate-payers', 19, { integer: true });
const WINDOW_SECONDS = positiveArg('--window-seconds', 30);
const OWN_BACKEND = process.argv.includes('--own-backend');
const AMOUNT = 3;
const log = (line: string) => process.stderr.write(`[x402-sessions-sustained] ${line}\n`);
const round = (x: number, digits = 2) => Number(x.toFixed(digits));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha = (s: string) => createHash('sha256').update(s).digest('hex');

const children: Child[] = [];
let service: BenchService | null = null;

async function cleanup(): Promise<void> {
  for (const child of children.splice(0)) await stopChild(child).catch(() => undefined);
  if (OWN_BACKEND) await stopOwnBackend();
  else if (service) {
    const mongo = new MongoClient(MONGO_BASE, { serverSelectionTimeoutMS: 5_000 });
    await dropBenchData(service, mongo, log);
    await mongo.close().catch(() => undefined);
  }
}

/** One sample: when it was due (ms since the start) and how long it took from then. */
interface Sample {
  dueMs: number;
  ms: number;
}

/** A session in use by one slot: its id, charges sent to it, charges answered 201, and the calls still in flight. */
interface Slot {
  session: Promise<string>;
  quota: number;
  sent: number;
  charged: number;
  inFlight: Set<Promise<void>>;
}

async function main(): Promise<void> {
  cleanUpOnSignals(cleanup, log);
  log(
    `load average ${loadavg()
      .map((x) => round(x))
      .join(' ')}; ${cpus().length} CPUs; ${RATE} charges/s over ${SESSIONS} sessions of ${SESSION_CHARGES}, ` +
      `${GATE_RATE} gate flows/s over ${GATE_PAYERS} payers, ${SECONDS} s, ${WINDOW_SECONDS} s windows`,
  );
  buildService();
  const backend = OWN_BACKEND ? await startOwnBackend(log) : sharedBackend();
  service = benchService('sustained');
  service.env.MONGO_URL = `${backend.mongoBase}/${service.dbName}`;
  service.env.REDIS_URL = backend.redisUrl;
  const { api, worker, http } = await startServiceProcesses(service, 'sustained', cpuProfileFlags('sustained'));
  children.push(api, worker);
  const redis = new Redis(backend.redisUrl);
  const admin: Caller = { http, token: service.adminKey };

  // A 503 (the service's answer while a backend stalls) is retried: the setup, opening and
  // closing are safe to repeat (a credit twice only adds funds the bench never runs out of).
  const retried = async <T>(what: string, once: () => Promise<T>): Promise<T> => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await once();
      } catch (err) {
        if (!(err instanceof Refused) || attempt >= 10) throw err;
        log(`${what} refused (${err.message}), retrying`);
        await sleep(200 * attempt);
      }
    }
  };

  const tenant = await call(admin, 'POST', '/ops/tenants', { name: 'bench' });
  const token = (
    await call(admin, 'POST', '/ops/api-keys', {
      tenantId: tenant.tenantId,
      scopes: ['agents:write', 'x402:write', 'x402:read'],
    })
  ).token as string;
  const caller: Caller = { http, token };
  const payee = (await retried('register', () => registerAgent(caller, 'tool'))).agentId;
  const credit = async (agentId: string) =>
    retried('credit', () =>
      call(admin, 'POST', `/ops/wallets/${encodeURIComponent(agentId)}/credit`, {
        amount: 1_000_000_000,
        currency: 'USD',
      }),
    );
  const payer = (await retried('register', () => registerAgent(caller, 'session-payer'))).agentId;
  await credit(payer);
  const gatePayers = await Promise.all(
    Array.from({ length: GATE_PAYERS }, async (_, i) => {
      const agentId = (await retried('register', () => registerAgent(caller, `gate-payer${i}`))).agentId;
      await credit(agentId);
      return agentId;
    }),
  );

  const openSession = (key = randomUUID()): Promise<string> =>
    retried(
      'open',
      async () =>
        (
          await call(
            caller,
            'POST',
            '/x402/sessions',
            {
              payerAgentId: payer,
              payeeAgentIds: [payee],
              currency: 'USD',
              budget: SESSION_CHARGES * AMOUNT,
              maxPerCall: 100,
              ttlSeconds: 3_600,
            },
            [201],
            { 'idempotency-key': key },
          )
        ).sessionId as string,
    );
  // Sessions opened ahead, so that a slot whose session is full moves on at once.
  const spares: Array<Promise<string>> = Array.from({ length: 2 }, () => openSession());
  const nextSession = (): Promise<string> => {
    spares.push(openSession());
    return spares.shift()!;
  };
  // Staggered: slot k's first session closes after (k+1)/SESSIONS of the count, so closes come evenly spaced.
  const slots: Slot[] = await Promise.all(
    Array.from({ length: SESSIONS }, async (_, k) => ({
      session: Promise.resolve(await openSession()),
      quota: Math.max(1, Math.round((SESSION_CHARGES * (k + 1)) / SESSIONS)),
      sent: 0,
      charged: 0,
      inFlight: new Set<Promise<void>>(),
    })),
  );

  await sleep(2_000);
  const redisBefore = await usedMemory(redis);
  const started = performance.now();
  const at = () => performance.now() - started;
  const charges: Sample[] = [];
  const gates: Sample[] = [];
  const errors = { charge: {} as Record<string, number>, gate: {} as Record<string, number> };
  const count = (kind: 'charge' | 'gate', what: string) => (errors[kind][what] = (errors[kind][what] ?? 0) + 1);
  const closes: Array<{
    sessionId: string;
    charged: number;
    startMs: number;
    endMs: number | null;
    status: string | null;
    spent: number | null;
    chargesAnswered: number | null;
    error?: string;
  }> = [];
  const closing: Array<Promise<void>> = [];
  let retried503 = 0; // charges answered 503 and sent again with the same payment id
  const memory: Array<{ atMs: number; apiRss: number; workerRss: number; redisUsed: number }> = [];

  // A full session closes once its calls have answered (a call racing the close would be refused: not what this
  // measures); its charges keep flowing to the slot's next session meanwhile.
  const closeSession = (run: Slot): void => {
    closing.push(
      (async () => {
        await Promise.all([...run.inFlight]);
        const sessionId = await run.session;
        const record: (typeof closes)[number] = {
          sessionId,
          charged: run.charged,
          startMs: at(),
          endMs: null,
          status: null,
          spent: null,
          chargesAnswered: null,
        };
        closes.push(record);
        try {
          const answer = (await retried('close', () =>
            call(caller, 'POST', `/x402/sessions/${sessionId}/close`, {}, [200]),
          )) as { status: string; spent: number; charges: number };
          record.endMs = at();
          Object.assign(record, { status: answer.status, spent: answer.spent, chargesAnswered: answer.charges });
        } catch (err) {
          record.endMs ??= at();
          record.error = (err as Error).message;
          log(`close of ${sessionId} failed: ${record.error}`);
        }
      })(),
    );
  };

  const charge = (i: number): Promise<void> => {
    let run = slots[i % SESSIONS]!;
    if (run.sent >= run.quota) {
      closeSession(run);
      run = {
        session: nextSession(),
        quota: SESSION_CHARGES,
        sent: 0,
        charged: 0,
        inFlight: new Set(),
      };
      slots[i % SESSIONS] = run;
    }
    run.sent++;
    const dueMs = (i * 1000) / RATE;
    const done = (async () => {
      try {
        // A 503 may come after the charge was recorded (the request's deadline passed, not its work): the client
        // retries with the same payment id, as the contract says, and gets the one charge either way.
        const body = { paymentId: randomUUID(), payeeAgentId: payee, amount: AMOUNT, requestSha256: sha(randomUUID()) };
        const path = `/x402/sessions/${await run.session}/charges`;
        let res = await http.request('POST', path, { token, body });
        for (let retry = 1; res.status === 503 && retry <= 5; retry++) {
          retried503++;
          await sleep(100 * retry);
          res = await http.request('POST', path, { token, body });
        }
        if (res.status === 201) run.charged++;
        else {
          count('charge', String(res.status));
          if ((errors.charge[String(res.status)] ?? 0) <= 3) log(`charge -> ${res.status} ${res.text.slice(0, 200)}`);
        }
      } catch (err) {
        count('charge', (err as Error).message.slice(0, 60));
      }
      charges.push({ dueMs, ms: at() - dueMs });
    })();
    run.inFlight.add(done);
    void done.finally(() => run.inFlight.delete(done));
    return done;
  };

  const gateFlow = async (i: number): Promise<void> => {
    const dueMs = (i * 1000) / GATE_RATE;
    const seed = `${i} ${randomBytes(4).toString('hex')}`;
    try {
      const { gateId } = await call(
        caller,
        'POST',
        '/x402/gate/create',
        {
          payerAgentId: gatePayers[i % GATE_PAYERS]!,
          payeeAgentId: payee,
          amount: 100,
          currency: 'USD',
          holdbackBps: 0,
          disputeWindowSeconds: 3_600,
        },
        [201],
        { 'idempotency-key': randomUUID() },
      );
      const { quoteId, requestSha256 } = await call(
        caller,
        'POST',
        '/x402/gate/quote',
        { gateId, requestSha256: sha(seed) },
        [200],
        { 'idempotency-key': randomUUID() },
      );
      await call(caller, 'POST', '/x402/gate/authorize-payment', { gateId, quoteId, requestSha256 }, [200], {
        'idempotency-key': randomUUID(),
      });
      await call(
        caller,
        'POST',
        '/x402/gate/verify',
        { gateId, evidence: { responseSha256: sha(`response ${seed}`) } },
        [200, 202],
        { 'idempotency-key': randomUUID() },
      );
      gates.push({ dueMs, ms: at() - dueMs });
    } catch (err) {
      count('gate', err instanceof Refused ? err.message : (err as Error).message.slice(0, 80));
    }
  };

  // Memory once a second: the API's and the worker's RSS, Redis' used_memory.
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      memory.push({
        atMs: at(),
        apiRss: memoryMiB(api.pid).rss,
        workerRss: memoryMiB(worker.pid).rss,
        redisUsed: await usedMemory(redis),
      });
      await sleep(1_000);
    }
  })();

  const schedule = async (rate: number, once: (i: number) => Promise<void>, inFlight: Array<Promise<void>>) => {
    const total = Math.floor(rate * SECONDS);
    for (let i = 0; i < total; i++) {
      const wait = (i * 1000) / rate - at();
      if (wait > 1) await sleep(wait);
      inFlight.push(once(i));
      if (inFlight.length > 10_000) await Promise.all(inFlight.splice(0, 5_000));
    }
  };
  const chargeCalls: Array<Promise<void>> = [];
  const gateCalls: Array<Promise<void>> = [];
  log('running');
  const progress = setInterval(
    () => log(`${round(at() / 1000, 0)} s: ${charges.length} charges answered, ${closes.length} closes started`),
    30_000,
  );
  await Promise.all([
    schedule(RATE, charge, chargeCalls),
    GATE_RATE > 0 ? schedule(GATE_RATE, gateFlow, gateCalls) : null,
  ]);
  await Promise.all([...chargeCalls, ...gateCalls]);
  const loadEndMs = at();
  // The sessions still open close too, so that Redis' memory is measured with every session closed.
  log('closing the sessions still open');
  for (const run of slots) if (run.sent > 0) closeSession(run);
  clearInterval(progress);
  while (closing.length > 0) await Promise.all(closing.splice(0));
  await sleep(2_000);
  sampling = false;
  await sampler;
  const redisAfter = await usedMemory(redis);
  const chargedTotal = closes.reduce((sum, c) => sum + c.charged, 0);

  // Windows: by each call's scheduled time; a window "with a close" overlaps a close from its POST to its answer.
  const windowMs = WINDOW_SECONDS * 1000;
  const windowCount = Math.ceil(loadEndMs / windowMs);
  const closesDuringLoad = closes.filter((c) => c.startMs < loadEndMs);
  const windows = Array.from({ length: windowCount }, (_, w) => {
    const [from, to] = [w * windowMs, (w + 1) * windowMs];
    const inWindow = (s: Sample) => s.dueMs >= from && s.dueMs < to;
    const ch = charges.filter(inWindow).map((s) => s.ms);
    const gt = gates.filter(inWindow).map((s) => s.ms);
    const closesIn = closesDuringLoad.filter((c) => c.startMs < to && (c.endMs ?? loadEndMs) >= from).length;
    const mem = memory.filter((m) => m.atMs >= from && m.atMs < to);
    const last = mem[mem.length - 1];
    return {
      fromS: w * WINDOW_SECONDS,
      charges: ch.length > 0 ? percentiles(ch) : null,
      gateFlows: gt.length > 0 ? percentiles(gt) : null,
      closesInFlight: closesIn,
      apiRssMiB: last?.apiRss ?? null,
      workerRssMiB: last?.workerRss ?? null,
      redisUsedMiB: last ? round(last.redisUsed / 2 ** 20, 1) : null,
      latencies: ch,
      gateLatencies: gt,
    };
  });
  const pooled = (withClose: boolean, key: 'latencies' | 'gateLatencies') =>
    windows.filter((w) => w.closesInFlight > 0 === withClose).flatMap((w) => w[key]);
  const p99 = (xs: number[]) => (xs.length > 0 ? percentiles(xs).p99 : null);
  const withClose = p99(pooled(true, 'latencies'));
  const withoutClose = p99(pooled(false, 'latencies'));
  const gateWith = p99(pooled(true, 'gateLatencies'));
  const gateWithout = p99(pooled(false, 'gateLatencies'));
  const closeMs = closes.filter((c) => c.endMs !== null).map((c) => c.endMs! - c.startMs);
  const rss = (k: 'apiRss' | 'workerRss') => ({
    min: Math.min(...memory.map((m) => m[k])),
    max: Math.max(...memory.map((m) => m[k])),
    end: memory[memory.length - 1]?.[k] ?? null,
  });
  const wrongCloses = closes.filter(
    (c) => c.error || c.status !== 'closed' || c.spent !== c.charged * AMOUNT || c.chargesAnswered !== c.charged,
  );
  const ratio = withClose !== null && withoutClose !== null ? round(withClose / withoutClose, 3) : null;
  const out = {
    bench: 'x402-sessions-sustained',
    at: new Date().toISOString(),
    machine: { cpus: cpus().length, loadAverageAtEnd: loadavg().map((x) => round(x)) },
    backend: OWN_BACKEND ? 'own (bench/backend.ts)' : 'shared (scripts/services.sh)',
    options: {
      seconds: SECONDS,
      rate: RATE,
      sessionCharges: SESSION_CHARGES,
      sessions: SESSIONS,
      gateRate: GATE_RATE,
      gatePayers: GATE_PAYERS,
      windowSeconds: WINDOW_SECONDS,
    },
    charges: {
      sent: charges.length,
      charged: chargedTotal,
      errors: errors.charge,
      retriedAfter503: retried503,
      latency: percentiles(charges.map((s) => s.ms)),
    },
    gateFlows: {
      answered: gates.length,
      errors: errors.gate,
      latency: gates.length ? percentiles(gates.map((s) => s.ms)) : null,
    },
    closes: {
      count: closes.length,
      duringLoad: closesDuringLoad.length,
      ms: closeMs.length ? { ...percentiles(closeMs), max: round(Math.max(...closeMs)) } : null,
      wrong: wrongCloses.map(({ sessionId, charged, status, spent, chargesAnswered, error }) => ({
        sessionId,
        charged,
        status,
        spent,
        chargesAnswered,
        error,
      })),
    },
    windows: windows.map(({ latencies: _l, gateLatencies: _g, ...w }) => w),
    p99: {
      chargesWindowsWithClose: withClose,
      chargesWindowsWithoutClose: withoutClose,
      gateFlowsWindowsWithClose: gateWith,
      gateFlowsWindowsWithoutClose: gateWithout,
    },
    memory: {
      apiRssMiB: rss('apiRss'),
      workerRssMiB: rss('workerRss'),
      redisUsedBeforeMiB: round(redisBefore / 2 ** 20, 2),
      redisUsedAfterMiB: round(redisAfter / 2 ** 20, 2),
      redisBytesPerCharge: chargedTotal > 0 ? round((redisAfter - redisBefore) / chargedTotal, 1) : null,
    },
    ratios: {
      chargesP99WithCloseOverWithout: ratio,
      gateFlowsP99WithCloseOverWithout:
        gateWith !== null && gateWithout !== null ? round(gateWith / gateWithout, 3) : null,
    },
    targets: {
      closeCostsOthersAtMost2xP99: ratio !== null ? ratio <= 2 : null,
      noChargeErrors: Object.keys(errors.charge).length === 0,
      everyCloseRight: wrongCloses.length === 0,
    },
  };
  if (ratio === null) log('no ratio: every window had a close, or none did (run longer, or shorter windows)');
  else if (ratio > 2) log(`short of the target: p99 with a close is ${ratio}x the p99 without (at most 2x)`);
  redis.disconnect();
  writeResults(join(ROOT, `bench/results/x402-sessions-sustained${OWN_BACKEND ? '-own-backend' : ''}.json`), out, log);
}

async function usedMemory(redis: Redis): Promise<number> {
  const info = await redis.info('memory');
  return Number(/used_memory:(\d+)/.exec(info)?.[1] ?? NaN);
}

try {
  await main();
} finally {
  await cleanup();
}
process.exit(0);
