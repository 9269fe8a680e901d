import { createHash, randomBytes } from 'node:crypto';
import fc from 'fast-check';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import { X402_SESSION_SCHEME, x402RequestSha256 } from '../../src/domain/x402.ts';
import { createProcessors } from '../../src/workers/index.ts';
import type { ProcessorMap } from '../../src/workers/runner.ts';
import { expectCleanAudit } from '../helpers/audit.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { registerAgent } from '../helpers/agents.ts';
import { credit } from '../helpers/money.ts';
import { get, post, sponsorWallet, X402_SCOPES } from './helpers.ts';

// Model-based test of payment sessions (issue 38): fast-check generates sequences of opens (the payer's wallet or a
// sponsor's under its policy), charges, retries, reused payment ids, facilitator holds and captures, closes, expiries,
// crashes at failpoints, and rollbacks of one session's Redis budget to an earlier snapshot (DUMP, later RESTORE
// REPLACE of its two keys: what a lagging replica promoted after a failover holds). A small reference model keeps
// what the client was told (receipts), what is held, each session's budget and every wallet's balance; the service
// must agree with it after every command and, once every session is closed, in every statement, every balance and
// the ledger audit.
//
// Before a session's first rollback the model is exact (spent, seq of every debit, remaining). After it the model
// knows only what MongoDB records and the client holds: a receipt answered stays that receipt and is paid, a retry
// answers it, nothing is charged twice, the budget is never overspent; whether a call within the budget is refused
// depends on how the service reconciles Redis with the record, so both answers are allowed there (see expectDebit).
// A verified hold can always be captured (up to what it held), rollback or not: holds bear on money too (issue 38).
// Refusals must carry the contract's code; through the facilitator, its reason (X402_SESSION_CLOSED -> session_closed).

const RUNS = Number(process.env.SESSIONS_MODEL_RUNS ?? 20);
const MAX_COMMANDS = 25;
// `npm test` runs from a fixed seed, so the suite (and CI's gate) is the same every time; new sequences are explored
// by hand: SESSIONS_MODEL_SEED=random (or a number) with SESSIONS_MODEL_RUNS=100 or more. A failure found that way is
// fixed and its case kept in test/x402/session-rollback.test.ts.
const FIXED_SEED = 20261128;
const SEED_ENV = process.env.SESSIONS_MODEL_SEED;
const SEED = SEED_ENV === 'random' ? undefined : SEED_ENV ? Number(SEED_ENV) : FIXED_SEED;
const PATH = process.env.SESSIONS_MODEL_PATH; // fast-check's replay path, printed with the seed on failure
// For diagnosis only, to see which failures remain without some commands (the test runs them all):
// SESSIONS_MODEL_AVOID=rollback,asset,payee,sponsor-retry.
const AVOID = new Set((process.env.SESSIONS_MODEL_AVOID ?? '').split(',').filter(Boolean));
const NO_ROLLBACK = AVOID.has('rollback');

const PAYER_FUNDS = 150;
const SHORT_TTL_MS = 1_000;
const CHARGE_POINTS = ['x402.session.debited', 'x402.session.charged'] as const;
const OPEN_POINTS = ['x402.session.recorded', 'x402.session.locked'] as const;
const CLOSE_POINTS = [
  'x402.session.stopped',
  'x402.session.voided',
  'x402.session.closed',
  'x402.session.refunded',
  'x402.session.payee-settled',
] as const;

type Status = 'closed' | 'expired';

interface Paid {
  payee: string;
  amount: number;
  /** What the client was answered (null: charged by a request that crashed after recording it, not yet retried). */
  seq: number | null;
  receiptHash: string | null;
  chargeId: string | null;
  via: 'charge' | 'capture';
  /** The request as first sent: a retry sends exactly this. */
  body: Record<string, unknown>;
}

interface Held {
  payee: string;
  amount: number;
  /** The seq the hold's debit took (exact mode only). */
  seq: number | null;
}

interface Lost {
  payee: string;
  amount: number;
  via: 'charge' | 'capture';
  body: Record<string, unknown>;
}

interface MSession {
  id: string;
  walletId: string;
  payees: string[];
  budget: number;
  maxPerCall: number;
  expiresAt: number;
  short: boolean;
  closed: Status | null;
  /** Recorded charges by payment id. */
  charged: Map<string, Paid>;
  /** Verified, not captured (voided at the close). */
  holds: Map<string, Held>;
  /** Debited by a request that crashed before recording its charge (voided at the close unless retried first). */
  lost: Map<string, Lost>;
  /** Debits handed out (exact mode: the next debit's seq is seqs + 1). */
  seqs: number;
  /** Rolled back at least once: from then on only the recorded facts are certain. */
  uncertain: boolean;
  /** An upper bound of what the service may count against the budget (every debit ever made, retries included). */
  mayCount: number;
  snapshot: { budget: Buffer | null; payments: Buffer | null } | null;
}

interface World {
  t: TestApp;
  auth: Record<string, string>;
  processors: ProcessorMap;
  payer: string;
  /** p1, p2 may be a session's payees; p3 never is. */
  payees: [string, string, string];
  sponsor: string;
  policy: { perCallLimit: number; dailyLimit: number; allowed: string[] };
  sponsorToday: number;
  sessions: MSession[];
  wallets: Map<string, { available: number; escrow: number }>;
  /** Every chargeId answered to the client -> the payment it answered (two payments never share one). */
  chargeIds: Map<string, string>;
  counter: number;
}

/** What the runs exercised (printed at the end: a model test that refuses everything proves little). */
const stats = new Map<string, number>();
const bump = (key: string) => stats.set(key, (stats.get(key) ?? 0) + 1);

interface Expect {
  ok: boolean;
  codes: Set<string>;
}

const sum = (values: Iterable<{ amount: number }>) => [...values].reduce((n, v) => n + v.amount, 0);
const chargedTotal = (s: MSession) => sum(s.charged.values());
const used = (s: MSession) => chargedTotal(s) + sum(s.holds.values()) + sum(s.lost.values());
const hash = (label: string) => createHash('sha256').update(label).digest('hex');
const closedCode = (status: Status) => (status === 'expired' ? 'X402_SESSION_EXPIRED' : 'X402_SESSION_CLOSED');
/** Our codes as the facilitator's reasons: X402_SESSION_BUDGET_EXCEEDED -> session_budget_exceeded. */
const reasonOf = (code: string) => code.replace(/^X402_/, '').toLowerCase();

function describeExpect(e: Expect): string {
  return `${e.ok ? '201' : ''}${e.ok && e.codes.size ? ' or ' : ''}${[...e.codes].join('|')}`;
}

/**
 * What a new debit (a charge, a hold, or a capture that finds no hold) must answer, in the order the service checks:
 * payee, per-call maximum, closed, expired, budget. `t0`/`t1` bracket the request: a session whose expiry falls
 * between them may answer either way.
 */
function expectDebit(s: MSession, payee: string, amount: number, t0: number, t1: number): Expect {
  if (!s.payees.includes(payee)) return { ok: false, codes: new Set(['X402_SESSION_PAYEE_NOT_ALLOWED']) };
  if (amount > s.maxPerCall) return { ok: false, codes: new Set(['X402_SESSION_LIMIT_EXCEEDED']) };
  if (s.closed) return { ok: false, codes: new Set([closedCode(s.closed)]) };
  if (t0 >= s.expiresAt) return { ok: false, codes: new Set(['X402_SESSION_EXPIRED']) };
  const e: Expect = { ok: true, codes: new Set() };
  if (s.uncertain) {
    // Never past the budget by the recorded charges; surely accepted when nothing the service might still count
    // (every debit ever made, retries included) leaves too little.
    if (chargedTotal(s) + amount > s.budget) e.ok = false;
    if (!(s.mayCount + amount <= s.budget) || !e.ok) e.codes.add('X402_SESSION_BUDGET_EXCEEDED');
  } else if (used(s) + amount > s.budget) {
    e.ok = false;
    e.codes.add('X402_SESSION_BUDGET_EXCEEDED');
  }
  if (t1 >= s.expiresAt) e.codes.add('X402_SESSION_EXPIRED');
  return e;
}

function check(label: string, e: Expect, status: number, code: string | undefined, body: string) {
  bump(`${label.split('(')[0]} ${status === 201 || status === 200 ? 'ok' : code}`);
  if (status === 201 || status === 200) {
    if (!e.ok) throw new Error(`${label}: answered ${status}, the model expected ${describeExpect(e)}: ${body}`);
    return;
  }
  if (!code || !e.codes.has(code))
    throw new Error(`${label}: answered ${status} ${code ?? ''}, the model expected ${describeExpect(e)}: ${body}`);
}

function wallet(w: World, id: string) {
  let b = w.wallets.get(id);
  if (!b) w.wallets.set(id, (b = { available: 0, escrow: 0 }));
  return b;
}

function budgetKeys(w: World, s: MSession): [string, string] {
  // X402SessionStore.keys: one hash tag, the budget hash and the payments hash.
  const tag = `${w.t.runtime.config.redisPrefix}:{ses:${s.id}}`;
  return [`${tag}:budget`, `${tag}:payments`];
}

/** A receipt the client got: seen once per payment; no two payments hold one charge. */
function noteReceipt(w: World, s: MSession, paymentId: string, chargeId: string) {
  const prior = w.chargeIds.get(chargeId);
  if (prior && prior !== paymentId)
    throw new Error(`${s.id}: charge ${chargeId} answered for payment ${prior} and for payment ${paymentId}`);
  w.chargeIds.set(chargeId, paymentId);
}

/** The model's close: holds and lost debits void, the rest back to the paying wallet, each payee paid its charges. */
function closeInModel(w: World, s: MSession, status: Status) {
  if (s.closed) return;
  s.closed = status;
  s.holds.clear();
  s.lost.clear();
  const charged = chargedTotal(s);
  const payer = wallet(w, s.walletId);
  payer.escrow -= s.budget;
  payer.available += s.budget - charged;
  for (const c of s.charged.values()) wallet(w, c.payee).available += c.amount;
}

const nextPaymentId = (w: World) => `pay-${w.counter++}-${randomBytes(3).toString('hex')}`;

async function sweep(w: World) {
  const t0 = Date.now();
  await w.processors['x402-verify']!.sweep!();
  await w.processors.settle!.sweep!();
  const t1 = Date.now();
  // Sessions past their expiry when the sweep began are closed by it; those that expired during it may be.
  for (const s of w.sessions) {
    if (s.closed || s.expiresAt > t1) continue;
    const status = (await get(w.t, w.auth, `/x402/sessions/${s.id}`)).json().status as string;
    if (status === 'expired') closeInModel(w, s, 'expired');
    else if (s.expiresAt <= t0)
      throw new Error(`${s.id}: past its expiry when the sweep ran, still ${status} after it`);
  }
}

/** What the service says of the session agrees with the model (one GET: cheap enough after every command). */
async function checkSession(w: World, s: MSession) {
  const res = await get(w.t, w.auth, `/x402/sessions/${s.id}`);
  expect(res.statusCode, res.body).toBe(200);
  const view = res.json();
  expect(view.spent, `${s.id} spent within its budget: ${res.body}`).toBeLessThanOrEqual(s.budget);
  expect(view.remaining, res.body).toBeGreaterThanOrEqual(0);
  if (s.closed) {
    expect({ status: view.status, spent: view.spent, refunded: view.refunded }, `${s.id} closed: ${res.body}`).toEqual({
      status: s.closed,
      spent: chargedTotal(s),
      refunded: s.budget - chargedTotal(s),
    });
    return;
  }
  expect(view.status, res.body).toBe('open');
  if (!s.uncertain)
    expect({ spent: view.spent, charges: view.charges }, `${s.id} open: ${res.body}`).toEqual({
      spent: used(s),
      charges: s.seqs,
    });
}

let crashed = false;
function arm(point: string) {
  armFailpoint(point, () => {
    crashed = true;
    throw new FailpointCrash(point);
  });
}

/** A request that may crash at an armed failpoint: answers its first answer, and whether the failpoint fired. */
async function crashable<T extends { statusCode: number; body: string }>(
  point: string | null,
  send: () => Promise<T>,
): Promise<{ res: T; crash: boolean }> {
  crashed = false;
  if (point) arm(point);
  try {
    const res = await send();
    if (res.statusCode === 500) {
      if (!crashed) throw new Error(`500 without a crash: ${res.body}`);
      return { res, crash: true };
    }
    if (crashed)
      throw new Error(`the failpoint ${point} fired but the request answered ${res.statusCode}: ${res.body}`);
    return { res, crash: false };
  } finally {
    disarmFailpoints();
  }
}

const chargeBody = (paymentId: string, payee: string, amount: number) => ({
  paymentId,
  payeeAgentId: payee,
  amount,
  requestSha256: hash(paymentId),
});

function facilitatorBody(
  w: World,
  s: MSession,
  paymentId: string,
  payee: string,
  held: number,
  settle?: { amount?: number; payee?: string; asset?: string },
) {
  const url = `https://tool.example/model/${paymentId}`;
  const accepted = {
    scheme: X402_SESSION_SCHEME,
    network: w.t.config.x402.network,
    asset: settle?.asset ?? 'USD',
    amount: String(held),
    payTo: settle?.payee ?? payee,
    maxTimeoutSeconds: 60,
    extra: { method: 'GET', resource: url },
  };
  return {
    x402Version: 2,
    paymentPayload: {
      x402Version: 2,
      resource: { url },
      accepted,
      payload: { sessionId: s.id, paymentId, requestSha256: x402RequestSha256({ method: 'GET', resource: url }) },
    },
    paymentRequirements: { ...accepted, amount: String(settle?.amount ?? held) },
  };
}

const facilitator = (w: World, action: 'verify' | 'settle', body: unknown) =>
  post(w.t, w.auth, `/x402/facilitator/${action}`, body);

/** A settle's answer as a charge's: status 201 for success, the refusal's reason as its code. */
function settleOutcome(res: { statusCode: number; body: string; json(): any }) {
  if (res.statusCode !== 200) return { status: res.statusCode, code: `HTTP_${res.statusCode}` };
  const a = res.json();
  return a.success ? { status: 201, code: undefined } : { status: 409, code: a.errorReason as string };
}

const asReasons = (e: Expect): Expect => ({ ok: e.ok, codes: new Set([...e.codes].map(reasonOf)) });

/**
 * Sends a payment again exactly as first sent. A recorded charge answers its receipt (whatever happened to the
 * session or to Redis since); a debit that crashed before its record is recorded now while the session is open and
 * refused once the close voided it.
 */
async function retry(w: World, s: MSession, paymentId: string, label: string) {
  const paid = s.charged.get(paymentId);
  const lost = s.lost.get(paymentId);
  if (!paid && !lost) throw new Error(`retry of ${paymentId}: neither charged nor debited`);
  const { via, body } = (paid ?? lost)!;
  const t0 = Date.now();
  const res =
    via === 'charge'
      ? await post(w.t, w.auth, `/x402/sessions/${s.id}/charges`, body)
      : await facilitator(w, 'settle', body);
  const t1 = Date.now();
  const out =
    via === 'charge' ? { status: res.statusCode, code: res.json().code as string | undefined } : settleOutcome(res);
  const answer = res.json();
  const seq = via === 'charge' ? answer.seq : answer.extra?.seq;
  const receiptHash = via === 'charge' ? answer.receipt?.receiptHash : answer.extra?.receiptHash;
  const chargeId = via === 'charge' ? answer.chargeId : answer.transaction;
  if (paid) {
    if (out.status !== 201)
      throw new Error(
        `${label}: a retry of charged payment ${paymentId} (${paid.amount} to ${paid.payee}) answered ${res.statusCode} ${out.code}, not its receipt: ${res.body}`,
      );
    if (paid.receiptHash) {
      expect({ seq, receiptHash, chargeId }, `${label}: a retry answers the same receipt`).toEqual({
        seq: paid.seq,
        receiptHash: paid.receiptHash,
        chargeId: paid.chargeId,
      });
    } else {
      Object.assign(paid, { seq, receiptHash, chargeId });
      noteReceipt(w, s, paymentId, chargeId);
    }
    if (via === 'charge') expect(answer.repeated, label).toBe(true);
    return;
  }
  const item = lost!;
  let e: Expect;
  if (s.closed) e = { ok: false, codes: new Set([closedCode(s.closed)]) };
  else if (!s.uncertain)
    e = { ok: true, codes: new Set() }; // its debit is in Redis: recorded now, whatever the time
  else {
    e = expectDebit(s, item.payee, item.amount, t0, t1);
    if (e.ok) e.codes.add('X402_SESSION_BUDGET_EXCEEDED'); // Redis may have kept the debit or lost it
  }
  check(
    `${label}: retry of the crashed payment ${paymentId}`,
    via === 'charge' ? e : asReasons(e),
    out.status,
    out.code,
    res.body,
  );
  s.lost.delete(paymentId);
  if (out.status === 201) {
    s.charged.set(paymentId, { payee: item.payee, amount: item.amount, seq, receiptHash, chargeId, via, body });
    noteReceipt(w, s, paymentId, chargeId);
    if (s.uncertain) s.mayCount += item.amount;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Commands. Sessions and payments are picked by index modulo what the model holds, so shrinking keeps them valid.

type Cmd = fc.AsyncCommand<World, World>;

const session = fc.nat({ max: 7 });
/** True about once in n (shrinks to false). */
const rarely = (n: number) => fc.integer({ min: 1, max: n }).map((x) => x === n);
/** `arb` about once in n, else null. */
const rarelyOr = <T>(n: number, arb: fc.Arbitrary<T>) =>
  fc.oneof({ arbitrary: fc.constant(null), weight: n - 1 }, { arbitrary: arb, weight: 1 });
const pick = <T>(items: readonly T[], i: number): T => items[i % items.length]!;
const openSessions = (w: World) => w.sessions.filter((s) => !s.closed);

/** Where a call goes: mostly an open session, a payee it lists, an amount within its per-call maximum. */
interface Target {
  s: number;
  anyState: boolean;
  stranger: boolean;
  payee: number;
  amount: number;
  over: boolean;
}

const targetArb = fc.record({
  s: session,
  anyState: rarely(6),
  stranger: rarely(10),
  payee: fc.nat({ max: 1 }),
  amount: fc.integer({ min: 1, max: 10 }),
  over: rarely(10),
});

function resolve(w: World, p: Target): { s: MSession; payee: string; amount: number } {
  const open = openSessions(w);
  const s = pick(p.anyState || open.length === 0 ? w.sessions : open, p.s);
  const payee = p.stranger ? w.payees.find((x) => !s.payees.includes(x))! : pick(s.payees, p.payee);
  return { s, payee, amount: p.over ? s.maxPerCall + 1 : ((p.amount - 1) % s.maxPerCall) + 1 };
}

/** A target as generated (the resolved session, payee and amount are in the failure's message). */
const shownTarget = (p: Target) =>
  `${p.anyState ? 'any' : 'open'} session #${p.s}, ${p.stranger ? 'an unlisted payee' : `payee #${p.payee}`}, ${p.over ? 'maxPerCall + 1' : `amount ${p.amount}`}`;

class OpenCmd implements Cmd {
  constructor(
    readonly p: {
      sponsor: boolean;
      payees: number;
      budget: number;
      maxPerCall: number;
      short: boolean;
      crash: number | null;
    },
  ) {}
  check(w: Readonly<World>) {
    return w.sessions.length < 4;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const { p } = this;
    const payees = [[w.payees[0]], [w.payees[1]], [w.payees[0], w.payees[1]]][p.payees]!;
    const maxPerCall = Math.min(p.maxPerCall, p.budget);
    const body = {
      payerAgentId: w.payer,
      payeeAgentIds: payees,
      currency: 'USD',
      budget: p.budget,
      maxPerCall,
      holdbackBps: 0,
      ttlSeconds: p.short ? SHORT_TTL_MS / 1000 : 3_600,
      ...(p.sponsor ? { sponsorWalletId: w.sponsor } : {}),
    };
    const walletId = p.sponsor ? w.sponsor : w.payer;
    // What the open must answer: the sponsor's policy (per call, payees, today's total), then the funds.
    let expected: string | null = null;
    if (
      p.sponsor &&
      (maxPerCall > w.policy.perCallLimit ||
        payees.some((x) => !w.policy.allowed.includes(x)) ||
        w.sponsorToday + p.budget > w.policy.dailyLimit)
    )
      expected = 'X402_WALLET_POLICY_VIOLATION';
    else if (wallet(w, walletId).available < p.budget) expected = 'INSUFFICIENT_FUNDS';
    const key = randomBytes(8).toString('hex');
    const send = () => post(w.t, w.auth, '/x402/sessions', body, { 'idempotency-key': key });
    const point = p.crash === null || (p.sponsor && AVOID.has('sponsor-retry')) ? null : pick(OPEN_POINTS, p.crash);
    let { res, crash } = await crashable(point, send);
    if (crash) {
      await sweep(w);
      res = await send(); // the client retries with the same key
    }
    if (expected) {
      expect(
        { status: res.statusCode, code: res.json().code },
        `open ${JSON.stringify(body)}: ${res.body}`,
      ).toMatchObject({ code: expected });
      return;
    }
    expect(res.statusCode, `open ${JSON.stringify(body)}: ${res.body}`).toBe(201);
    const view = res.json();
    if (p.sponsor) w.sponsorToday += p.budget;
    const b = wallet(w, walletId);
    b.available -= p.budget;
    b.escrow += p.budget;
    const s: MSession = {
      id: view.sessionId,
      walletId,
      payees,
      budget: p.budget,
      maxPerCall,
      expiresAt: Date.parse(view.expiresAt),
      short: p.short,
      closed: null,
      charged: new Map(),
      holds: new Map(),
      lost: new Map(),
      seqs: 0,
      uncertain: false,
      mayCount: 0,
      snapshot: null,
    };
    w.sessions.push(s);
    await checkSession(w, s);
  }
  toString() {
    const p = this.p;
    return `open(${p.sponsor ? 'sponsor' : 'payer'}, payees ${['p1', 'p2', 'p1+p2'][p.payees]}, budget ${p.budget}, max ${Math.min(p.maxPerCall, p.budget)}${p.short ? ', ttl 1s' : ''}${p.crash === null ? '' : `, crash ${pick(OPEN_POINTS, p.crash)}`})`;
  }
}

class ChargeCmd implements Cmd {
  constructor(readonly p: Target & { crash: null | { point: number; retry: boolean } }) {}
  check(w: Readonly<World>) {
    return w.sessions.length > 0;
  }
  async run(w: World) {
    bump('cmd charge');
    const { s, payee, amount } = resolve(w, this.p);
    const paymentId = nextPaymentId(w);
    const body = chargeBody(paymentId, payee, amount);
    const point = this.p.crash ? pick(CHARGE_POINTS, this.p.crash.point) : null;
    const t0 = Date.now();
    const { res, crash } = await crashable(point, () => post(w.t, w.auth, `/x402/sessions/${s.id}/charges`, body));
    const t1 = Date.now();
    const label = `${this}: ${amount} to p${w.payees.indexOf(payee) + 1} on session #${w.sessions.indexOf(s)} ${s.id}`;
    if (crash) {
      // The debit was made; the crash was before (debited) or after (charged) its record.
      s.seqs++;
      s.mayCount += amount;
      if (point === 'x402.session.charged')
        s.charged.set(paymentId, {
          payee,
          amount: amount,
          seq: null,
          receiptHash: null,
          chargeId: null,
          via: 'charge',
          body,
        });
      else s.lost.set(paymentId, { payee, amount: amount, via: 'charge', body });
      if (this.p.crash!.retry) {
        await sweep(w);
        await retry(w, s, paymentId, label);
      }
      await checkSession(w, s);
      return;
    }
    const e = expectDebit(s, payee, amount, t0, t1);
    check(label, e, res.statusCode, res.json().code, res.body);
    if (res.statusCode === 201) {
      const a = res.json();
      s.seqs++;
      s.mayCount += amount;
      expect(
        {
          amount: a.amount,
          payee: a.payeeAgentId,
          paymentId: a.paymentId,
          repeated: a.repeated,
          receipt: a.receipt.body.amount,
        },
        label,
      ).toEqual({ amount: amount, payee, paymentId, repeated: false, receipt: amount });
      s.charged.set(paymentId, {
        payee,
        amount: amount,
        seq: a.seq,
        receiptHash: a.receipt.receiptHash,
        chargeId: a.chargeId,
        via: 'charge',
        body,
      });
      noteReceipt(w, s, paymentId, a.chargeId);
      if (!s.uncertain)
        expect({ seq: a.seq, remaining: a.remaining }, label).toEqual({ seq: s.seqs, remaining: s.budget - used(s) });
    }
    await checkSession(w, s);
  }
  toString() {
    const c = this.p.crash;
    return `charge(${shownTarget(this.p)}${c ? `, crash ${pick(CHARGE_POINTS, c.point)}${c.retry ? ' + retry' : ', never retried'}` : ''})`;
  }
}

/** Payments a client may send again: every charge or capture it sent that was recorded or debited. */
function retriable(w: World): Array<{ s: MSession; paymentId: string }> {
  const out: Array<{ s: MSession; paymentId: string }> = [];
  for (const s of w.sessions) {
    for (const id of s.charged.keys()) out.push({ s, paymentId: id });
    for (const id of s.lost.keys()) out.push({ s, paymentId: id });
  }
  return out;
}

class RetryCmd implements Cmd {
  constructor(readonly i: number) {}
  check(w: Readonly<World>) {
    return retriable(w as World).length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const { s, paymentId } = pick(retriable(w), this.i);
    await retry(w, s, paymentId, `${this} (${paymentId} on ${s.id})`);
    await checkSession(w, s);
  }
  toString() {
    return `retry(payment #${this.i})`;
  }
}

/** The same payment id for another call (another amount, or another request): refused, charges nothing. */
class ReuseCmd implements Cmd {
  constructor(readonly p: { i: number; otherAmount: boolean }) {}
  private candidates(w: World) {
    return retriable(w).filter(({ s, paymentId }) => s.charged.get(paymentId)?.via === 'charge');
  }
  check(w: Readonly<World>) {
    return this.candidates(w as World).length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const { s, paymentId } = pick(this.candidates(w), this.p.i);
    const paid = s.charged.get(paymentId)!;
    const amount = this.p.otherAmount ? (paid.amount < s.maxPerCall ? paid.amount + 1 : paid.amount - 1) : paid.amount;
    const body = {
      ...paid.body,
      amount: amount >= 1 ? amount : paid.amount,
      requestSha256: hash(`${paymentId}/other`),
    };
    const res = await post(w.t, w.auth, `/x402/sessions/${s.id}/charges`, body);
    // On an ended session a reuse may be answered as such or as the session's end (a Redis rolled back since may no
    // longer know the payment id; the close's statement is final either way): both refuse and charge nothing.
    const codes = s.closed ? ['X402_SESSION_PAYMENT_REUSED', closedCode(s.closed)] : ['X402_SESSION_PAYMENT_REUSED'];
    const answer = { status: res.statusCode, code: res.json().code as string };
    expect(
      answer.status === 409 && codes.includes(answer.code),
      `${this}: payment ${paymentId} (${paid.amount} to ${paid.payee}, seq ${paid.seq}) sent for another call on ${s.id}: ${res.body}`,
    ).toBe(true);
    await checkSession(w, s);
  }
  toString() {
    return `reuse(payment #${this.p.i}${this.p.otherAmount ? ', other amount' : ', other request'})`;
  }
}

/** A facilitator verify: holds the amount under a new payment id (in the session's currency, or tampered: JPY). */
class HoldCmd implements Cmd {
  constructor(readonly p: Target & { asset: 'USD' | 'JPY' }) {}
  check(w: Readonly<World>) {
    return w.sessions.length > 0 && (this.p.asset === 'USD' || !AVOID.has('asset'));
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const { s, payee, amount } = resolve(w, this.p);
    const paymentId = nextPaymentId(w);
    const body = facilitatorBody(w, s, paymentId, payee, amount, { asset: this.p.asset });
    const t0 = Date.now();
    const res = await facilitator(w, 'verify', body);
    const t1 = Date.now();
    expect(res.statusCode, res.body).toBe(200);
    const a = res.json();
    const label = `${this}: ${amount} to p${w.payees.indexOf(payee) + 1} on session #${w.sessions.indexOf(s)} ${s.id}`;
    if (this.p.asset !== 'USD') {
      // Contract 8a: a hold is bound to its asset; an asset other than the session's currency is refused at verify.
      expect(
        { isValid: a.isValid, reason: a.invalidReason },
        `${label}: a verify in JPY on a USD session: ${res.body}`,
      ).toEqual({ isValid: false, reason: 'asset_mismatch' });
      await checkSession(w, s);
      return;
    }
    check(label, asReasons(expectDebit(s, payee, amount, t0, t1)), a.isValid ? 200 : 409, a.invalidReason, res.body);
    if (a.isValid) {
      s.seqs++;
      s.mayCount += amount;
      s.holds.set(paymentId, { payee, amount: amount, seq: s.uncertain ? null : s.seqs });
    }
    await checkSession(w, s);
  }
  toString() {
    return `hold(${shownTarget(this.p)}${this.p.asset === 'USD' ? '' : ', asset JPY'})`;
  }
}

const allHolds = (w: World) =>
  w.sessions.flatMap((s) => [...s.holds.entries()].map(([paymentId, h]) => ({ s, paymentId, h })));

/**
 * A facilitator settle of a hold: captures `part` of what was held (0 allowed, more than held refused). May crash
 * after the capture, before its record.
 */
class CaptureCmd implements Cmd {
  constructor(readonly p: { i: number; part: number; over: boolean; crash: boolean }) {}
  check(w: Readonly<World>) {
    return allHolds(w as World).length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const { s, paymentId, h } = pick(allHolds(w), this.p.i);
    const amount = this.p.over ? h.amount + 1 : Math.round(this.p.part * h.amount);
    const label = `${this} (${paymentId}: ${h.amount} held for ${h.payee} on ${s.id})`;
    const body = facilitatorBody(w, s, paymentId, h.payee, h.amount, { amount });
    const t0 = Date.now();
    const { res, crash } = await crashable(this.p.crash ? 'x402.session.captured' : null, () =>
      facilitator(w, 'settle', body),
    );
    if (crash) {
      // Captured in Redis, not recorded: a debit like a charge's that crashed before its record.
      s.holds.delete(paymentId);
      s.lost.set(paymentId, { payee: h.payee, amount, via: 'capture', body });
      await sweep(w);
      await retry(w, s, paymentId, label);
      return checkSession(w, s);
    }
    const t1 = Date.now();
    const out = settleOutcome(res);
    let e: Expect;
    if (this.p.over) e = { ok: false, codes: new Set(['amount_exceeds_authorization']) };
    else if (s.closed) e = { ok: false, codes: new Set([reasonOf(closedCode(s.closed))]) };
    // Contract 11: a capture after its authorization's expiry (the session's, settleBy) is refused and moves nothing.
    else if (t0 >= s.expiresAt) e = { ok: false, codes: new Set(['session_expired']) };
    // A verified call can always be paid (what the hold is for), a rollback of Redis or not: a hold is state that bears
    // on money, and Redis is not its record (issue 38).
    else e = { ok: true, codes: new Set(t1 >= s.expiresAt ? ['session_expired'] : []) };
    check(label, e, out.status, out.code, res.body);
    if (out.status !== 201) return checkSession(w, s);
    const a = res.json();
    s.holds.delete(paymentId);
    if (s.uncertain) s.mayCount += amount;
    s.charged.set(paymentId, {
      payee: h.payee,
      amount,
      seq: a.extra.seq,
      receiptHash: a.extra.receiptHash,
      chargeId: a.transaction,
      via: 'capture',
      body,
    });
    noteReceipt(w, s, paymentId, a.transaction);
    expect(a.amount, label).toBe(String(amount));
    if (!s.uncertain)
      expect({ seq: a.extra.seq, remaining: a.extra.remaining }, label).toEqual({
        seq: h.seq,
        remaining: s.budget - used(s),
      });
    await checkSession(w, s);
  }
  toString() {
    const p = this.p;
    return `capture(hold #${p.i}, ${p.over ? 'held + 1' : `${Math.round(p.part * 100)}% of held`}${p.crash ? ', crash x402.session.captured + retry' : ''})`;
  }
}

/** A settle naming the session's other payee than the one its verify held for: refused, nothing moves (8a). */
class OtherPayeeSettleCmd implements Cmd {
  constructor(readonly i: number) {}
  private candidates(w: World) {
    return allHolds(w).filter(({ s }) => !s.closed && s.payees.length > 1);
  }
  check(w: Readonly<World>) {
    return !AVOID.has('payee') && this.candidates(w as World).length > 0;
  }
  async run(w: World) {
    bump('cmd settle-other-payee');
    const { s, paymentId, h } = pick(this.candidates(w), this.i);
    const other = s.payees.find((x) => x !== h.payee)!;
    const res = await facilitator(w, 'settle', facilitatorBody(w, s, paymentId, h.payee, h.amount, { payee: other }));
    const a = res.json();
    expect(
      { success: a.success, reason: a.errorReason },
      `${this}: ${paymentId} held ${h.amount} for p${w.payees.indexOf(h.payee) + 1} on ${s.id}, settled naming p${w.payees.indexOf(other) + 1}: ${res.body}`,
    ).toEqual({ success: false, reason: 'payee_mismatch' });
    await checkSession(w, s);
  }
  toString() {
    return `settleNamingOtherPayee(hold #${this.i})`;
  }
}

class CloseCmd implements Cmd {
  constructor(readonly p: { s: number; crash: number | null }) {}
  check(w: Readonly<World>) {
    return w.sessions.length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const s = pick(w.sessions, this.p.s);
    const send = () => post(w.t, w.auth, `/x402/sessions/${s.id}/close`, {});
    let { res, crash } = await crashable(this.p.crash === null ? null : pick(CLOSE_POINTS, this.p.crash), send);
    if (crash) {
      await sweep(w);
      res = await send();
    }
    expect(res.statusCode, `${this} on ${s.id}: ${res.body}`).toBe(200);
    closeInModel(w, s, 'closed');
    const view = res.json();
    expect(
      { status: view.status, spent: view.spent, refunded: view.refunded },
      `${this} on ${s.id}: the close pays every receipt and returns the rest: ${res.body}`,
    ).toEqual({ status: s.closed, spent: chargedTotal(s), refunded: s.budget - chargedTotal(s) });
    await checkSession(w, s);
  }
  toString() {
    return `close(session #${this.p.s}${this.p.crash === null ? '' : `, crash ${pick(CLOSE_POINTS, this.p.crash)} + retry`})`;
  }
}

/** A short session reaches its expiry and the sweeper closes it. */
class ExpireCmd implements Cmd {
  constructor(readonly i: number) {}
  private candidates(w: World) {
    return w.sessions.filter((s) => s.short && !s.closed);
  }
  check(w: Readonly<World>) {
    return this.candidates(w as World).length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const s = pick(this.candidates(w), this.i);
    const wait = s.expiresAt + 20 - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    await sweep(w);
    expect(s.closed, `${this}: ${s.id} expired`).toBe('expired');
    await checkSession(w, s);
  }
  toString() {
    return `expire(short open session #${this.i})`;
  }
}

/** What a replica holds now: DUMP of the session's two keys (a key that does not exist is kept as absent). */
class SnapshotCmd implements Cmd {
  constructor(readonly i: number) {}
  check(w: Readonly<World>) {
    return !NO_ROLLBACK && w.sessions.length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const open = openSessions(w);
    const s = pick(open.length > 0 ? open : w.sessions, this.i);
    const [budget, payments] = budgetKeys(w, s);
    s.snapshot = {
      budget: await w.t.runtime.redis.dumpBuffer(budget),
      payments: await w.t.runtime.redis.dumpBuffer(payments),
    };
  }
  toString() {
    return `snapshot(open session #${this.i})`;
  }
}

/** The failover: the session's two keys go back to the snapshot (RESTORE ... REPLACE, or gone if absent then). */
class RollbackCmd implements Cmd {
  constructor(readonly i: number) {}
  private candidates(w: World) {
    return w.sessions.filter((s) => s.snapshot);
  }
  check(w: Readonly<World>) {
    return !NO_ROLLBACK && this.candidates(w as World).length > 0;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    const s = pick(this.candidates(w), this.i);
    const keys = budgetKeys(w, s);
    const dumps = [s.snapshot!.budget, s.snapshot!.payments];
    for (let k = 0; k < 2; k++) {
      if (dumps[k]) await w.t.runtime.redis.restore(keys[k]!, 0, dumps[k]!, 'REPLACE');
      else await w.t.runtime.redis.del(keys[k]!);
    }
    s.uncertain = true;
    await checkSession(w, s);
  }
  toString() {
    return `rollback(snapshotted session #${this.i})`;
  }
}

class SweepCmd implements Cmd {
  check() {
    return true;
  }
  async run(w: World) {
    bump(`cmd ${this.toString().split('(')[0]}`);
    await sweep(w);
  }
  toString() {
    return 'sweep()';
  }
}

const openCmd = fc
  .record({
    sponsor: fc.boolean(),
    payees: fc.integer({ min: 0, max: 2 }),
    budget: fc.integer({ min: 4, max: 60 }),
    maxPerCall: fc.integer({ min: 2, max: 10 }),
    short: rarely(5),
    crash: rarelyOr(6, fc.nat({ max: 1 })),
  })
  .map((p) => new OpenCmd(p));
const commands = [
  openCmd,
  openCmd,
  ...Array.from({ length: 5 }, () =>
    fc
      .record({ t: targetArb, crash: rarelyOr(5, fc.record({ point: fc.nat({ max: 1 }), retry: fc.boolean() })) })
      .map(({ t, crash }) => new ChargeCmd({ ...t, crash })),
  ),
  fc.nat({ max: 20 }).map((i) => new RetryCmd(i)),
  fc.record({ i: fc.nat({ max: 20 }), otherAmount: fc.boolean() }).map((p) => new ReuseCmd(p)),
  ...Array.from({ length: 2 }, () =>
    fc
      .record({ t: targetArb, asset: fc.constantFrom<'USD' | 'JPY'>('USD', 'USD', 'USD', 'USD', 'USD', 'JPY') })
      .map(({ t, asset }) => new HoldCmd({ ...t, asset })),
  ),
  ...Array.from({ length: 3 }, () =>
    fc
      .record({ i: fc.nat({ max: 10 }), part: fc.constantFrom(0, 0.5, 1, 1), over: rarely(8), crash: rarely(6) })
      .map((p) => new CaptureCmd(p)),
  ),
  fc.record({ s: session, crash: rarelyOr(3, fc.nat({ max: 4 })) }).map((p) => new CloseCmd(p)),
  fc.nat({ max: 3 }).map((i) => new ExpireCmd(i)),
  fc.nat({ max: 10 }).map((i) => new OtherPayeeSettleCmd(i)),
  fc.constant(new SweepCmd()),
  ...Array.from({ length: 2 }, () => fc.nat({ max: 7 }).map((i) => new SnapshotCmd(i))),
  ...Array.from({ length: 3 }, () => fc.nat({ max: 7 }).map((i) => new RollbackCmd(i))),
];

describe('payment sessions against a reference model (fast-check)', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let tenantId: string;
  let processors: ProcessorMap;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['settle'],
      overrides: { RATE_LIMIT_MAX: '1000000', SWEEP_STALE_AFTER_MS: '0', SWEEP_INTERVAL_MS: '3600000' },
    });
    ({ auth, tenantId } = await t.tenantWithKey([...X402_SCOPES]));
    processors = createProcessors(t.runtime);
  });
  afterAll(() => t?.close());
  afterEach(() => disarmFailpoints());

  async function newWorld(policy: { perCallLimit: number; dailyLimit: number; allowedBoth: boolean }): Promise<World> {
    const agents = await Promise.all(Array.from({ length: 4 }, () => registerAgent(t, auth)));
    const [payer, p1, p2, p3] = agents.map((a) => a.agentId) as [string, string, string, string];
    await credit(t, payer, PAYER_FUNDS);
    // Funded for its whole daily limit: a sponsored open is refused by the policy, never for funds.
    const sponsor = await sponsorWallet(t, tenantId, policy.dailyLimit);
    const allowed = policy.allowedBoth ? [p1, p2] : [p1];
    const res = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${sponsor}/policy`,
      headers: auth,
      payload: {
        currency: 'USD',
        perCallLimit: policy.perCallLimit,
        dailyLimit: policy.dailyLimit,
        allowedPayeeAgentIds: allowed,
      },
    });
    expect(res.statusCode, res.body).toBe(200);
    const wallets = new Map([
      [payer, { available: PAYER_FUNDS, escrow: 0 }],
      [sponsor, { available: policy.dailyLimit, escrow: 0 }],
      ...[p1, p2, p3].map((p) => [p, { available: 0, escrow: 0 }] as const),
    ]);
    return {
      t,
      auth,
      processors,
      payer,
      payees: [p1, p2, p3],
      sponsor,
      policy: { perCallLimit: policy.perCallLimit, dailyLimit: policy.dailyLimit, allowed },
      sponsorToday: 0,
      sessions: [],
      wallets,
      chargeIds: new Map(),
      counter: 0,
    };
  }

  /** Every session closed and settled: statements, balances and the audit agree with the model. */
  async function finish(w: World) {
    for (const s of w.sessions) if (!s.closed) await new CloseCmd({ s: w.sessions.indexOf(s), crash: null }).run(w);
    await sweep(w);
    for (const s of w.sessions) {
      const res = await get(t, auth, `/x402/sessions/${s.id}/statement`);
      expect(res.statusCode, res.body).toBe(200);
      const { body, charges } = res.json() as {
        body: { totalCharged: number; refunded: number; chargeCount: number };
        charges: Array<{ seq: number; paymentId: string; payeeAgentId: string; amount: number; receiptHash: string }>;
      };
      const listed = charges
        .map((c) => ({ paymentId: c.paymentId, payee: c.payeeAgentId, amount: c.amount }))
        .sort((a, b) => a.paymentId.localeCompare(b.paymentId));
      const model = [...s.charged.entries()]
        .map(([paymentId, c]) => ({ paymentId, payee: c.payee, amount: c.amount }))
        .sort((a, b) => a.paymentId.localeCompare(b.paymentId));
      expect(listed, `${s.id}: the statement lists every receipted charge once, nothing else`).toEqual(model);
      expect({ totalCharged: body.totalCharged, refunded: body.refunded }, `${s.id} statement`).toEqual({
        totalCharged: chargedTotal(s),
        refunded: s.budget - chargedTotal(s),
      });
      for (const c of charges) {
        const paid = s.charged.get(c.paymentId);
        if (paid?.receiptHash)
          expect({ seq: c.seq, receiptHash: c.receiptHash }, `${s.id}: ${c.paymentId} as receipted`).toEqual({
            seq: paid.seq,
            receiptHash: paid.receiptHash,
          });
      }
    }
    for (const [walletId, b] of w.wallets) {
      const res = await t.app.inject({
        method: 'GET',
        url: `/v1/wallets/${encodeURIComponent(walletId)}`,
        headers: auth,
      });
      const real =
        res.statusCode === 404 ? { available: 0, escrow: 0 } : (res.json().balances.USD ?? { available: 0, escrow: 0 });
      expect(
        real,
        `wallet ${walletId === w.payer ? 'payer' : walletId === w.sponsor ? 'sponsor' : `payee p${w.payees.indexOf(walletId) + 1}`}`,
      ).toEqual(b);
    }
    const audit = Date.now();
    await expectCleanAudit(t);
    if (process.env.SESSIONS_MODEL_TIMING) console.log(`audit ${Date.now() - audit} ms`);
  }

  it(`any sequence of opens, charges, retries, holds, captures, closes, expiries, crashes and Redis rollbacks ends with the model and the service agreeing (${RUNS} runs)`, async () => {
    const started = Date.now();
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          perCallLimit: fc.integer({ min: 4, max: 10 }),
          dailyLimit: fc.integer({ min: 30, max: 120 }),
          allowedBoth: fc.boolean(),
        }),
        // The sessions the run starts with (more may open among the commands).
        fc.array(openCmd, { minLength: 1, maxLength: 2 }),
        fc.commands(commands, { maxCommands: MAX_COMMANDS, size: 'max' }),
        async (policy, opens, cmds) => {
          const a = Date.now();
          const w = await newWorld(policy);
          try {
            for (const open of opens) await open.run(w);
            const b = Date.now();
            await fc.asyncModelRun(() => ({ model: w, real: w }), cmds);
            const c = Date.now();
            await finish(w);
            if (process.env.SESSIONS_MODEL_TIMING)
              console.log(`${cmds}\nworld ${b - a} ms, commands ${c - b} ms, finish ${Date.now() - c} ms`);
          } finally {
            disarmFailpoints();
            // Leave nothing open for the next run (a failed run's sessions would otherwise stay open).
            for (const s of w.sessions) await post(t, auth, `/x402/sessions/${s.id}/close`, {}).catch(() => undefined);
          }
        },
      ),
      {
        numRuns: RUNS,
        ...(SEED === undefined ? {} : { seed: SEED }),
        ...(PATH ? { path: PATH } : {}),
        endOnFailure: process.env.SESSIONS_MODEL_NO_SHRINK === '1',
        // Passing runs take well under a minute; this bounds the shrinking of a failure (reported as shrunk so far).
        interruptAfterTimeLimit: 240_000,
        markInterruptAsFailure: true,
      },
    );
    console.log(
      `sessions model: ${RUNS} runs in ${((Date.now() - started) / 1000).toFixed(1)} s; ${[...stats]
        .sort()
        .map(([k, n]) => `${k}: ${n}`)
        .join(', ')}`,
    );
  }, 900_000);
});
