import { randomBytes } from 'node:crypto';
import type { AnyBulkWriteOperation, Collection, Db } from 'mongodb';
import type { RedisClient } from '../redis.ts';
import { positionId, type Bucket, type LedgerEntryDoc, type LedgerStore, type PostingDoc } from './ledger.ts';
import type { LedgerDueIndex, StartedEntry } from './ledger-due.ts';
import { RECONCILIATION_COMMENT } from './mongo.ts';

// What the ledger audit remembers between passes, so that each pass reads only what was posted since the last one
// (every ledger read by exact `_id`). Three small collections, written only by the one process holding the audit
// lock, and all of it idempotent under a crash at any point:
// - a checkpoint per ledger account: the last position audited, the balance there, the credits seen up to there;
// - the open amount of each reserve (owner x account), with the last position folded into it (`throughSeq`), so a
//   pass that replays postings after a crash skips those already counted;
// - the entries seen partly (legs posted in accounts not yet walked, or still in flight), keyed by attempt, with the
//   position of every leg seen, so a replayed leg is recognised.
// A closed reserve (0) and a completed entry are deleted only once every account's checkpoint is past their last
// posting: a pass that dies before can then never meet one of their postings again.

/** One ledger account's audit checkpoint (`_id` = the account `<wallet>|<currency>|<bucket>`). */
export interface AuditAccountDoc {
  _id: string;
  walletId: string;
  currency: string;
  bucket: Bucket;
  /** The last position audited (0: none yet). */
  seq: number;
  /** The balance at `seq`. */
  balance: number;
  /** The sum of credit postings up to `seq`. */
  credits: number;
  at: Date;
}

/** The open amount of one owner's reserve in one escrow account (`_id` = `<owner>@<account>`). */
export interface AuditReserveDoc {
  _id: string;
  /** The settlement id of the run or gate that owns it (one key for every posting of the reserve). */
  owner: string;
  subject: { kind: 'run' | 'gate' | 'session'; id: string } | null;
  account: string;
  walletId: string;
  currency: string;
  amount: number;
  /** The last position of `account` folded into `amount`. */
  throughSeq: number;
  openedAt: Date;
  /** When its last lock posted (its deadline counts from there); null when no lock was seen. */
  lockedAt: Date | null;
  /** The first position where it went below zero: paid out more than was locked for it. Never cleared. */
  negative: { seq: number; amount: number } | null;
}

/** An entry attempt whose legs the audit has seen only in part (`_id` = the attempt's ledger id). */
export interface AuditEntryDoc {
  _id: string;
  entryId: string;
  currency: string;
  legs: Array<{ leg: number; delta: number; account: string; seq: number; posting: string }>;
  /** Postings of a leg already seen at another position: a leg posted twice. Never cleared. */
  duplicates: string[];
  firstAt: Date;
}

const RENEW_SCRIPT =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
const RELEASE_SCRIPT =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

export class LedgerAuditStore {
  readonly accounts: Collection<AuditAccountDoc>;
  readonly reserves: Collection<AuditReserveDoc>;
  readonly entries: Collection<AuditEntryDoc>;
  private readonly lockKey: string;
  private readonly periodicKey: string;
  /** Writes of one document go out one after another, so a later state never lands before an earlier one. */
  private readonly writes = new Map<string, Promise<unknown>>();

  constructor(
    db: Db,
    private readonly redis: RedisClient,
    redisPrefix: string,
    private readonly ledger: LedgerStore,
    private readonly ledgerDue: LedgerDueIndex,
  ) {
    this.accounts = db.collection<AuditAccountDoc>('ledger_audit_accounts');
    this.reserves = db.collection<AuditReserveDoc>('ledger_audit_reserves');
    this.entries = db.collection<AuditEntryDoc>('ledger_audit_entries');
    this.lockKey = `${redisPrefix}:{ledger-audit}:lock`;
    this.periodicKey = `${redisPrefix}:{ledger-audit}:periodic`;
  }

  // --- Concurrency: one audit at a time across all processes ---------------------------------------------------

  /** Takes the audit lock for `ttlMs`; answers its token, or null when another audit holds it. */
  async lock(ttlMs: number): Promise<string | null> {
    const token = randomBytes(12).toString('base64url');
    return (await this.redis.set(this.lockKey, token, 'PX', ttlMs, 'NX')) === 'OK' ? token : null;
  }

  /** Extends the lock while its token still holds it; false when it was lost (expired and taken by another). */
  async renew(token: string, ttlMs: number): Promise<boolean> {
    return Number(await this.redis.eval(RENEW_SCRIPT, 1, this.lockKey, token, String(ttlMs))) === 1;
  }

  async unlock(token: string): Promise<void> {
    await this.redis.eval(RELEASE_SCRIPT, 1, this.lockKey, token);
  }

  /** True for the one caller (across processes) whose periodic audit is due; the claim lasts `everyMs`. */
  async claimPeriodic(everyMs: number): Promise<boolean> {
    return (await this.redis.set(this.periodicKey, '1', 'PX', everyMs, 'NX')) === 'OK';
  }

  /** Lets the periodic audit run again after `ms` instead (a backlog still being read). */
  async claimPeriodicAgainIn(ms: number): Promise<void> {
    await this.redis.set(this.periodicKey, '1', 'PX', Math.max(1, ms));
  }

  // --- What is audited ------------------------------------------------------------------------------------------

  /**
   * Every wallet id: the one whole read of a ledger collection, on the small `wallets` (one per agent or sponsor,
   * never per run), marked as a bounded reconciliation read.
   */
  async walletIds(): Promise<string[]> {
    const docs = await this.ledger.wallets
      .find({}, { projection: { _id: 1 }, comment: RECONCILIATION_COMMENT })
      .toArray();
    return docs.map((d) => d._id);
  }

  /** The wallet's currencies, as LedgerStore.balances finds them. */
  async currenciesOf(walletId: string): Promise<string[]> {
    return (await this.ledger.currenciesOf(walletId)).map((c) => c.currency);
  }

  /** Positions `from`..`from+count-1` of an account's chain, each read by `_id` (null where none is stored). */
  postingsAt(account: string, from: number, count: number): Promise<Array<PostingDoc | null>> {
    return Promise.all(
      Array.from({ length: count }, (_, i) => this.ledger.postings.findOne({ _id: positionId(account, from + i) })),
    );
  }

  /** An entry attempt by its ledger id. */
  entryAttempt(attemptId: string): Promise<LedgerEntryDoc | null> {
    return this.ledger.entries.findOne({ _id: attemptId });
  }

  /** Entries whose apply() started and has not finished (the ledger's due index), at most `limit`. */
  startedEntries(limit: number): Promise<StartedEntry[]> {
    return this.ledgerDue.startedEntries(limit);
  }

  // --- The audit's own state ------------------------------------------------------------------------------------

  /** All checkpoints, reserves still open (or not yet collected) and partly seen entries: small, read whole. */
  async loadState(): Promise<{ accounts: AuditAccountDoc[]; reserves: AuditReserveDoc[]; entries: AuditEntryDoc[] }> {
    const options = { comment: RECONCILIATION_COMMENT };
    const [accounts, reserves, entries] = await Promise.all([
      this.accounts.find({}, options).toArray(),
      this.reserves.find({}, options).toArray(),
      this.entries.find({}, options).toArray(),
    ]);
    return { accounts, reserves, entries };
  }

  saveAccount(doc: AuditAccountDoc): Promise<unknown> {
    return this.inOrder(`a:${doc._id}`, () => this.accounts.replaceOne({ _id: doc._id }, doc, { upsert: true }));
  }

  /** Writes these reserves' current state (each write after the previous write of the same reserve). */
  saveReserves(docs: AuditReserveDoc[]): Promise<unknown> {
    return Promise.all(
      docs.map((d) =>
        this.inOrder(`r:${d._id}`, () => this.reserves.replaceOne({ _id: d._id }, { ...d }, { upsert: true })),
      ),
    );
  }

  saveEntries(docs: AuditEntryDoc[]): Promise<unknown> {
    return Promise.all(
      docs.map((d) =>
        this.inOrder(`e:${d._id}`, () =>
          this.entries.replaceOne(
            { _id: d._id },
            { ...d, legs: [...d.legs], duplicates: [...d.duplicates] },
            { upsert: true },
          ),
        ),
      ),
    );
  }

  async deleteReserves(ids: string[]): Promise<void> {
    await this.deleteByIds(this.reserves, ids, 'r');
  }

  async deleteEntries(ids: string[]): Promise<void> {
    await this.deleteByIds(this.entries, ids, 'e');
  }

  /** Deletes by exact `_id`, one statement each, in bulks (FerretDB uses its index only for that filter). */
  private async deleteByIds<T extends { _id: string }>(
    collection: Collection<T>,
    ids: string[],
    tag: string,
  ): Promise<void> {
    for (const id of ids) await this.writes.get(`${tag}:${id}`);
    for (let i = 0; i < ids.length; i += 500) {
      const ops = ids.slice(i, i + 500).map((_id) => ({ deleteOne: { filter: { _id } } }) as AnyBulkWriteOperation<T>);
      await collection.bulkWrite(ops, { ordered: false });
    }
  }

  private inOrder(key: string, write: () => Promise<unknown>): Promise<unknown> {
    const previous = this.writes.get(key) ?? Promise.resolve();
    const run = previous.then(write, write);
    const tail = run.catch(() => undefined);
    this.writes.set(key, tail);
    void tail.then(() => {
      if (this.writes.get(key) === tail) this.writes.delete(key);
    });
    return run;
  }
}
