import { randomBytes } from 'node:crypto';
import { MongoClient } from 'mongodb';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { newId } from '../../src/domain/crypto.ts';
import { settlementStatuses } from './audit.ts';
import { FerretDbServer, RedisReplicaPair, RedisServer, redisCli } from './servers.ts';
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

// Issue 38: money that survives Redis losing its last writes. Payment sessions charge over HTTP against a Redis
// primary whose replica is caught up, then frozen so it lags; more charges are answered with signed receipts; the
// primary is SIGKILLed, the replica promoted and the service restarted against it (as an operator's config follows a
// failover). The calls then go on: new charges, and retries of charges whose answers the client lost (same payment
// ids). Every session closes, and every receipt the client holds must be in its signed statement and paid, every
// retry must answer its first receipt, no call may answer 500, and the ledger audit must be clean. The second case
// loses Redis entirely (a fresh, empty redis-server) instead.

const SESSIONS = 4;
const BUDGET = 100;
const MAX_PER_CALL = 10;
const PAYER_FUNDS = 1_000;
/** Charges per session while the replica is caught up, then while it lags (their receipts are what Redis loses). */
const BEFORE_LAG = 3;
const WHILE_LAGGING = 4;
/** At most this many charges per session in all (3 + 4 + 3 new), each at most 9: within the budget. */
const amountOf = (session: number, call: number) => 1 + ((session * 7 + call * 3) % 9);

/** What each session does after the failover. */
const AFTER = [
  'closes at once',
  'new charges only',
  'retries of lost answers only',
  'new charges and retries interleaved',
] as const;

interface Receipt {
  paymentId: string;
  payeeAgentId: string;
  amount: number;
  seq: number;
  receiptHash: string;
  chargeId: string;
}

interface Session {
  index: number;
  label: string;
  sessionId: string;
  payer: Agent;
  payees: [Agent, Agent];
  /** Every receipt the client was answered, by receiptHash (distinct receipts). */
  receipts: Map<string, Receipt>;
  /** The calls it made before the failover, in order (the ones it may retry). */
  sent: Receipt[];
}

/** One call after the failover, as the client saw it. */
interface AfterCall {
  session: string;
  kind: 'new' | 'retry';
  paymentId: string;
  status: number;
  code: string | null;
  seq: number | null;
  expectedSeq: number | null;
}

/** A tenant whose key opens and charges sessions and reads wallets. */
async function sessionTenant(base: string, adminKey: string): Promise<Tenant> {
  const admin = { authorization: `Bearer ${adminKey}` };
  const { tenantId } = await must(base, 'POST', '/ops/tenants', 201, {
    headers: { ...admin, 'idempotency-key': newId('k') },
    body: { name: 'rollback' },
  });
  const { token } = await must(base, 'POST', '/ops/api-keys', 201, {
    headers: { ...admin, 'idempotency-key': newId('k') },
    body: { tenantId, scopes: ['agents:write', 'wallets:write', 'x402:write'] },
  });
  return { tenantId, token, auth: { authorization: `Bearer ${token}` } };
}

/**
 * A call repeated (same body) only while the answer is transient: no answer, 503, 429 (a loaded machine, a process
 * still connecting). Bounded: 8 attempts, about 9 s of waits. A 500 is an answer: it is what the test looks for.
 */
async function definitive(base: string, method: string, path: string, tenant: Tenant, body?: unknown): Promise<Answer> {
  let answer: Answer | null = null;
  for (let attempt = 1; attempt <= 8; attempt++) {
    answer = await call(base, method, path, { body, headers: tenant.auth, timeoutMs: 15_000 });
    if (answer.status !== 0 && answer.status !== 503 && answer.status !== 429) return answer;
    await new Promise((r) => setTimeout(r, 250 * attempt));
  }
  return answer!;
}

function receiptOf(answer: Answer): Receipt {
  const b = answer.body;
  return {
    paymentId: b.paymentId,
    payeeAgentId: b.payeeAgentId,
    amount: b.amount,
    seq: b.seq,
    receiptHash: b.receipt.receiptHash,
    chargeId: b.chargeId,
  };
}

const sum = (receipts: Iterable<Receipt>) => [...receipts].reduce((total, r) => total + r.amount, 0);
const describeReceipts = (receipts: Iterable<Receipt>) =>
  [...receipts]
    .sort((a, b) => a.seq - b.seq)
    .map((r) => `#${r.seq} ${r.paymentId} ${r.amount}`)
    .join(', ');

/** A charge before the failover: it must be answered 201 with a receipt (the precondition of everything after). */
async function chargeBefore(base: string, tenant: Tenant, s: Session, call: number): Promise<void> {
  const paymentId = `before-${s.index}-${call}-${randomBytes(3).toString('hex')}`;
  const payee = s.payees[call % 2]!;
  const body = { paymentId, payeeAgentId: payee.agentId, amount: amountOf(s.index, call) };
  const answer = await definitive(base, 'POST', `/x402/sessions/${s.sessionId}/charges`, tenant, body);
  if (answer.status !== 201)
    throw new Error(
      `session ${s.label}: charge ${call} before the failover answered ${answer.status} ${JSON.stringify(answer.body)}`,
    );
  const receipt = receiptOf(answer);
  s.receipts.set(receipt.receiptHash, receipt);
  s.sent.push(receipt);
}

/** Where Redis loses what it held: a lagging replica promoted, or everything. */
type Loss = 'lagging-replica' | 'everything';

async function scenario(
  loss: Loss,
  ferret: FerretDbServer,
  processes: ServiceProcess[],
  cleanup: Array<() => Promise<void>>,
): Promise<void> {
  const started = Date.now();
  const figures: Record<string, unknown> = { loss };
  const phases: Record<string, number> = {};
  let phaseStarted = Date.now();
  /** Ends a phase: its duration goes into the figures. */
  const phase = (name: string) => {
    phases[name] = Date.now() - phaseStarted;
    phaseStarted = Date.now();
  };
  let pair: RedisReplicaPair | null = null;
  let redisUrl: string;
  let lonePrimary: RedisServer | null = null;
  if (loss === 'lagging-replica') {
    pair = await RedisReplicaPair.start();
    cleanup.push(() => pair!.destroy());
    redisUrl = pair.primary.url;
  } else {
    lonePrimary = await RedisServer.start();
    cleanup.push(() => lonePrimary!.destroy());
    redisUrl = lonePrimary.url;
  }
  const mongoUrl = ferret.url(`f_rollback_${randomBytes(4).toString('hex')}`);
  const env = serviceEnv(mongoUrl, redisUrl, { LOG_LEVEL: process.env.FAULT_LOG_LEVEL ?? 'warn' });
  const admin = env.SERVICE_ADMIN_KEY!;
  let api = await ServiceProcess.start('api', env);
  let worker = await ServiceProcess.start('worker', env);
  processes.push(api, worker);
  const before = { api, worker };
  onTestFailed(() => {
    for (const p of new Set([before.api, before.worker, api, worker]))
      console.log(`--- ${p.mode} (${p.env.REDIS_URL}) log tail ---\n${p.logs.slice(-6_000)}`);
  });

  const tenant = await sessionTenant(api.url, admin);
  const sessions: Session[] = [];
  for (let i = 0; i < SESSIONS; i++) {
    const payer = await registerAgent(api.url, tenant);
    const payees: [Agent, Agent] = [await registerAgent(api.url, tenant), await registerAgent(api.url, tenant)];
    await credit(api.url, admin, payer.agentId, PAYER_FUNDS);
    const opened = await must(api.url, 'POST', '/x402/sessions', 201, {
      headers: { ...tenant.auth, 'idempotency-key': newId('k') },
      body: {
        payerAgentId: payer.agentId,
        payeeAgentIds: payees.map((p) => p.agentId),
        currency: 'USD',
        budget: BUDGET,
        maxPerCall: MAX_PER_CALL,
        holdbackBps: 0,
      },
    });
    sessions.push({
      index: i,
      label: `${i} (${AFTER[i]})`,
      sessionId: opened.sessionId,
      payer,
      payees,
      receipts: new Map(),
      sent: [],
    });
  }
  phase('setup');

  // Charges while the replica is caught up: these survive the failover.
  await Promise.all(
    sessions.map(async (s) => {
      for (let c = 0; c < BEFORE_LAG; c++) await chargeBefore(api.url, tenant, s, c);
    }),
  );
  if (pair) {
    await pair.waitCaughtUp();
    await pair.freezeReplica();
  }
  // Charges the client holds receipts for, which the promoted replica (or the empty Redis) will not know of.
  await Promise.all(
    sessions.map(async (s) => {
      for (let c = BEFORE_LAG; c < BEFORE_LAG + WHILE_LAGGING; c++) await chargeBefore(api.url, tenant, s, c);
    }),
  );

  phase('charges');

  // The failover: the primary dies; its replica (lagging) is promoted, or a fresh empty Redis takes its place.
  let newRedis: { url: string; port: number };
  if (pair) {
    const offsets = await pair.failover();
    figures.replication = offsets;
    // The fault took: the promoted replica lacks the primary's last writes (the charges made while it lagged).
    expect(
      offsets.replicaOffset,
      `the promoted replica's offset ${offsets.replicaOffset} is behind the primary's ${offsets.primaryOffset}`,
    ).toBeLessThan(offsets.primaryOffset);
    newRedis = { url: pair.replica.url, port: pair.replica.port };
  } else {
    await lonePrimary!.down();
    const empty = await RedisServer.start();
    cleanup.push(() => empty.destroy());
    expect((await redisCli(empty.port, 'dbsize')).trim(), 'the new Redis is empty').toBe('0');
    newRedis = { url: empty.url, port: empty.port };
  }
  // What the new Redis holds of each session's budget (informational: the store's key layout may change).
  figures.budgetsAfterLoss = Object.fromEntries(
    await Promise.all(
      sessions.map(async (s) => {
        const [spent = '', seq = ''] = (
          await redisCli(
            newRedis.port,
            'hmget',
            `${env.REDIS_PREFIX}:{ses:${s.sessionId}}:budget`,
            'spent',
            'seq',
          ).catch(() => '?')
        ).split('\n');
        return [s.index, `spent=${spent.trim() || 'none'} seq=${seq.trim() || 'none'}`];
      }),
    ),
  );
  figures.receiptsBeforeLoss = Object.fromEntries(
    sessions.map((s) => [s.index, { receipts: s.receipts.size, charged: sum(s.receipts.values()) }]),
  );

  // The operator points the service at the new Redis: same database, prefix and keys.
  await Promise.all([api.stop(), worker.stop()]);
  const envAfter = { ...env, REDIS_URL: newRedis.url };
  api = await ServiceProcess.start('api', envAfter);
  worker = await ServiceProcess.start('worker', envAfter);
  processes.push(api, worker);
  phase('failoverAndRestart');

  // The calls go on. A retry is a client that lost the answer: same payment id, payee and amount; it must answer the
  // first receipt (same seq and receiptHash), never a 500 and never a second charge.
  const afterCalls: AfterCall[] = [];
  const newCharge = async (s: Session, n: number) => {
    const paymentId = `after-${s.index}-${n}-${randomBytes(3).toString('hex')}`;
    const amount = amountOf(s.index, BEFORE_LAG + WHILE_LAGGING + n);
    const answer = await definitive(api.url, 'POST', `/x402/sessions/${s.sessionId}/charges`, tenant, {
      paymentId,
      payeeAgentId: s.payees[n % 2]!.agentId,
      amount,
    });
    afterCalls.push({
      session: s.label,
      kind: 'new',
      paymentId,
      status: answer.status,
      code: answer.body?.code ?? null,
      seq: answer.body?.seq ?? null,
      expectedSeq: null,
    });
    expect
      .soft(
        answer.status,
        `session ${s.label}: new charge ${paymentId} after the failover answered ${answer.status} ${JSON.stringify(answer.body)}`,
      )
      .toBe(201);
    if (answer.status === 201) {
      const receipt = receiptOf(answer);
      expect.soft(answer.body.repeated, `session ${s.label}: new charge ${paymentId} answered as a repeat`).toBe(false);
      s.receipts.set(receipt.receiptHash, receipt);
    }
  };
  const retry = async (s: Session, held: Receipt) => {
    const answer = await definitive(api.url, 'POST', `/x402/sessions/${s.sessionId}/charges`, tenant, {
      paymentId: held.paymentId,
      payeeAgentId: held.payeeAgentId,
      amount: held.amount,
    });
    afterCalls.push({
      session: s.label,
      kind: 'retry',
      paymentId: held.paymentId,
      status: answer.status,
      code: answer.body?.code ?? null,
      seq: answer.body?.seq ?? null,
      expectedSeq: held.seq,
    });
    expect
      .soft(
        answer.status,
        `session ${s.label}: retry of ${held.paymentId} (receipt #${held.seq}) answered ${answer.status} ${JSON.stringify(answer.body)}`,
      )
      .toBe(201);
    if (answer.status !== 201) return;
    const got = receiptOf(answer);
    expect
      .soft(
        { seq: got.seq, receiptHash: got.receiptHash, repeated: answer.body.repeated },
        `session ${s.label}: retry of ${held.paymentId} must answer its first receipt #${held.seq}`,
      )
      .toEqual({ seq: held.seq, receiptHash: held.receiptHash, repeated: true });
    // A different receipt is one more the client holds (and a second charge for one call).
    s.receipts.set(got.receiptHash, got);
  };
  const lagging = (s: Session) => s.sent.slice(BEFORE_LAG);
  await Promise.all(
    sessions.map(async (s) => {
      switch (s.index) {
        case 0: // closes at once: the pure rollback
          return;
        case 1:
          for (let n = 0; n < 3; n++) await newCharge(s, n);
          return;
        case 2: // the lost answers retried in another order than first sent, and one from before the lag
          for (const held of [...lagging(s)].reverse()) await retry(s, held);
          await retry(s, s.sent[0]!);
          return;
        default: {
          const [a, b, , d] = lagging(s);
          await newCharge(s, 0);
          await retry(s, d!);
          await newCharge(s, 1);
          await retry(s, a!);
          await retry(s, b!);
          await newCharge(s, 2);
        }
      }
    }),
  );
  phase('afterCalls');
  figures.afterCalls = afterCalls.map(
    (c) =>
      `${c.session.split(' ')[0]} ${c.kind} ${c.status}${c.code ? ` ${c.code}` : ''}${c.seq !== null ? ` #${c.seq}` : ''}${c.expectedSeq !== null ? ` (first #${c.expectedSeq})` : ''}`,
  );

  // Every session closes; its signed statement must list exactly the receipts the client holds.
  const statements = new Map<number, any>();
  for (const s of sessions) {
    const closed = await definitive(api.url, 'POST', `/x402/sessions/${s.sessionId}/close`, tenant);
    expect
      .soft(closed.status, `session ${s.label}: close answered ${closed.status} ${JSON.stringify(closed.body)}`)
      .toBe(200);
    if (closed.status !== 200) continue;
    const statement = await definitive(api.url, 'GET', `/x402/sessions/${s.sessionId}/statement`, tenant);
    expect
      .soft(
        statement.status,
        `session ${s.label}: statement answered ${statement.status} ${JSON.stringify(statement.body)}`,
      )
      .toBe(200);
    if (statement.status === 200) statements.set(s.index, statement.body);
  }
  const perSession: Record<string, unknown> = {};
  for (const s of sessions) {
    const statement = statements.get(s.index);
    const held = [...s.receipts.values()];
    const expected = sum(held);
    if (!statement) continue;
    const body = statement.body;
    const listed = new Map<string, any>(statement.charges.map((c: any) => [c.receiptHash, c]));
    const missing = held.filter((r) => !listed.has(r.receiptHash));
    const unreceipted = statement.charges.filter((c: any) => !s.receipts.has(c.receiptHash));
    perSession[s.index] = {
      receipts: held.length,
      receipted: expected,
      statement: {
        totalCharged: body.totalCharged,
        refunded: body.refunded,
        charges: statement.charges.length,
        voided: body.voided,
      },
    };
    const what = `session ${s.label} ${s.sessionId}: the client holds ${held.length} receipts for ${expected} (${describeReceipts(held)}); the statement says totalCharged ${body.totalCharged}, refunded ${body.refunded}, ${statement.charges.length} charges`;
    expect.soft(body.totalCharged, `${what}: totalCharged`).toBe(expected);
    expect.soft(body.refunded, `${what}: refunded must be budget ${BUDGET} - ${expected}`).toBe(BUDGET - expected);
    expect
      .soft(
        missing.map((r) => `#${r.seq} ${r.paymentId}`),
        `${what}: receipts missing from the statement`,
      )
      .toEqual([]);
    expect
      .soft(
        unreceipted.map((c: any) => `#${c.seq} ${c.paymentId}`),
        `${what}: statement charges the client holds no receipt for`,
      )
      .toEqual([]);
    const paymentIds = statement.charges.map((c: any) => c.paymentId);
    expect
      .soft(
        paymentIds.filter((p: string, i: number) => paymentIds.indexOf(p) !== i),
        `${what}: payment ids charged twice`,
      )
      .toEqual([]);
  }
  figures.sessions = perSession;
  phase('close');

  // Each payee is paid through a settlement of its own: wait for them, then the wallets must hold what the receipts say.
  const settlementIds = [...statements.values()].flatMap((st) =>
    (st.body.payees as Array<{ settlementId: string | null }>)
      .map((p) => p.settlementId)
      .filter((id): id is string => id !== null),
  );
  const mongo = new MongoClient(mongoUrl, { serverSelectionTimeoutMS: 10_000 });
  try {
    const settled = await eventually(
      async () => {
        const statuses = await settlementStatuses(mongo.db());
        return settlementIds.every((id) => statuses.get(id) === 'completed');
      },
      90_000,
      `the sessions' ${settlementIds.length} settlements completed`,
      500,
    ).catch((err: Error) => err);
    expect.soft(settled instanceof Error ? settled.message : 'completed').toBe('completed');
  } finally {
    await mongo.close();
  }
  const wallet = async (agentId: string) => {
    const answer = await definitive(api.url, 'GET', `/v1/wallets/${encodeURIComponent(agentId)}`, tenant);
    expect(answer.status, JSON.stringify(answer.body)).toBe(200);
    return (answer.body.balances?.USD ?? { available: 0, escrow: 0 }) as { available: number; escrow: number };
  };
  phase('settlements');
  for (const s of sessions) {
    const statement = statements.get(s.index);
    const held = [...s.receipts.values()];
    for (const payee of s.payees) {
      const receipted = sum(held.filter((r) => r.payeeAgentId === payee.agentId));
      const stated = (statement?.body.payees as Array<{ payeeAgentId: string; charged: number }> | undefined)?.find(
        (p) => p.payeeAgentId === payee.agentId,
      )?.charged;
      const balance = await wallet(payee.agentId);
      expect
        .soft(
          { available: balance.available, escrow: balance.escrow },
          `session ${s.label}: payee ${payee.agentId} holds receipts for ${receipted}, its statement line says ${stated}`,
        )
        .toEqual({ available: receipted, escrow: 0 });
    }
    const expected = sum(held);
    const balance = await wallet(s.payer.agentId);
    expect
      .soft(
        balance,
        `session ${s.label}: payer ${s.payer.agentId} funded ${PAYER_FUNDS}, spent ${expected} by its receipts`,
      )
      .toEqual({ available: PAYER_FUNDS - expected, escrow: 0 });
  }

  // The service's own audit of the books.
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
  expect.soft(audit!.body.violations, 'GET /ops/ledger/audit violations').toEqual([]);
  figures.auditViolations = audit!.body.violations.length;
  figures.serviceLogMoneyInvariantErrors = [api, worker].reduce(
    (n, p) => n + (p.logs.match(/MoneyInvariantError/g)?.length ?? 0),
    0,
  );
  phase('walletsAndAudit');
  figures.phasesMs = phases;
  figures.tookMs = Date.now() - started;
  console.log(`fault figures (redis rollback, ${loss}): ${JSON.stringify(figures)}`);
}

describe('money that survives Redis losing its last writes (issue 38)', () => {
  let ferret: FerretDbServer;
  const processes: ServiceProcess[] = [];
  const cleanup: Array<() => Promise<void>> = [];
  beforeAll(async () => {
    ferret = await FerretDbServer.start();
  });
  // Each case's processes and Redis servers go when it ends, so the next one runs alone on the machine's cores.
  afterEach(async () => {
    for (const p of processes.splice(0)) await p.stop().catch(() => undefined);
    for (const done of cleanup.splice(0)) await done().catch(() => undefined);
  });
  afterAll(async () => {
    await ferret?.destroy();
  });

  it('a lagging replica promoted after the primary dies: every receipt paid, retries answer their receipt, no 500, audit clean', async () => {
    await scenario('lagging-replica', ferret, processes, cleanup);
  }, 300_000);

  it('a Redis that comes back empty: every receipt paid, retries answer their receipt, no 500, audit clean', async () => {
    await scenario('everything', ferret, processes, cleanup);
  }, 300_000);
});
