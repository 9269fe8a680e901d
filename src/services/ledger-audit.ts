import { Gauge } from 'prom-client';
import { errors } from '../domain/errors.ts';
import { deriveSettlement, entryIds, type SettlementFacts } from '../domain/settlement.ts';
import { statementLastSeq } from '../domain/x402-sessions.ts';
import { processMetrics } from '../metrics.ts';
import type { Runtime } from '../runtime.ts';
import { accountOf, attemptId, type Bucket, type LedgerEntryDoc, type PostingDoc } from '../store/ledger.ts';
import type { AuditAccountDoc, AuditEntryDoc, AuditReserveDoc } from '../store/ledger-audit.ts';
import { candidateEntries, settlementIdFor, termsOf, type SettlementDoc } from '../store/settlements.ts';
import { escrowEntryIds } from './escrow.ts';
import { gateSettlementId, x402EntryIds } from './x402/service.ts';
import { sessionEntryIds, sessionOfEntry, sessionOfSettlement } from './x402/sessions.ts';

// The money invariant audit (contract section 11), per currency: credits equal the sum of balances (no payouts
// exist; every other entry's legs sum to zero), each escrow account equals the sum of its owners' open reserves and
// none is negative, no open reserve belongs to a missing, cancelled or finished owner or outlives its deadline by more
// than a sweep, no ledger entry or settlement is stuck.
//
// Incremental: each pass walks every account's chain by exact `_id` from its checkpoint to its end (or until the
// pass's time budget runs out: a large backlog is read over several passes), folds each posting into the reserve it
// belongs to and into the entries still seen in part, then writes the reserves and entries it touched before the
// account's checkpoint (see store/ledger-audit.ts for why a crash anywhere leaves it right). Its cost follows what
// was posted since the last pass plus the wallets and open reserves, never the runs stored.

export interface AuditViolation {
  kind: string;
  currency?: string;
  walletId?: string;
  owner?: string;
  detail: string;
  amount?: number;
}

export interface CurrencyTotals {
  credits: number;
  available: number;
  escrow: number;
  openReserves: number;
}

export interface LedgerAuditReport {
  /** No violation, and every account was read to its end. */
  clean: boolean;
  /** Every account was read to its end within the time budget (else the next pass goes on from where this stopped). */
  complete: boolean;
  violations: AuditViolation[];
  currencies: Record<string, CurrencyTotals>;
  checked: {
    wallets: number;
    accounts: number;
    accountsBehind: number;
    postingsRead: number;
    openReserves: number;
    inFlightEntries: number;
  };
  incremental: boolean;
  tookMs: number;
  at: string;
}

export interface AuditOptions {
  /** Ignore the checkpoints: recompute from the first position, write nothing, and compare with the checkpoints. */
  full?: boolean;
  /** Stop walking chains after this long (the pass still checks what it has read). */
  budgetMs?: number;
  /** How long to wait for another process's audit to finish before answering 409. */
  waitMs?: number;
}

const DEFAULT_BUDGET_MS = 20_000;
const LOCK_TTL_MS = 60_000;
const LOCK_RENEW_MS = 15_000;
const ACCOUNT_CONCURRENCY = 8;
const READ_CONCURRENCY = 16;
/** Positions read at once on one chain: starts at 1 (the usual pass finds 0 or a few new), doubles while full. */
const MAX_CHAIN_BATCH = 128;
const MAX_VIOLATIONS = 500;
const MAX_STARTED_ENTRIES = 10_000;
const MAX_STUCK_SETTLEMENTS = 1_000;
/** A settlement's due record this late means its sweeper cannot move it. */
const SETTLEMENT_STUCK_AFTER_MS = 3_600_000;
/** A gate reserve nothing captured is overdue a day after its TTL (its sweeper returns it at the TTL). */
const GATE_DEADLINE_SLACK_MS = 86_400_000;
/** How often, at most, the periodic audit runs (all processes together). Wanted as config: LEDGER_AUDIT_INTERVAL_MS. */
export const AUDIT_EVERY_MS = 10 * 60_000;

const SETTLEMENT_KINDS = new Set([
  'settlement_release',
  'holdback_release',
  'dispute_refund',
  'dispute_release',
  'held_release',
  'held_refund',
]);
const LOCK_KINDS = new Set(['escrow_lock', 'x402_escrow_lock', 'x402_session_lock']);

const violationsGauge = new Gauge({
  name: 'ledger_audit_violations',
  help: 'Violations the last ledger audit of this process found, by kind',
  labelNames: ['kind'] as const,
  registers: [processMetrics],
});
const lastRunGauge = new Gauge({
  name: 'ledger_audit_last_run_timestamp_seconds',
  help: 'When this process last finished a ledger audit',
  registers: [processMetrics],
});
const completeGauge = new Gauge({
  name: 'ledger_audit_complete',
  help: '1 when the last ledger audit read every account to its end',
  registers: [processMetrics],
});
const durationGauge = new Gauge({
  name: 'ledger_audit_duration_seconds',
  help: 'How long the last ledger audit took',
  registers: [processMetrics],
});
const postingsGauge = new Gauge({
  name: 'ledger_audit_postings_read',
  help: 'Postings the last ledger audit read',
  registers: [processMetrics],
});

type Subject = NonNullable<AuditReserveDoc['subject']>;

/**
 * The reserve an escrow posting belongs to: its owner's settlement id (the one key shared by lock, moves and unlock),
 * or for a payment session the session id (its budget is one reserve, paid out through a settlement per payee).
 */
async function ownerOf(runtime: Runtime, p: PostingDoc): Promise<{ owner: string; subject: Subject | null } | null> {
  const found = await settlementOwnerOf(runtime, p);
  const sessionId = found && found.subject === null ? sessionOfSettlement(found.owner) : null;
  return sessionId ? { owner: sessionId, subject: { kind: 'session', id: sessionId } } : found;
}

async function settlementOwnerOf(
  runtime: Runtime,
  p: PostingDoc,
): Promise<{ owner: string; subject: Subject | null } | null> {
  if (p.kind === 'x402_session_lock' || p.kind === 'x402_session_refund') {
    const sessionId = sessionOfEntry(p.entryId);
    return sessionId ? { owner: sessionId, subject: { kind: 'session', id: sessionId } } : null;
  }
  if (p.kind === 'escrow_lock' || p.kind === 'escrow_unlock') {
    const m = /^escrow:([^:]+):(lock|unlock)(?::(\d+))?$/.exec(p.entryId);
    if (m && escrowEntryIds[m[2] as 'lock' | 'unlock'](m[1]!, m[3] ? Number(m[3]) : 1) === p.entryId)
      return { owner: settlementIdFor(m[1]!), subject: { kind: 'run', id: m[1]! } };
    return null;
  }
  if (p.kind === 'x402_escrow_lock' || p.kind === 'x402_escrow_unlock') {
    const m = /^x402:(.+):(lock|unlock)$/.exec(p.entryId);
    if (m && x402EntryIds[m[2] as 'lock' | 'unlock'](m[1]!) === p.entryId)
      return { owner: gateSettlementId(m[1]!), subject: { kind: 'gate', id: m[1]! } };
    return null;
  }
  if (!SETTLEMENT_KINDS.has(p.kind)) return null;
  // A settlement's own steps name it in their id; checked against the ids it would make, else read from the entry.
  const m = /^settle:([^:]+):/.exec(p.entryId);
  if (
    m &&
    [
      entryIds.release(m[1]!),
      entryIds.holdback(m[1]!),
      entryIds.held(m[1]!, 'release'),
      entryIds.held(m[1]!, 'refund'),
    ].includes(p.entryId)
  )
    return { owner: m[1]!, subject: null };
  const entry = await runtime.stores.ledgerAudit.entryAttempt(attemptId(p.entryId, p.attempt));
  return entry?.ref.settlementId ? { owner: entry.ref.settlementId, subject: null } : null;
}

/** What is wrong with this posting as the next position of the chain, if anything. */
function chainProblem(p: PostingDoc, account: string, seq: number, balance: number): string | null {
  if (p.account !== account || p.seq !== seq + 1)
    return `position ${seq + 1} of ${account} holds ${p.account}#${p.seq}`;
  if (!Number.isSafeInteger(p.delta) || !Number.isSafeInteger(p.balanceAfter))
    return `${p._id}: amounts are not safe integers`;
  if (p.refused ? p.delta !== 0 || p.balanceAfter !== balance : p.balanceAfter !== balance + p.delta)
    return `${p._id}: balance ${balance} + ${p.delta} is not ${p.balanceAfter}`;
  if (p.balanceAfter < 0) return `${p._id}: balance ${p.balanceAfter} is negative`;
  return null;
}

function isComplete(e: AuditEntryDoc): boolean {
  return (
    e.duplicates.length === 0 && e.legs.some((l) => l.leg === 0) && e.legs.reduce((sum, l) => sum + l.delta, 0) === 0
  );
}

/** Runs `work` on every item, `limit` at a time; on a failure takes no more and throws once all running ones ended. */
async function eachLimited<T>(items: T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failure: { err: unknown } | null = null;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (!failure && next < items.length) {
        try {
          await work(items[next++]!);
        } catch (err) {
          failure ??= { err };
        }
      }
    }),
  );
  if (failure) throw (failure as { err: unknown }).err;
}

/** One audit pass. Throws 409 AUDIT_IN_PROGRESS when another process's audit holds the lock past `waitMs`. */
export async function auditLedger(runtime: Runtime, options: AuditOptions = {}): Promise<LedgerAuditReport> {
  const store = runtime.stores.ledgerAudit;
  const waitUntil = Date.now() + (options.waitMs ?? 0);
  let token = await store.lock(LOCK_TTL_MS);
  while (!token && Date.now() < waitUntil) {
    await new Promise((r) => setTimeout(r, 100));
    token = await store.lock(LOCK_TTL_MS);
  }
  // Two passes at once would both fold the same postings into the reserves: refuse instead of answering an older
  // report, which would say "clean" about money moved since.
  if (!token)
    throw errors.conflict('AUDIT_IN_PROGRESS', 'another ledger audit is running; retry shortly', {
      retryAfterSeconds: 5,
    });
  let lost = false;
  const renewal = setInterval(() => {
    store.renew(token, LOCK_TTL_MS).then(
      (held) => {
        if (!held) lost = true;
      },
      () => undefined,
    );
  }, LOCK_RENEW_MS);
  try {
    const report = await runPass(runtime, options, () => lost);
    recordMetrics(report);
    return report;
  } finally {
    clearInterval(renewal);
    await store.unlock(token).catch(() => undefined);
  }
}

async function runPass(runtime: Runtime, options: AuditOptions, lockLost: () => boolean): Promise<LedgerAuditReport> {
  const pass = new AuditPass(runtime, options, lockLost);
  await pass.load();
  await pass.walkAccounts();
  await pass.rebuildEntries();
  await pass.forgetClosed();
  const totals = pass.checkTotals(); // (a) and (b)
  await pass.checkEntries(); // (d) entries
  const open = await pass.checkReserves(); // (c) and (d) reserves
  await pass.checkStuckSettlements(); // (e)
  await pass.checkSessions(open); // (f)
  return pass.report(totals);
}

type Totals = Map<
  string,
  { credits: bigint; available: bigint; escrow: bigint; openReserves: bigint; inFlight: bigint }
>;
type Account = { walletId: string; currency: string; bucket: Bucket };

/** One audit pass, its sections in the order runPass calls them; its state is what they share. */
class AuditPass {
  private readonly store: Runtime['stores']['ledgerAudit'];
  private readonly full: boolean;
  private readonly startedAt = Date.now();
  private readonly deadline: number;
  private readonly sweepMs: number;
  private readonly violations: AuditViolation[] = [];
  private storedCheckpoints = new Map<string, AuditAccountDoc>();
  private checkpoints = new Map<string, AuditAccountDoc>();
  private reserves = new Map<string, AuditReserveDoc>();
  private entries = new Map<string, AuditEntryDoc>();
  /** What is stored: only these need a write when they close (the others never left memory). */
  private storedReserves = new Set<string>();
  private storedEntries = new Set<string>();
  private walletIds: string[] = [];
  private readonly accounts: Account[] = [];
  private postingsRead = 0;
  private readonly caughtUp = new Set<string>();
  /** Sessions whose reserve moved in this pass: each is checked against its recorded charges (section f). */
  private readonly sessionsMoved = new Set<string>();
  private startedEntries: Awaited<ReturnType<Runtime['stores']['ledgerAudit']['startedEntries']>> = [];
  private readonly startedAttempts = new Map<string, LedgerEntryDoc | null>();
  private inFlightEntries = 0;
  /** When the checks began (after the walk): what counts as overdue is measured from it. */
  private now = 0;

  constructor(
    private readonly runtime: Runtime,
    options: AuditOptions,
    private readonly lockLost: () => boolean,
  ) {
    this.store = runtime.stores.ledgerAudit;
    this.full = options.full === true;
    this.deadline = this.startedAt + (options.budgetMs ?? DEFAULT_BUDGET_MS);
    this.sweepMs = runtime.config.sweeper.staleAfterMs + runtime.config.sweeper.intervalMs;
  }

  private add(v: AuditViolation): void {
    if (this.violations.length < MAX_VIOLATIONS) this.violations.push(v);
  }

  private get complete(): boolean {
    return this.caughtUp.size === this.accounts.length;
  }

  /** The stored checkpoints, reserves and entries (none for a full pass), and every wallet's accounts: both buckets. */
  async load(): Promise<void> {
    const { store, full } = this;
    const stored = await store.loadState();
    this.storedCheckpoints = new Map(stored.accounts.map((a) => [a._id, a]));
    this.checkpoints = new Map(full ? [] : this.storedCheckpoints);
    this.reserves = new Map(full ? [] : stored.reserves.map((r) => [r._id, r]));
    this.entries = new Map(full ? [] : stored.entries.map((e) => [e._id, e]));
    this.storedReserves = new Set(this.reserves.keys());
    this.storedEntries = new Set(this.entries.keys());
    this.walletIds = await store.walletIds();
    await eachLimited(this.walletIds, READ_CONCURRENCY, async (walletId) => {
      for (const currency of await store.currenciesOf(walletId))
        this.accounts.push({ walletId, currency, bucket: 'available' }, { walletId, currency, bucket: 'escrow' });
    });
  }

  async walkAccounts(): Promise<void> {
    await eachLimited(this.accounts, ACCOUNT_CONCURRENCY, (a) => this.walkAccount(a));
  }

  /** Folds a posting into the entry it is a leg of and, in escrow, into the reserve it belongs to. */
  private async fold(
    p: PostingDoc,
    account: Account & { id: string },
    credits: { value: number },
    touched: Set<AuditReserveDoc>,
  ): Promise<void> {
    const { entries, reserves } = this;
    if (p.refused) return; // a refused debit moved nothing
    if (p.kind === 'credit') credits.value += p.delta;
    else {
      const id = attemptId(p.entryId, p.attempt);
      let e = entries.get(id);
      if (!e)
        entries.set(
          id,
          (e = { _id: id, entryId: p.entryId, currency: p.currency, legs: [], duplicates: [], firstAt: p.at }),
        );
      const same = e.legs.find((l) => l.leg === p.leg);
      if (!same) e.legs.push({ leg: p.leg, delta: p.delta, account: account.id, seq: p.seq, posting: p._id });
      else if (same.posting !== p._id && !e.duplicates.includes(p._id)) e.duplicates.push(p._id);
      if (isComplete(e) && !this.storedEntries.has(id)) entries.delete(id); // memory stays at the entries in flight
    }
    if (account.bucket !== 'escrow') return;
    const { currency, walletId } = account;
    const owner = await ownerOf(this.runtime, p);
    if (!owner) {
      this.add({
        kind: 'escrow_unattributed',
        currency,
        walletId,
        detail: `${p._id} (${p.kind}, entry ${p.entryId}) belongs to no reserve`,
        amount: p.delta,
      });
      return;
    }
    const id = `${owner.owner}@${account.id}`;
    let r = reserves.get(id);
    if (!r)
      reserves.set(
        id,
        (r = {
          _id: id,
          owner: owner.owner,
          subject: owner.subject,
          account: account.id,
          walletId,
          currency,
          amount: 0,
          throughSeq: 0,
          openedAt: p.at,
          lockedAt: null,
          negative: null,
        }),
      );
    if (p.seq <= r.throughSeq) return; // folded in before a crash
    r.amount += p.delta;
    r.throughSeq = p.seq;
    r.subject ??= owner.subject;
    if (r.subject?.kind === 'session') this.sessionsMoved.add(r.subject.id);
    if (LOCK_KINDS.has(p.kind) && p.delta > 0) r.lockedAt = p.at;
    if (r.amount < 0 && !r.negative) r.negative = { seq: p.seq, amount: r.amount };
    touched.add(r);
  }

  /** Walks one account's chain from its checkpoint to its end (or the time budget), then writes its checkpoint. */
  private async walkAccount({ walletId, currency, bucket }: Account): Promise<void> {
    const { store, full } = this;
    const account = accountOf(walletId, currency, bucket);
    const from = this.checkpoints.get(account);
    let seq = from?.seq ?? 0;
    let balance = from?.balance ?? 0;
    const credits = { value: from?.credits ?? 0 };
    const compareAt = full ? this.storedCheckpoints.get(account) : undefined;
    const touched = new Set<AuditReserveDoc>();
    const where = { id: account, walletId, currency, bucket };

    let batch = 1;
    walk: for (;;) {
      if (Date.now() > this.deadline) break;
      if (this.lockLost()) throw new Error('ledger audit lost its lock');
      const docs = await store.postingsAt(account, seq + 1, batch);
      for (const [i, p] of docs.entries()) {
        if (!p) {
          if (docs.slice(i + 1).some((d) => d !== null))
            this.add({
              kind: 'chain_broken',
              currency,
              walletId,
              detail: `${account} has a gap at position ${seq + 1}`,
            });
          this.caughtUp.add(account);
          break walk;
        }
        this.postingsRead++;
        const problem = chainProblem(p, account, seq, balance);
        if (problem) {
          this.add({ kind: 'chain_broken', currency, walletId, detail: problem });
          this.caughtUp.add(account); // nothing past a broken position is trusted; every pass reports it again
          break walk;
        }
        await this.fold(p, where, credits, touched);
        seq = p.seq;
        balance = p.balanceAfter;
        if (
          compareAt &&
          compareAt.seq === seq &&
          (compareAt.balance !== balance || compareAt.credits !== credits.value)
        ) {
          this.add({
            kind: 'checkpoint_mismatch',
            currency,
            walletId,
            detail: `${account} at ${seq}: checkpoint says balance ${compareAt.balance} credits ${compareAt.credits}, the chain ${balance} and ${credits.value}`,
          });
        }
      }
      batch = Math.min(batch * 2, MAX_CHAIN_BATCH);
    }
    const checkpoint: AuditAccountDoc = {
      _id: account,
      walletId,
      currency,
      bucket,
      seq,
      balance,
      credits: credits.value,
      at: new Date(),
    };
    this.checkpoints.set(account, checkpoint);
    if (full || (from && from.seq === seq)) return;
    // The reserves the checkpoint covers are written first: a crash before it replays postings they skip. A reserve
    // opened and closed within this walk never needs a write (a replay meets all of its postings again).
    const changed = [...touched].filter((r) => this.storedReserves.has(r._id) || r.amount !== 0 || r.negative);
    await store.saveReserves(changed);
    for (const r of changed) this.storedReserves.add(r._id);
    await store.saveAccount(checkpoint);
  }

  /**
   * Entries seen in part are a cache: rebuilt from the ledger for those in question, the ones still incomplete and
   * the ledger's started ones (a pass that died after an account's checkpoint and before saving them forgot legs).
   */
  async rebuildEntries(): Promise<void> {
    const { runtime, entries } = this;
    this.startedEntries = await this.store.startedEntries(MAX_STARTED_ENTRIES);
    await eachLimited([...new Set(this.startedEntries.map((e) => e.entryId))], READ_CONCURRENCY, async (entryId) => {
      this.startedAttempts.set(entryId, await runtime.stores.ledger.getEntry(entryId));
    });
    await recoverEntryLegs(runtime, entries, this.checkpoints, [...this.startedAttempts.values()]);
    for (const e of entries.values()) if (isComplete(e) && !this.storedEntries.has(e._id)) entries.delete(e._id);
  }

  /** Closed reserves go once their account's checkpoint is past them (no replay can meet their postings again). */
  async forgetClosed(): Promise<void> {
    const { store, reserves, entries, checkpoints } = this;
    if (!this.full) {
      const passed = (account: string, seq: number) => (checkpoints.get(account)?.seq ?? 0) >= seq;
      const closed = [...reserves.values()].filter(
        (r) => r.amount === 0 && !r.negative && passed(r.account, r.throughSeq) && this.storedReserves.has(r._id),
      );
      const completed = [...entries.values()].filter((e) => isComplete(e));
      await store.saveEntries([...entries.values()].filter((e) => !isComplete(e)));
      await Promise.all([
        store.deleteReserves(closed.map((r) => r._id)),
        store.deleteEntries(completed.map((e) => e._id)),
      ]);
      for (const r of closed) reserves.delete(r._id);
      for (const e of completed) entries.delete(e._id);
    }
    for (const r of reserves.values()) if (r.amount === 0 && !r.negative) reserves.delete(r._id);
  }

  /** (a) and (b): per currency and per escrow account, from the checkpoints, reserves and partly seen entries. */
  checkTotals(): Totals {
    const totals: Totals = new Map();
    const totalsOf = (currency: string) => {
      let t = totals.get(currency);
      if (!t) totals.set(currency, (t = { credits: 0n, available: 0n, escrow: 0n, openReserves: 0n, inFlight: 0n }));
      return t;
    };
    const reservedIn = new Map<string, bigint>();
    for (const r of this.reserves.values()) {
      reservedIn.set(r.account, (reservedIn.get(r.account) ?? 0n) + BigInt(r.amount));
      totalsOf(r.currency).openReserves += BigInt(r.amount);
      if (r.negative || r.amount < 0) {
        this.add({
          kind: 'reserve_negative',
          currency: r.currency,
          walletId: r.walletId,
          owner: r.owner,
          detail: `reserve of ${r.owner} in ${r.account} went to ${r.negative?.amount ?? r.amount} at position ${r.negative?.seq ?? r.throughSeq}: paid out more than was locked for it`,
          amount: r.negative?.amount ?? r.amount,
        });
      }
    }
    for (const a of this.checkpoints.values()) {
      const t = totalsOf(a.currency);
      t.credits += BigInt(a.credits);
      t[a.bucket] += BigInt(a.balance);
      // Checked where the walk reached the chain's end (a reserve replayed after a crash may run ahead of a
      // checkpoint the time budget stopped short).
      if (a.bucket === 'escrow' && this.caughtUp.has(a._id)) {
        const reserved = reservedIn.get(a._id) ?? 0n;
        if (reserved !== BigInt(a.balance))
          this.add({
            kind: 'escrow_mismatch',
            currency: a.currency,
            walletId: a.walletId,
            detail: `${a._id} holds ${a.balance} at position ${a.seq}, its open reserves ${reserved}`,
            amount: Number(BigInt(a.balance) - reserved),
          });
      }
    }
    for (const e of this.partialEntries())
      totalsOf(e.currency).inFlight += BigInt(e.legs.reduce((sum, l) => sum + l.delta, 0));
    for (const [currency, t] of totals) {
      const off = t.available + t.escrow - t.credits - t.inFlight;
      if (off !== 0n)
        this.add({
          kind: 'sum_mismatch',
          currency,
          detail: `balances ${t.available + t.escrow} != credits ${t.credits} + legs in flight ${t.inFlight}`,
          amount: Number(off),
        });
    }
    return totals;
  }

  private partialEntries(): AuditEntryDoc[] {
    return [...this.entries.values()].filter((e) => !isComplete(e));
  }

  /**
   * (d) entries: the ledger's started entries and the ones seen in part, overdue once older than a sweep. A started
   * marker is the ledger's note that an apply() began; what counts is its entry's latest attempt. Applied or refused,
   * it is finished (another apply() finished it after this one died; the sweeper drops the marker when it next
   * looks). Not recorded at all, nothing moved: that apply() died before it recorded anything, or is about to.
   */
  async checkEntries(): Promise<void> {
    this.now = Date.now();
    const { now, sweepMs } = this;
    const overdueEntries = new Set<string>();
    for (const started of this.startedEntries) {
      const state = this.startedAttempts.get(started.entryId)?.state;
      if (state === 'applied' || state === 'rejected') continue;
      if (started.startedAt >= now - sweepMs) this.inFlightEntries++;
      else if (state === undefined) continue;
      else if (!overdueEntries.has(started.entryId)) {
        overdueEntries.add(started.entryId);
        this.add({
          kind: 'entry_overdue',
          detail: `ledger entry ${started.entryId} started ${new Date(started.startedAt).toISOString()} and is not finished`,
        });
      }
    }
    await eachLimited(this.partialEntries(), READ_CONCURRENCY, async (e) => {
      if (e.duplicates.length > 0) {
        this.add({
          kind: 'leg_posted_twice',
          currency: e.currency,
          detail: `entry ${e._id}: a leg is posted again at ${e.duplicates.join(', ')}`,
        });
        return;
      }
      if (e.firstAt.getTime() >= now - sweepMs || overdueEntries.has(e.entryId)) return;
      const attempt = await this.store.entryAttempt(e._id);
      if (attempt?.state === 'pending') {
        overdueEntries.add(e.entryId);
        this.add({
          kind: 'entry_overdue',
          currency: e.currency,
          detail: `ledger entry ${e._id} has legs ${e.legs.map((l) => l.leg).join(',')} posted since ${e.firstAt.toISOString()} and is not finished`,
        });
      } else if (this.complete) {
        // Every account was read to its end, so what was not seen was never posted.
        this.add({
          kind: 'entry_unbalanced',
          currency: e.currency,
          detail: `ledger entry ${e._id} (${attempt?.state ?? 'not recorded'}) has legs ${e.legs.map((l) => `${l.leg}:${l.delta}`).join(' ')} posted, which do not balance`,
        });
      }
    });
  }

  /** (c) and (d) reserves: each open reserve whose account was read to its end, against its owner's facts. */
  async checkReserves(): Promise<AuditReserveDoc[]> {
    const open = [...this.reserves.values()].filter((r) => r.amount > 0 && this.caughtUp.has(r.account));
    await eachLimited(open, READ_CONCURRENCY, async (r) => {
      const problem = await reserveProblem(this.runtime, r, this.now, this.startedAt, this.sweepMs);
      if (problem)
        this.add({ currency: r.currency, walletId: r.walletId, owner: r.owner, amount: r.amount, ...problem });
    });
    return open;
  }

  /** (e) settlements whose due step is long overdue, or that the sweeper parked. */
  async checkStuckSettlements(): Promise<void> {
    for (const v of await stuckSettlements(this.runtime, this.now)) this.add(v);
  }

  /**
   * (f) sessions against their recorded charges (MongoDB is the record; Redis only orders the debits): an open
   * session's budget in Redis never behind a recorded charge, a closed one's statement listing every recorded charge.
   */
  async checkSessions(open: AuditReserveDoc[]): Promise<void> {
    for (const r of open) if (r.subject?.kind === 'session') this.sessionsMoved.add(r.subject.id);
    await eachLimited([...this.sessionsMoved], READ_CONCURRENCY, async (sessionId) => {
      const problem = await sessionChargesProblem(this.runtime, sessionId);
      if (problem) this.add({ owner: sessionId, ...problem });
    });
  }

  report(totals: Totals): LedgerAuditReport {
    const currencies: Record<string, CurrencyTotals> = {};
    for (const [currency, t] of [...totals].sort(([a], [b]) => a.localeCompare(b))) {
      currencies[currency] = {
        credits: Number(t.credits),
        available: Number(t.available),
        escrow: Number(t.escrow),
        openReserves: Number(t.openReserves),
      };
    }
    const { complete, violations } = this;
    return {
      clean: complete && violations.length === 0,
      complete,
      violations,
      currencies,
      checked: {
        wallets: this.walletIds.length,
        accounts: this.accounts.length,
        accountsBehind: this.accounts.length - this.caughtUp.size,
        postingsRead: this.postingsRead,
        openReserves: [...this.reserves.values()].filter((r) => r.amount !== 0).length,
        inFlightEntries: this.inFlightEntries,
      },
      incremental: !this.full,
      tookMs: Date.now() - this.startedAt,
      at: new Date(this.startedAt).toISOString(),
    };
  }
}

/** Positions searched per missing leg, from the entry's floor, when the audit rebuilds an entry's legs. */
const MAX_LEG_SEARCH = 512;

/**
 * Rebuilds the legs of entries in question (incomplete ones, and these started ones) from the ledger: a leg missing
 * from the cache is looked for from its floor up to its account's checkpoint, where it would have been counted.
 */
async function recoverEntryLegs(
  runtime: Runtime,
  entries: Map<string, AuditEntryDoc>,
  checkpoints: Map<string, AuditAccountDoc>,
  startedAttempts: Array<LedgerEntryDoc | null>,
): Promise<void> {
  const store = runtime.stores.ledgerAudit;
  const inQuestion = [...entries.values()].filter((e) => !isComplete(e) && e.duplicates.length === 0).map((e) => e._id);
  await eachLimited([...new Set(inQuestion)], READ_CONCURRENCY, async (id) => {
    const attempt = await store.entryAttempt(id);
    if (attempt) await recoverLegsOf(runtime, entries, checkpoints, attempt);
  });
  await eachLimited(startedAttempts, READ_CONCURRENCY, async (attempt) => {
    if (attempt && !entries.has(attempt._id)) await recoverLegsOf(runtime, entries, checkpoints, attempt);
  });
}

async function recoverLegsOf(
  runtime: Runtime,
  entries: Map<string, AuditEntryDoc>,
  checkpoints: Map<string, AuditAccountDoc>,
  attempt: LedgerEntryDoc,
): Promise<void> {
  if (attempt.kind === 'credit') return;
  const e = entries.get(attempt._id) ?? {
    _id: attempt._id,
    entryId: attempt.entryId,
    currency: attempt.currency,
    legs: [],
    duplicates: [],
    firstAt: attempt.createdAt,
  };
  for (const [leg, spec] of attempt.legs.entries()) {
    if (e.legs.some((l) => l.leg === leg)) continue;
    const account = accountOf(spec.walletId, attempt.currency, spec.bucket);
    const upTo = Math.min(checkpoints.get(account)?.seq ?? 0, (attempt.floors[leg] ?? 0) + MAX_LEG_SEARCH);
    for (let from = (attempt.floors[leg] ?? 0) + 1; from <= upTo; from += 32) {
      const found = (await runtime.stores.ledgerAudit.postingsAt(account, from, Math.min(32, upTo - from + 1))).find(
        (p) => p && p.entryId === attempt.entryId && p.attempt === attempt.attempt && p.leg === leg,
      );
      if (found) {
        if (!found.refused) e.legs.push({ leg, delta: found.delta, account, seq: found.seq, posting: found._id });
        break;
      }
    }
  }
  if (e.legs.length > 0) entries.set(e._id, e);
}

/**
 * Whether the settlement is final with every entry it applied settled before `before` (so every posting of it was
 * on its chain when the pass began, and its reserve must read 0).
 */
async function finishedBefore(
  runtime: Runtime,
  s: SettlementDoc,
  facts: SettlementFacts,
  before: number,
): Promise<boolean> {
  const latest = await Promise.all(candidateEntries(s, facts).map((id) => runtime.stores.ledger.getEntry(id)));
  const applied = latest.filter((e) => e?.state === 'applied');
  if (!deriveSettlement(termsOf(s), facts, new Set(applied.map((e) => e!.entryId)), new Date()).final) return false;
  return applied.every((e) => e!.settledAt !== null && e!.settledAt.getTime() < before);
}

/** What is wrong with an open reserve given its owner's facts (read by `_id`), if anything. */
async function reserveProblem(
  runtime: Runtime,
  r: AuditReserveDoc,
  now: number,
  passStartedAt: number,
  sweepMs: number,
): Promise<Pick<AuditViolation, 'kind' | 'detail'> | null> {
  const { settlements, runs, x402 } = runtime.stores;
  const olderThanASweep = (at: Date | null) => at !== null && at.getTime() < now - sweepMs;
  const s = await settlements.get(r.owner);
  const subject: Subject | null =
    r.subject ?? (s ? (s.gateId ? { kind: 'gate', id: s.gateId } : { kind: 'run', id: s.runId }) : null);
  if (!subject)
    return { kind: 'reserve_owner_missing', detail: `reserve ${r._id} has neither a lock nor a settlement` };
  let deadline: number;
  if (subject.kind === 'session')
    return sessionReserveProblem(runtime, r, subject.id, olderThanASweep, now, passStartedAt, sweepMs);
  if (subject.kind === 'run') {
    const run = await runs.getAny(subject.id);
    if (!run)
      return olderThanASweep(r.openedAt)
        ? { kind: 'reserve_owner_missing', detail: `run ${subject.id} does not exist` }
        : null;
    if (!run.settlement)
      return olderThanASweep(r.lockedAt ?? r.openedAt)
        ? { kind: 'reserve_owner_missing', detail: `run ${subject.id} never took the terms its reserve was locked for` }
        : null;
    deadline = (r.lockedAt ?? r.openedAt).getTime() + runtime.config.reserves.runDeadlineSeconds * 1000;
  } else {
    const [gate, commitment] = await Promise.all([x402.storedGate(subject.id), x402.commitmentOf(subject.id)]);
    if (!gate)
      return olderThanASweep(r.openedAt)
        ? { kind: 'reserve_owner_missing', detail: `gate ${subject.id} does not exist` }
        : null;
    if ((commitment?.kind === 'cancellation' || commitment?.kind === 'expired') && olderThanASweep(commitment.at)) {
      return {
        kind: 'reserve_owner_cancelled',
        detail: `gate ${subject.id} was ${commitment.kind === 'expired' ? 'expired' : 'cancelled'} at ${commitment.at.toISOString()} and still holds its reserve`,
      };
    }
    deadline = gate.createdAt.getTime() + runtime.config.x402.gateTtlSeconds * 1000 + GATE_DEADLINE_SLACK_MS;
  }
  if (s) {
    const facts = await settlements.factsOf(s._id);
    if (facts.decision) {
      // Captured: what remains is the settlement's to move (a settlement that cannot is reported as stuck).
      if (await finishedBefore(runtime, s, facts, passStartedAt))
        return {
          kind: 'reserve_owner_finished',
          detail: `settlement ${s._id} of ${subject.kind} ${subject.id} is final yet its reserve holds ${r.amount}`,
        };
      return null;
    }
  }
  if (now > deadline + sweepMs)
    return {
      kind: 'reserve_overdue',
      detail: `the reserve of ${subject.kind} ${subject.id} was due back at ${new Date(deadline).toISOString()}`,
    };
  return null;
}

/**
 * A session's reserve is open while the session is; once closed, it holds only what its payees' settlements have
 * still to move (holdbacks in their window, disputes), and nothing once they are all final.
 */
async function sessionReserveProblem(
  runtime: Runtime,
  r: AuditReserveDoc,
  sessionId: string,
  olderThanASweep: (at: Date | null) => boolean,
  now: number,
  passStartedAt: number,
  sweepMs: number,
): Promise<Pick<AuditViolation, 'kind' | 'detail'> | null> {
  const { x402Sessions, settlements } = runtime.stores;
  const [session, close] = await Promise.all([x402Sessions.storedSession(sessionId), x402Sessions.closeOf(sessionId)]);
  if (!session)
    return olderThanASweep(r.openedAt)
      ? { kind: 'reserve_owner_missing', detail: `session ${sessionId} does not exist` }
      : null;
  if (!close) {
    const deadline = session.expiresAt.getTime() + GATE_DEADLINE_SLACK_MS;
    return now > deadline + sweepMs
      ? {
          kind: 'reserve_overdue',
          detail: `the budget of session ${sessionId} was due back at ${session.expiresAt.toISOString()}`,
        }
      : null;
  }
  if (!olderThanASweep(close.at)) return null;
  const refundDone =
    close.statement.body.refunded === 0 ||
    (await runtime.stores.ledger.firstAttemptApplied(sessionEntryIds.refund(sessionId)));
  for (const payee of close.statement.body.payees) {
    if (!payee.settlementId) continue;
    const s = await settlements.get(payee.settlementId);
    const facts = s && (await settlements.factsOf(s._id));
    if (!s || !facts?.decision || !(await finishedBefore(runtime, s, facts, passStartedAt))) return null; // still moving (a stuck one is reported as such)
  }
  return refundDone
    ? {
        kind: 'reserve_owner_finished',
        detail: `session ${sessionId} is closed and settled yet its reserve holds ${r.amount}`,
      }
    : null;
}

/** Seqs the audit reads past a session's last known one: a cheap look that finds what a rollback of Redis left. */
const SESSION_PROBE = 4;

/**
 * A session against its recorded charges: a charge recorded past the seq Redis' budget holds means Redis lost writes
 * and the budget was not yet put right (the session's next call or its close does); a charge recorded past its
 * statement's last seq is a receipt the close did not pay.
 */
async function sessionChargesProblem(
  runtime: Runtime,
  sessionId: string,
): Promise<Pick<AuditViolation, 'kind' | 'detail' | 'amount' | 'currency'> | null> {
  const store = runtime.stores.x402Sessions;
  const [session, close, budget] = await Promise.all([
    store.get(sessionId),
    store.closeOf(sessionId),
    store.budgetState(sessionId),
  ]);
  if (!session) return null;
  const lastSeq = close ? statementLastSeq(close.statement.body) : budget?.seq;
  if (lastSeq === undefined) return null; // an open session whose budget Redis lost entirely: rebuilt at its next call
  const beyond = (await store.chargesBeyond(sessionId, lastSeq, SESSION_PROBE)).filter((c) => c?.state === 'charged');
  if (beyond.length === 0) return null;
  const amount = beyond.reduce((sum, c) => sum + c!.amount, 0);
  const seqs = beyond.map((c) => c!.seq).join(', ');
  if (close)
    return {
      kind: 'session_charge_unpaid',
      currency: session.currency,
      amount,
      detail: `session ${sessionId} recorded charges ${seqs} that its statement (through seq ${lastSeq}) does not pay`,
    };
  // Calls go on while the audit looks: a charge debited and recorded since the budget was read is not behind it.
  const now = await store.budgetState(sessionId);
  if (!now || now.seq >= Math.max(...beyond.map((c) => c!.seq))) return null;
  return {
    kind: 'session_budget_behind',
    currency: session.currency,
    amount,
    detail: `session ${sessionId}'s budget in Redis is at seq ${lastSeq}, behind recorded charges ${seqs} (Redis lost writes)`,
  };
}

async function stuckSettlements(runtime: Runtime, now: number): Promise<AuditViolation[]> {
  const { settlements, sweepParked } = runtime.stores;
  const found = new Map<string, AuditViolation>();
  for (const record of await settlements.due.overdue(
    new Date(now - SETTLEMENT_STUCK_AFTER_MS),
    MAX_STUCK_SETTLEMENTS,
  )) {
    found.set(record._id, {
      kind: 'settlement_stuck',
      owner: record._id,
      detail: `settlement ${record._id} has had a step due since ${record.dueAt.toISOString()}`,
    });
  }
  for (const { id, parkedAt } of await sweepParked.list('settlements', MAX_STUCK_SETTLEMENTS)) {
    if (found.has(id)) continue;
    // A worker that died with the item parked never unparks it: a settlement no longer due is not stuck.
    if (!(await settlements.due.has(id))) {
      await sweepParked.unpark('settlements', id);
      continue;
    }
    found.set(id, {
      kind: 'settlement_stuck',
      owner: id,
      detail: `settlement ${id} was parked by its sweeper at ${new Date(parkedAt).toISOString()} after failing again and again`,
    });
  }
  return [...found.values()];
}

function recordMetrics(report: LedgerAuditReport): void {
  violationsGauge.reset();
  for (const v of report.violations) violationsGauge.inc({ kind: v.kind });
  lastRunGauge.set(Date.parse(report.at) / 1000 + report.tookMs / 1000);
  completeGauge.set(report.complete ? 1 : 0);
  durationGauge.set(report.tookMs / 1000);
  postingsGauge.set(report.checked.postingsRead);
}

/**
 * The settle sweeper's audit: at most every AUDIT_EVERY_MS across all processes (sooner while a backlog is still
 * being read), logged at error level when it finds violations. Null when it was not due, another audit runs or it
 * failed (logged; it never fails the sweep).
 */
export async function periodicLedgerAudit(runtime: Runtime): Promise<LedgerAuditReport | null> {
  const store = runtime.stores.ledgerAudit;
  if (!(await store.claimPeriodic(AUDIT_EVERY_MS))) return null;
  let report: LedgerAuditReport;
  try {
    report = await auditLedger(runtime);
  } catch (err) {
    // Never fails the sweep it runs in; the next claim tries again.
    if ((err as { code?: string }).code !== 'AUDIT_IN_PROGRESS')
      runtime.logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'ledger audit failed');
    return null;
  }
  const summary = {
    violations: report.violations.length,
    complete: report.complete,
    checked: report.checked,
    tookMs: report.tookMs,
  };
  if (report.violations.length > 0)
    runtime.logger.error(
      { ...summary, first: report.violations.slice(0, 20) },
      'ledger audit found money invariant violations',
    );
  else
    runtime.logger.info(
      summary,
      report.complete ? 'ledger audit clean' : 'ledger audit read part of its backlog; it goes on next sweep',
    );
  if (!report.complete) await store.claimPeriodicAgainIn(runtime.config.sweeper.intervalMs / 2);
  return report;
}
