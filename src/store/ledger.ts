import { recorded } from '../domain/money.ts';
import type { Collection, Db } from 'mongodb';
import { errors, ServiceError, serviceError } from '../domain/errors.ts';
import { failpoint } from '../domain/failpoints.ts';
import type { LedgerDueIndex } from './ledger-due.ts';
import { insertFirst, insertInOrder, isDuplicateKey, RECONCILIATION_COMMENT } from './mongo.ts';

// The ledger without transactions, and with every read and write of a growing collection by exact `_id` (on
// FerretDB nothing else uses an index). What makes it correct is unique inserts only; updated documents (account
// heads, entry states) are caches that may trail or lose an update and are repaired from the inserted records.
//
// - A posting's `_id` is its position `<account>#<seq>`: claiming a position is a unique insert, so one posting
//   holds each position, chains have no gaps (position n+1 is claimed only by one who read n), and walking a chain
//   is by `_id`. Balances are the chains' ends: the cached head, walked forward to the first missing position.
// - The head cache is written only at every HEAD_CACHE_EVERY-th position (an update costs FerretDB more than any
//   other command), so it trails by a few positions. A process also remembers the furthest posting it has claimed or
//   read per account: a head that may trail, never lead, so a poster starts from it without reading, and a claim
//   lost to another process costs one read of the posting that won. On an account where it lost a claim (another
//   process posts there too), the next entry reads the position after that head first, beside its other reads,
//   unless that other process has since reported where it left the account (learnReportedHeads).
// - A leg of an entry is resolved at most once: before claiming position p for it, a poster checks every position
//   since the entry's floor (the account's head as read or remembered before the entry was recorded, never above any
//   later posting) up to p-1 for a posting of that leg. Two posters of one leg thus meet on the same position, or the
//   later one sees the earlier one's posting; a crash after the claim is found the same way. The leg marker
//   `<attemptId>#<leg>` records the result so that later looks are one read (written by whoever finishes an attempt
//   it did not record itself; the recorder's own legs are only ever looked at again after a crash).
// - Only the first leg may debit. A debit the chain's end cannot cover claims its position as a refusal (delta 0),
//   so "refused" and "posted" are decided by the same unique insert and two posters can never disagree.
// - A fresh attempt whose debit its head covers claims all its positions (the debit's, then each credit's, every
//   leg on an account of its own) in one ordered insert: a credit's position is inserted only once every one before
//   it was (an ordered insert stops at its first failure), so a credit never lands without its debit. A claim that
//   lost goes on alone, as any other, and so do the legs after it.
// - A refused entry moved nothing and may be retried under the same id: each retry is a new attempt document
//   `<entryId>~<n>`, claimed by unique insert; attempts are never deleted, so no poster's work can vanish.

export type Bucket = 'available' | 'escrow';
const BUCKETS: readonly Bucket[] = ['available', 'escrow'];

export interface AccountHead {
  seq: number;
  balance: number;
}

export interface WalletDoc {
  _id: string;
  tenantId: string;
  kind: 'agent' | 'sponsor';
  createdAt: Date;
}

/** A cache of one account's chain end (wallet x currency x bucket); it may trail the chain, never lead it. */
export interface AccountDoc {
  _id: string;
  seq: number;
  balance: number;
}

/** The n-th currency a wallet has ever held (`<walletId>#cur#<n>`, n claimed by unique insert, never removed). */
export interface WalletCurrencyDoc {
  _id: string;
  walletId: string;
  currency: string;
}

export type Balances = Record<string, { available: number; escrow: number }>;

/** One position of an account's chain: a leg of an entry, or the refusal of a debit (delta 0). */
export interface PostingDoc {
  _id: string;
  account: string;
  walletId: string;
  currency: string;
  bucket: Bucket;
  seq: number;
  entryId: string;
  attempt: number;
  leg: number;
  delta: number;
  balanceAfter: number;
  refused: boolean;
  kind: string;
  at: Date;
}

/** Where a leg of an attempt was resolved (`<attemptId>#<leg>`). */
export interface LegMarkDoc {
  _id: string;
  posting: string;
  refused: boolean;
  balanceAfter: number;
}

/**
 * The legs claimed together, in leg order, whether the position of the one after them was found taken, and the heads
 * the claim started from (a head may have moved past the one read before the entry: see claimTogether).
 */
type ClaimedLegs = {
  claims: Array<{ mark: LegMarkDoc; written: Promise<unknown> }>;
  lost: boolean;
  heads?: AccountHead[];
};

/** Attempts waiting to be claimed together on the same accounts, in arrival order (see claimTogether). */
type TogetherBatch = Array<{
  attempt: LedgerEntryDoc;
  heads: AccountHead[];
  resolve: (claimed: ClaimedLegs) => void;
  reject: (err: unknown) => void;
}>;

export interface Leg {
  walletId: string;
  bucket: Bucket;
  delta: number;
}

/** An entry as its callers state it: `_id` is the entry id they derive from the work. */
/** The two legs that move an amount between one wallet's buckets (escrow locks and their returns): debit first. */
export function bucketMove(walletId: string, from: Bucket, to: Bucket, amount: number): Leg[] {
  return [
    { walletId, bucket: from, delta: -amount },
    { walletId, bucket: to, delta: amount },
  ];
}

/** An account's head as one process reports it to another: a posting that exists (see learnReportedHeads). */
export interface ReportedHead {
  account: string;
  seq: number;
  balance: number;
}

export interface PreparedEntry {
  /** The accounts it was read for, in leg order: apply uses it only for an entry whose legs are these accounts. */
  accounts: string[];
  heads: AccountHead[];
}

export interface ApplyOptions {
  /** The id derives from something just created: skip looking for an earlier attempt (the insert still tells). */
  expectNew?: boolean;
  /** From prepare(), read before the entry is recorded. */
  prepared?: PreparedEntry;
  /** Called once, when the entry is recorded (by this call or a concurrent one), before its legs are resolved. */
  onRecorded?: () => void;
}

export interface NewLedgerEntry {
  _id: string;
  tenantId: string;
  kind: string;
  currency: string;
  legs: Leg[];
  ref: Record<string, string>;
}

/**
 * One attempt at a balance change, recorded before it is applied: `_id` is the entry id for the first attempt,
 * `<entryId>~<n>` for the n-th (after n-1 refusals). `state` and `settledAt` are a cache of what its leg markers say.
 */
export interface LedgerEntryDoc extends NewLedgerEntry {
  entryId: string;
  attempt: number;
  /** Per leg, its account's cached head read before this attempt was recorded: no posting of it lies at or below. */
  floors: number[];
  state: 'pending' | 'applied' | 'rejected';
  createdAt: Date;
  settledAt: Date | null;
  /** An escrow lock whose run was found: a hint that spares the due-index audit, not a fact anything relies on. */
  reconciled?: boolean;
}

/** Escrow locks are checked against their run by the settle sweeper (a lock whose run was never stored is returned). */
const RECONCILED_KIND = 'escrow_lock';
const MAX_POST_ATTEMPTS = 200;
const CHAIN_READ_BATCH = 32;
/** Attempts claimed by one ordered insert at most (each two or three postings). */
const MAX_BATCH_ENTRIES = 32;
/** The head cache is written when a posting lands on a multiple of this (or a reader walked this far past it). */
const HEAD_CACHE_EVERY = 8;
/**
 * The least time between a lock's application and the sweeper concluding that its run will never be stored: the
 * locking request stores the run right after (a sweeper set to act at once raced it under load).
 */
export const RUN_GRACE_MS = 2_000;
/** apply() records its due marker just before its entry: a marker without an entry this old will never get one. */
const ORPHAN_GRACE_MS = 60_000;
/** How long a sweep leaves an entry alone after finishing it failed (say, a wallet that does not exist). */
const RETRY_FAILED_AFTER_MS = 60_000;
/** At most this often (all processes together) is the due index rebuilt from a scan of the entries. */
const AUDIT_EVERY_MS = 6 * 3_600_000;
const AUDIT_LIMIT = 10_000;
/** In-process memo of facts that never change (wallets exist, a wallet holds a currency); reset when this large. */
const MEMO_LIMIT = 100_000;
/** Postings kept in memory (see knownPostings): some hundreds of bytes each. */
const POSTINGS_REMEMBERED = 4_096;

/** The id of an entry's n-th attempt: the entry id itself for the first. */
export function attemptId(entryId: string, attempt: number): string {
  return attempt === 1 ? entryId : `${entryId}~${attempt}`;
}

/** A ledger account's id: one chain per wallet, currency and bucket. */
export function accountOf(walletId: string, currency: string, bucket: Bucket): string {
  return `${walletId}|${currency}|${bucket}`;
}

/** The `_id` of the posting at position `seq` of an account's chain. */
export function positionId(account: string, seq: number): string {
  return `${account}#${seq}`;
}

function currencyRecordId(walletId: string, n: number): string {
  return `${walletId}#cur#${n}`;
}

function remember(memo: Set<string>, key: string): void {
  if (memo.size >= MEMO_LIMIT) memo.clear();
  memo.add(key);
}

function insufficientFunds(walletId: string, currency: string, needed: number, available: number) {
  return serviceError('INSUFFICIENT_FUNDS', `wallet ${walletId} cannot cover ${needed} ${currency}`, {
    walletId,
    currency,
    needed,
    available,
  });
}

/**
 * A repeat of an entry id must ask for the same movement (kind, currency, every leg's wallet, bucket and amount):
 * an id reused for another one is refused whole, never answered with the first one's outcome. A refused attempt
 * moved nothing, so the next attempt may ask for another movement (a settle retried with terms the payer can cover).
 */
function assertSameMovement(recorded: NewLedgerEntry, asked: NewLedgerEntry): void {
  const movement = (e: NewLedgerEntry) =>
    JSON.stringify([e.kind, e.currency, e.legs.map((l) => [l.walletId, l.bucket, l.delta])]);
  if (movement(recorded) !== movement(asked)) {
    throw errors.conflict('TRANSITION_ILLEGAL', `ledger entry ${asked._id} already records another movement`, {
      status: recorded.kind,
    });
  }
}

/** The ledger's definite refusal of a debit: the entry moved nothing, and no later pass will move it. */
export function isInsufficientFunds(err: unknown): boolean {
  return err instanceof ServiceError && err.code === 'INSUFFICIENT_FUNDS';
}

/** The wallet-entries cursor: per account (currency number + a|e), the highest position not yet listed. */
function encodeEntriesCursor(remaining: Array<{ n: number; bucket: Bucket; seq: number }>): string {
  return Buffer.from(remaining.map((r) => `${r.n}${r.bucket[0]}${r.seq}`).join('.'), 'utf8').toString('base64url');
}

function decodeEntriesCursor(token: string): Map<string, number> | null {
  const text = Buffer.from(token, 'base64url').toString('utf8');
  if (!/^\d{1,4}[ae]\d{1,16}(\.\d{1,4}[ae]\d{1,16})*$/.test(text)) return null;
  const positions = new Map<string, number>();
  for (const part of text.split('.')) {
    const [, n, b, seq] = /^(\d+)([ae])(\d+)$/.exec(part)!;
    const key = `${Number(n)}${b}`;
    if (positions.has(key) || !Number.isSafeInteger(Number(seq))) return null;
    positions.set(key, Number(seq));
  }
  return positions;
}

/** Reads one account's chain backwards from a position, a batch of `_id` lookups at a time. */
class ChainReader {
  private buffer: PostingDoc[] = [];
  constructor(
    private readonly postings: Collection<PostingDoc>,
    readonly n: number,
    readonly bucket: Bucket,
    private readonly account: string,
    private next: number,
    private readonly batch: number,
  ) {}

  /** The highest position not yet taken from this reader (0 when it is done). */
  get remaining(): number {
    return this.buffer[0]?.seq ?? this.next;
  }

  async peek(): Promise<PostingDoc | null> {
    if (this.buffer.length === 0 && this.next > 0) {
      const seqs = Array.from({ length: Math.min(this.batch, this.next) }, (_, i) => this.next - i);
      const docs = await Promise.all(seqs.map((seq) => this.postings.findOne({ _id: positionId(this.account, seq) })));
      // Chains have no gaps (position n+1 is claimed only by one who read n), so a hole means a broken store.
      if (docs.some((d) => !d)) throw new Error(`ledger chain ${this.account} has a gap below ${this.next}`);
      this.buffer = docs as PostingDoc[];
      this.next -= seqs.length;
    }
    return this.buffer[0] ?? null;
  }

  take(): PostingDoc {
    return this.buffer.shift()!;
  }
}

export class LedgerStore {
  /** Fault injection for tests: called after each leg is posted; throwing there simulates a crash between legs. */
  failAfterLeg: ((entryId: string, leg: number) => void) | null = null;
  /** Fault injection for tests: called after a leg's position is claimed, before its marker is written. */
  failAfterClaim: ((entryId: string, leg: number) => void) | null = null;
  readonly wallets: Collection<WalletDoc>;
  readonly walletCurrencies: Collection<WalletCurrencyDoc>;
  readonly accounts: Collection<AccountDoc>;
  readonly postings: Collection<PostingDoc>;
  readonly legMarks: Collection<LegMarkDoc>;
  readonly entries: Collection<LedgerEntryDoc>;

  constructor(
    db: Db,
    private readonly due: LedgerDueIndex,
  ) {
    this.wallets = db.collection<WalletDoc>('wallets');
    this.walletCurrencies = db.collection<WalletCurrencyDoc>('wallet_currencies');
    this.accounts = db.collection<AccountDoc>('ledger_accounts');
    this.postings = db.collection<PostingDoc>('ledger_postings');
    this.legMarks = db.collection<LegMarkDoc>('ledger_legs');
    this.entries = db.collection<LedgerEntryDoc>('ledger_entries');
  }

  async ensureWallet(walletId: string, tenantId: string, kind: WalletDoc['kind']): Promise<WalletDoc> {
    await insertFirst(this.wallets, { _id: walletId, tenantId, kind, createdAt: new Date() }); // or it already exists
    return recorded(await this.wallets.findOne({ _id: walletId }), `wallet ${walletId}`);
  }

  getWallet(walletId: string): Promise<WalletDoc | null> {
    return this.wallets.findOne({ _id: walletId });
  }

  /**
   * Records and applies an entry once; a repeat (or a retry after a crash) finishes what is missing and returns
   * the same outcome. Throws 402 INSUFFICIENT_FUNDS when its debit cannot be covered (and records the refusal; a
   * later apply under the same id tries again). An applied entry costs one read. `expectNew` (an id derived from
   * something just created) skips that read: the attempt's unique insert tells a repeat apart just as well.
   */
  async apply(entry: NewLedgerEntry, options: ApplyOptions = {}): Promise<LedgerEntryDoc> {
    for (const [i, leg] of entry.legs.entries()) {
      if (!Number.isSafeInteger(leg.delta) || leg.delta === 0)
        throw new Error(`entry ${entry._id} leg ${i}: delta must be a non-zero integer`);
      if (i > 0 && leg.delta < 0) throw new Error(`entry ${entry._id}: only the first leg may debit`);
    }
    if (entry.legs.reduce((sum, l) => sum + l.delta, 0) !== 0 && entry.kind !== 'credit') {
      throw new Error(`entry ${entry._id} does not balance`);
    }
    let latest: LedgerEntryDoc | null = null;
    if (!options.expectNew) {
      latest = await this.latestAttempt(entry._id);
      if (latest && latest.state !== 'rejected') {
        assertSameMovement(latest, entry);
        return this.finish(latest);
      }
    }

    // No attempt yet, or the last one was refused (it moved nothing): record the next one, due marker first. The
    // heads read for the floors are also where the legs start looking for the chains' ends.
    const accounts = entry.legs.map((l) => accountOf(l.walletId, entry.currency, l.bucket));
    const given =
      options.prepared &&
      options.prepared.accounts.length === accounts.length &&
      options.prepared.accounts.every((a, i) => a === accounts[i])
        ? options.prepared
        : null;
    const [marker, { heads }] = await Promise.all([this.due.entryStarted(entry._id), given ?? this.prepare(entry)]);
    failpoint('ledger.entry-started');
    // Every leg's limit before anything is recorded: a credit refused after its debit posted would make money vanish
    // (and leave an entry no sweep can finish). The heads may trail their chains; a chain end that did grow past
    // them is checked again when the leg is claimed.
    const over = entry.legs.findIndex((l, i) => l.delta > 0 && !Number.isSafeInteger(heads[i]!.balance + l.delta));
    if (over >= 0) {
      await this.due.entryDone(marker);
      throw serviceError(
        'BALANCE_LIMIT',
        `wallet ${entry.legs[over]!.walletId} would hold more ${entry.currency} than this ledger can count`,
        { walletId: entry.legs[over]!.walletId, currency: entry.currency },
      );
    }
    const floors = heads.map((h) => h.seq);
    let told = false;
    const recorded = () => {
      if (!told) options.onRecorded?.();
      told = true;
    };
    try {
      for (let attempt = (latest?.attempt ?? 0) + 1; ;) {
        const doc: LedgerEntryDoc = {
          ...entry,
          _id: attemptId(entry._id, attempt),
          entryId: entry._id,
          attempt,
          floors,
          state: 'pending',
          createdAt: new Date(),
          settledAt: null,
        };
        let applied: LedgerEntryDoc;
        if (await insertFirst(this.entries, doc)) {
          recorded();
          applied = await this.finish(doc, heads);
        } else {
          // A concurrent apply recorded this attempt first (or, with expectNew, the entry already existed).
          const current = await this.latestAttempt(entry._id);
          if (!current) throw new Error(`ledger entry ${doc._id} vanished`); // attempts are never deleted
          if (current.state !== 'rejected') assertSameMovement(current, entry);
          if (current.state === 'rejected' && options.expectNew && current.attempt >= attempt) {
            attempt = current.attempt + 1; // refused before: try again under a new attempt, as apply does
            continue;
          }
          recorded();
          applied = await this.finish(current);
        }
        await this.due.entryDone(marker);
        return applied;
      }
    } catch (err) {
      if (isInsufficientFunds(err)) await this.due.entryDone(marker); // refused is finished too
      throw err;
    }
  }

  /**
   * What apply reads before it records an entry: the heads of its accounts (its floors, and where its legs start),
   * from this process's memory (with the position after it read, where another process posts too), else the chain's
   * end read from its cache forward. A caller may read them beside its own reads and hand them to apply; read any
   * time before the entry is recorded, they are valid floors (neither a remembered head nor the head cache ever leads
   * its chain).
   */
  async prepare(entry: { currency: string; legs: Array<Pick<Leg, 'walletId' | 'bucket'>> }): Promise<PreparedEntry> {
    const accounts = entry.legs.map((l) => accountOf(l.walletId, entry.currency, l.bucket));
    const headOf = (account: string) => {
      const known = this.knownHeads.get(account);
      return !known ? this.chainEnd(account) : this.contended.has(account) ? this.peekPast(account, known) : known;
    };
    return { accounts, heads: await Promise.all(accounts.map(headOf)) };
  }

  /** The posting after a remembered head, if any (then the head it gives); none means the account went quiet. */
  private async peekPast(account: string, known: AccountHead): Promise<AccountHead> {
    const next = await this.postingAtSeq(account, known.seq + 1, new Map());
    if (!next) {
      this.contended.delete(account);
      return known;
    }
    this.learnHead(account, next);
    return { seq: next.seq, balance: next.balanceAfter };
  }

  /** Finishes an entry's latest attempt (what apply does after recording it). */
  async resume(entryId: string): Promise<LedgerEntryDoc> {
    const latest = await this.latestAttempt(entryId);
    if (!latest) throw new Error(`ledger entry ${entryId} not found`);
    return this.finish(latest);
  }

  /** The entry's latest attempt: later attempts exist only after a refusal, so this is one read unless refused. */
  private async latestAttempt(entryId: string): Promise<LedgerEntryDoc | null> {
    let doc = await this.entries.findOne({ _id: entryId });
    while (doc?.state === 'rejected') {
      const next = await this.entries.findOne({ _id: attemptId(entryId, doc.attempt + 1) });
      if (!next) return doc;
      doc = next;
    }
    return doc;
  }

  /**
   * Resolves the attempt's legs in order and marks it applied. `heads` (a fresh attempt: no one has resolved a leg
   * yet, most likely) are cached heads read before it was recorded, where each leg starts instead of re-reading.
   * A leg's marker and head cache are written while the next leg is claimed: both are caches of the posting.
   */
  private async finish(attempt: LedgerEntryDoc, heads?: AccountHead[]): Promise<LedgerEntryDoc> {
    if (attempt.state === 'applied') return attempt;
    const trailing: Array<Promise<unknown>> = [];
    try {
      const accounts = attempt.legs.map((l) => accountOf(l.walletId, attempt.currency, l.bucket));
      const together =
        heads && this.claimableTogether(attempt, heads, accounts)
          ? await this.claimTogether(attempt, heads, accounts)
          : null;
      for (const [leg, spec] of attempt.legs.entries()) {
        const { mark, written } =
          together?.claims[leg] ??
          (await this.resolveLeg(
            attempt,
            leg,
            spec,
            together?.heads?.[leg] ?? heads?.[leg],
            together?.lost === true && leg === together.claims.length,
          ));
        trailing.push(written);
        if (mark.refused) {
          await Promise.all(trailing);
          if (attempt.state !== 'rejected')
            await this.entries.updateOne({ _id: attempt._id }, { $set: { state: 'rejected', settledAt: new Date() } });
          throw insufficientFunds(spec.walletId, attempt.currency, -spec.delta, mark.balanceAfter);
        }
        this.failAfterLeg?.(attempt.entryId, leg);
        failpoint('ledger.leg-posted');
      }
      // Indexed while the attempt's pending marker still stands, so a crash here cannot lose the lock's check; scored
      // by when it was applied, as its run is stored right after that.
      if (attempt.kind === RECONCILED_KIND) await this.due.lockApplied(attempt.entryId, new Date());
      const settledAt = new Date();
      await Promise.all([
        ...trailing,
        this.entries.updateOne({ _id: attempt._id }, { $set: { state: 'applied', settledAt } }),
      ]);
      return { ...attempt, state: 'applied', settledAt };
    } catch (err) {
      await Promise.allSettled(trailing); // nothing left running behind a failure
      throw err;
    }
  }

  /** The leg's marker, resolving the leg first (posting it, or refusing its debit) if no one has yet. */
  private async resolveLeg(
    attempt: LedgerEntryDoc,
    leg: number,
    spec: Leg,
    head?: AccountHead,
    lost = false,
  ): Promise<{ mark: LegMarkDoc; written: Promise<unknown> }> {
    // The marker only saves a walk: claimLeg finds an earlier posting of the leg from the floor on its own, so a
    // fresh attempt (whose marker almost never exists) goes straight to it.
    if (!head) {
      const known = await this.legMarks.findOne({ _id: `${attempt._id}#${leg}` });
      if (known) return { mark: known, written: Promise.resolve() };
    }
    const account = accountOf(spec.walletId, attempt.currency, spec.bucket);
    return this.serialized(account, () => this.claimLeg(attempt, leg, spec, account, head, lost));
  }

  /**
   * A fresh attempt's legs (a debit, then credits, each on an account of its own), each starting right at its floor,
   * so that none has a position to look at before its claim.
   */
  private claimableTogether(attempt: LedgerEntryDoc, heads: AccountHead[], accounts: string[]): boolean {
    const [debit, ...credits] = attempt.legs;
    return (
      attempt.legs.length >= 2 &&
      debit!.delta < 0 &&
      credits.every((c) => c.delta > 0) &&
      heads.length === attempt.legs.length &&
      heads.every((h, i) => h.seq === attempt.floors[i]) &&
      new Set(accounts).size === accounts.length
    );
  }

  /**
   * Claims every leg of such an attempt in one ordered insert (a credit's position only if every position before it
   * was won) when the debit's head covers it; a debit position found taken is read (it must not be this leg's
   * posting) and the claim tried again after it. Answers the legs it claimed, and whether the next one's position was
   * found taken: that leg and any after it are then claimed alone, as in any other case. Holds all the accounts'
   * queues, taken in the order of their names (as every holder of several does), so two such claims never wait for
   * each other.
   *
   * Attempts on the same accounts that arrive while an earlier one holds them wait together and are claimed by one
   * ordered insert, one after another at consecutive positions (group commit on an account's head): one wallet paying
   * for many calls at once otherwise queued them one round trip each, and what a claim costs does not depend on how
   * many postings it carries (issue 40). An attempt the batch cannot place (its debit not covered where it would land,
   * a position between its heads and the batch's start this process does not know) is claimed alone.
   */
  private claimTogether(attempt: LedgerEntryDoc, heads: AccountHead[], accounts: string[]): Promise<ClaimedLegs> {
    const key = accounts.join('\n');
    return new Promise<ClaimedLegs>((resolve, reject) => {
      const forming = this.formingBatches.get(key);
      if (forming) {
        forming.push({ attempt, heads, resolve, reject });
        return;
      }
      const batch: TogetherBatch = [{ attempt, heads, resolve, reject }];
      this.formingBatches.set(key, batch);
      const holding = (names: string[], work: () => Promise<void>): Promise<void> =>
        names.length === 0 ? work() : this.serialized(names[0]!, () => holding(names.slice(1), work));
      void holding([...accounts].sort(), async () => {
        // Closed once it holds the queues: later attempts form the next batch meanwhile.
        if (this.formingBatches.get(key) === batch) this.formingBatches.delete(key);
        const claiming = batch.splice(0, MAX_BATCH_ENTRIES);
        try {
          await this.claimBatch(claiming, accounts);
        } catch (err) {
          for (const waiting of claiming) waiting.reject(err); // those already answered keep their answer
        }
        // Over the bound: the rest go on alone (rare), as does anything the batch left unanswered.
        for (const waiting of [...claiming, ...batch]) waiting.resolve({ claims: [], lost: false });
      });
    });
  }

  /** Claims a batch of attempts on the same accounts (see claimTogether); settles every one of them. */
  private async claimBatch(batch: TogetherBatch, accounts: string[]): Promise<void> {
    const alone = (w: TogetherBatch[number]) => w.resolve({ claims: [], lost: false });
    await Promise.all(batch.flatMap((w) => w.attempt.legs.map((l) => this.requireWallet(l.walletId))));
    // Armed to crash between the legs, the test hooks have the legs claimed one at a time.
    if (this.failAfterLeg || this.failAfterClaim) return batch.forEach(alone);
    let waiting = batch;
    for (let round = 0; round < 4 && waiting.length > 0; round++) {
      // The batch starts at the furthest head known of each account: this process's own, or one its attempts read.
      const ends = accounts.map((a, i) => {
        let end = this.knownHeads.get(a) ?? waiting[0]!.heads[i]!;
        for (const w of waiting) if (w.heads[i]!.seq > end.seq) end = w.heads[i]!;
        return end;
      });
      // Each attempt's legs at the positions after those of the attempts before it, while its debit is covered there;
      // every position between its own heads and the batch's start must be a posting known here and not its leg.
      const placed: Array<{ w: TogetherBatch[number]; starts: AccountHead[]; postings: PostingDoc[] }> = [];
      const rest: TogetherBatch = [];
      const roundStart = [...ends];
      for (const w of waiting) {
        const [debit, ...credits] = w.attempt.legs as [Leg, ...Leg[]];
        const fits =
          ends[0]!.seq > 0 &&
          ends[0]!.balance + debit.delta >= 0 &&
          credits.every((c, i) => ends[i + 1]!.seq > 0 && Number.isSafeInteger(ends[i + 1]!.balance + c.delta));
        const known =
          !placed.some((p) => p.w.attempt._id === w.attempt._id) &&
          accounts.every(
            (a, i) =>
              w.heads[i]!.seq >= roundStart[i]!.seq ||
              this.knownFreeOfLeg(a, w.attempt, i, w.heads[i]!.seq + 1, roundStart[i]!.seq),
          );
        if (!fits || !known || rest.length > 0) {
          // Placed after nothing it skipped: an attempt that does not fit ends this round's placements.
          if (!fits && placed.length === 0 && rest.length === 0) alone(w);
          else if (!known) alone(w);
          else rest.push(w);
          continue;
        }
        const starts = [...ends];
        const postings = w.attempt.legs.map((leg, i) =>
          this.postingAt(w.attempt, i, leg, accounts[i]!, ends[i]!, false),
        );
        postings.forEach((p, i) => (ends[i] = { seq: p.seq, balance: p.balanceAfter }));
        placed.push({ w, starts, postings });
      }
      if (placed.length === 0) {
        waiting = rest;
        continue;
      }
      let inserted: number;
      try {
        inserted = await insertInOrder(
          this.postings,
          placed.flatMap((p) => p.postings),
        );
      } catch (err) {
        for (const p of placed) p.w.reject(err);
        for (const w of rest) alone(w);
        return;
      }
      const next: TogetherBatch = [];
      let offset = 0;
      for (const p of placed) {
        const won = Math.max(0, Math.min(p.postings.length, inserted - offset));
        offset += p.postings.length;
        if (won === 0) next.push(p.w);
        else {
          // A crash point armed on one attempt's claim stops that attempt alone, as its own insert would have.
          try {
            p.w.resolve({
              claims: p.postings.slice(0, won).map((posting, leg) => this.claimed(p.w.attempt, leg, posting, false)),
              lost: won < p.postings.length,
              heads: p.starts,
            });
          } catch (err) {
            p.w.reject(err);
          }
        }
      }
      if (next.length > 0) {
        // The first position not won is taken (by another process, or by a poster of one of these very legs): read
        // it, so that the next round starts past it.
        const failed = placed.flatMap((p) => p.postings)[inserted]!;
        const taken = await this.postingAtSeq(failed.account, failed.seq, new Map());
        if (!taken || next.some((w) => taken.entryId === w.attempt.entryId && taken.attempt === w.attempt.attempt)) {
          next.forEach(alone);
          next.length = 0;
        } else {
          this.learnTaken(failed.account, taken);
        }
      }
      waiting = [...next, ...rest];
    }
    waiting.forEach(alone);
  }

  /** Whether positions from..to are all postings this process knows, none of them this attempt's leg. */
  private knownFreeOfLeg(account: string, attempt: LedgerEntryDoc, leg: number, from: number, to: number): boolean {
    for (let seq = from; seq <= to; seq++) {
      const p = this.knownPostings.get(positionId(account, seq));
      if (!p || (p.entryId === attempt.entryId && p.attempt === attempt.attempt && p.leg === leg)) return false;
    }
    return true;
  }

  /** The posting of a leg at the position after `end` (a refusal when it is a debit `end` cannot cover). */
  private postingAt(
    attempt: LedgerEntryDoc,
    leg: number,
    spec: Leg,
    account: string,
    end: AccountHead,
    refused: boolean,
  ): PostingDoc {
    return {
      _id: positionId(account, end.seq + 1),
      account,
      walletId: spec.walletId,
      currency: attempt.currency,
      bucket: spec.bucket,
      seq: end.seq + 1,
      entryId: attempt.entryId,
      attempt: attempt.attempt,
      leg,
      delta: refused ? 0 : spec.delta,
      balanceAfter: refused ? end.balance : end.balance + spec.delta,
      refused,
      kind: attempt.kind,
      at: new Date(),
    };
  }

  /** What follows a won claim: the head learnt, the crash points, the marker (unless fresh) and the head cache. */
  private claimed(
    attempt: LedgerEntryDoc,
    leg: number,
    posting: PostingDoc,
    writeMark: boolean,
  ): { mark: LegMarkDoc; written: Promise<unknown> } {
    this.learnHead(posting.account, posting);
    this.rememberPosting(posting);
    this.failAfterClaim?.(attempt.entryId, leg);
    failpoint('ledger.position-claimed');
    return this.markLeg(attempt, leg, posting, posting.account, writeMark);
  }

  /**
   * Claims the leg's position (or finds the one already claimed for it). Starting from `head` (a head read moments
   * ago), or the head this process knows (if further), the claim goes straight to the next position: the unique
   * insert says when that position is taken, and only then is the chain read on. `lost`: the position after `head`
   * was just claimed by another (read it first).
   */
  private async claimLeg(
    attempt: LedgerEntryDoc,
    leg: number,
    spec: Leg,
    account: string,
    head?: AccountHead,
    lost = false,
  ): Promise<{ mark: LegMarkDoc; written: Promise<unknown> }> {
    await this.requireWallet(spec.walletId);
    const seen = new Map<number, PostingDoc>();
    const known = this.knownHeads.get(account);
    let end = head ?? known ?? (await this.cachedHead(account));
    if (lost) end = await this.readTaken(account, end.seq + 1, seen);
    if (known && known.seq > end.seq) end = known;
    if (!head) end = await this.walkForward(account, end, seen);
    let checkedUpTo = attempt.floors[leg]!;
    for (let round = 0; round < MAX_POST_ATTEMPTS; round++) {
      const earlier = await this.findLegPosting(account, attempt, leg, checkedUpTo + 1, end.seq, seen);
      if (earlier) return this.markLeg(attempt, leg, earlier, account);
      checkedUpTo = Math.max(checkedUpTo, end.seq);

      const balanceAfter = end.balance + spec.delta;
      if (!Number.isSafeInteger(balanceAfter))
        throw serviceError('BALANCE_LIMIT', `balance of ${account} would exceed the largest safe integer`);
      if (end.seq === 0) await this.ensureCurrency(spec.walletId, attempt.currency); // before the chain can exist
      const posting = this.postingAt(attempt, leg, spec, account, end, balanceAfter < 0);
      // A fresh attempt's marker would only spare a walk to whoever finishes the attempt again (after a crash,
      // within the sweeper's staleness); that walk from the floor finds this posting all the same.
      if (await insertFirst(this.postings, posting)) return this.claimed(attempt, leg, posting, !head);
      // Someone else took this position (maybe a poster of this very leg): read what they wrote, check it on the
      // next round and claim the position after it.
      end = await this.readTaken(account, posting.seq, seen);
      if (round > 0) {
        // Lost twice in a row: more likely behind the chain (other processes posted on it while this one remembered
        // an older head) than racing one poster for its end. Read on to the end, where the next claim can win, and
        // back off only when there was nothing further to read (a true race).
        const walked = await this.walkForward(account, end, seen);
        if (walked.seq > end.seq) {
          end = walked;
          continue;
        }
      }
      await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(50, round * 5)));
    }
    throw errors.unavailable(`account ${account} is too contended; retry`);
  }

  /** The posting at a position just found taken (postings are never removed, so it is there to read). */
  private async readTaken(account: string, seq: number, seen: Map<number, PostingDoc>): Promise<AccountHead> {
    const taken = await this.postingAtSeq(account, seq, seen);
    if (!taken) throw new Error(`ledger position ${positionId(account, seq)} was taken, yet it is empty`);
    seen.set(taken.seq, taken);
    this.learnTaken(account, taken);
    return { seq: taken.seq, balance: taken.balanceAfter };
  }

  /** A posting of this attempt's leg at positions from..to, if any (at most one can exist). */
  private async findLegPosting(
    account: string,
    attempt: LedgerEntryDoc,
    leg: number,
    from: number,
    to: number,
    seen: Map<number, PostingDoc>,
  ): Promise<PostingDoc | null> {
    for (let low = from; low <= to; low += CHAIN_READ_BATCH) {
      const seqs = Array.from({ length: Math.min(CHAIN_READ_BATCH, to - low + 1) }, (_, i) => low + i);
      const docs = await Promise.all(seqs.map((seq) => this.postingAtSeq(account, seq, seen)));
      const found = docs.find(
        (p) => p && p.entryId === attempt.entryId && p.attempt === attempt.attempt && p.leg === leg,
      );
      if (found) return found;
    }
    return null;
  }

  /**
   * The leg's marker (a loser's marker names the same posting: there is only one) and, when the posting lands on a
   * multiple of HEAD_CACHE_EVERY, the head cache: both written behind.
   */
  private markLeg(
    attempt: LedgerEntryDoc,
    leg: number,
    posting: PostingDoc,
    account: string,
    writeMark = true,
  ): { mark: LegMarkDoc; written: Promise<unknown> } {
    const mark: LegMarkDoc = {
      _id: `${attempt._id}#${leg}`,
      posting: posting._id,
      refused: posting.refused,
      balanceAfter: posting.balanceAfter,
    };
    const written = Promise.all([
      writeMark ? insertFirst(this.legMarks, mark) : undefined,
      posting.seq % HEAD_CACHE_EVERY === 0
        ? this.cacheHead(account, { seq: posting.seq, balance: posting.balanceAfter })
        : undefined,
    ]);
    written.catch(() => undefined); // awaited by finish; this only keeps an early failure from going unhandled
    return { mark, written };
  }

  private async cachedHead(account: string): Promise<AccountHead> {
    const doc = await this.accounts.findOne({ _id: account });
    return doc ? { seq: doc.seq, balance: doc.balance } : { seq: 0, balance: 0 };
  }

  /** Writes the head cache; a concurrent write may win or be lost, which only makes the next reader walk further. */
  private async cacheHead(account: string, head: AccountHead): Promise<void> {
    try {
      await this.accounts.updateOne(
        { _id: account },
        { $set: { seq: head.seq, balance: head.balance } },
        { upsert: true },
      );
    } catch (err) {
      if (!isDuplicateKey(err)) throw err; // two first upserts: either one is a valid cache
    }
  }

  /**
   * The chain's true end from a position known to exist: the first missing position is the next one to claim. Read
   * one position at a time as far as the head cache may trail (HEAD_CACHE_EVERY), then in parallel batches that
   * double up to CHAIN_READ_BATCH: a process that was away while others posted hundreds of times on the account
   * catches up in a few round trips instead of one per posting.
   */
  private async walkForward(account: string, from: AccountHead, seen: Map<number, PostingDoc>): Promise<AccountHead> {
    let end = from;
    for (let step = 0; ; step++) {
      const width = step < HEAD_CACHE_EVERY ? 1 : Math.min(CHAIN_READ_BATCH, 2 ** (step - HEAD_CACHE_EVERY + 1));
      const seqs = Array.from({ length: width }, (_, i) => end.seq + 1 + i);
      const docs = await Promise.all(seqs.map((seq) => this.postingAtSeq(account, seq, seen)));
      // Chains have no gaps, so the end is just before the first position found missing (one found past it was
      // claimed after that read: a head that trails is still a valid head).
      for (const next of docs) {
        if (!next) {
          if (end.seq > 0) this.learnHead(account, { seq: end.seq, balanceAfter: end.balance });
          return end;
        }
        seen.set(next.seq, next);
        end = { seq: next.seq, balance: next.balanceAfter };
      }
    }
  }

  /**
   * An account's balance: its cached head (or the head this process knows, when further) walked forward to the
   * chain's end; the cache is repaired when it trailed by HEAD_CACHE_EVERY or more (by less is how it is kept).
   */
  private async chainEnd(account: string): Promise<AccountHead> {
    const cached = await this.cachedHead(account);
    const known = this.knownHeads.get(account);
    const end = await this.walkForward(account, known && known.seq > cached.seq ? known : cached, new Map());
    if (end.seq - cached.seq >= HEAD_CACHE_EVERY) await this.cacheHead(account, end);
    return end;
  }

  /**
   * The furthest posting this process has claimed or read, per account: a head that may trail its chain (another
   * process posts on), never lead it, as postings are never removed. Forgotten all at once when this large.
   */
  private readonly knownHeads = new Map<string, AccountHead>();
  private learnHead(account: string, posting: Pick<PostingDoc, 'seq' | 'balanceAfter'>): void {
    const known = this.knownHeads.get(account);
    if (known && known.seq >= posting.seq) return;
    if (!known && this.knownHeads.size >= MEMO_LIMIT) this.knownHeads.clear();
    this.knownHeads.set(account, { seq: posting.seq, balance: posting.balanceAfter });
  }

  /**
   * Postings this process has claimed or read, by `_id`: a posting never changes once inserted, so a position seen
   * once is never read again. Checking that a leg was not posted between its floor and the head costs one read per
   * position otherwise: on one hot account, where a process's own postings pile up between an entry's floor and its
   * claim, that was a read per posting of every entry queued before it (issue 40). Oldest forgotten first.
   */
  private readonly knownPostings = new Map<string, PostingDoc>();
  private rememberPosting(posting: PostingDoc): void {
    if (this.knownPostings.has(posting._id)) return;
    if (this.knownPostings.size >= POSTINGS_REMEMBERED)
      this.knownPostings.delete(this.knownPostings.keys().next().value!);
    this.knownPostings.set(posting._id, posting);
  }

  /** The posting at a position, from this walk, this process's memory, or a read (null: the position is free). */
  private async postingAtSeq(account: string, seq: number, seen: Map<number, PostingDoc>): Promise<PostingDoc | null> {
    const known = seen.get(seq) ?? this.knownPostings.get(positionId(account, seq));
    if (known) return known;
    const doc = await this.postings.findOne({ _id: positionId(account, seq) });
    if (doc) this.rememberPosting(doc);
    return doc;
  }

  /** Per accounts (in leg order), the batch of attempts forming while an earlier one holds their queues. */
  private readonly formingBatches = new Map<string, TogetherBatch>();

  /** Accounts on which this process lost a claim to another poster since it last found them quiet. */
  private readonly contended = new Set<string>();
  private learnTaken(account: string, posting: Pick<PostingDoc, 'seq' | 'balanceAfter'>): void {
    this.learnHead(account, posting);
    remember(this.contended, account);
  }

  /** The heads this process remembers of these accounts (those it knows): what it can report to another process. */
  knownHeadsOf(accounts: string[]): ReportedHead[] {
    return accounts.flatMap((account) => {
      const head = this.knownHeads.get(account);
      return head ? [{ account, seq: head.seq, balance: head.balance }] : [];
    });
  }

  /**
   * Heads another process reported from its own memory (the verify job's, with its answer): each is a posting that
   * exists, so it is a valid head here too. An account it brings this process up to (or past) is no longer read past
   * its head before the next claim, as its other poster's latest posting is now known; a claim that still loses (a
   * third poster) reads on as any other. Anything but whole positive positions and integer balances is ignored.
   */
  learnReportedHeads(heads: unknown): void {
    if (!Array.isArray(heads)) return;
    for (const head of heads as Array<Partial<ReportedHead>>) {
      const { account, seq, balance } = head ?? {};
      if (typeof account !== 'string' || !Number.isSafeInteger(seq) || seq! < 1 || !Number.isSafeInteger(balance))
        continue;
      if ((this.knownHeads.get(account)?.seq ?? 0) > seq!) continue; // this process knows a later one
      this.learnHead(account, { seq: seq!, balanceAfter: balance! });
      this.contended.delete(account);
    }
  }

  // Postings on a wallet that does not exist would belong to nobody: wallets are created before money moves.
  private readonly knownWallets = new Set<string>();
  private async requireWallet(walletId: string): Promise<void> {
    if (this.knownWallets.has(walletId)) return;
    if (!(await this.wallets.findOne({ _id: walletId }))) throw new Error(`wallet ${walletId} does not exist`);
    remember(this.knownWallets, walletId);
  }

  /** Records that the wallet holds this currency, before its first posting in it, so balances can find every chain. */
  private readonly knownCurrencies = new Set<string>();
  private async ensureCurrency(walletId: string, currency: string): Promise<void> {
    const key = `${walletId}|${currency}`;
    if (this.knownCurrencies.has(key)) return;
    for (let n = 1; ; n++) {
      const _id = currencyRecordId(walletId, n);
      const record = await this.walletCurrencies.findOne({ _id });
      if (record?.currency === currency) break;
      if (!record && (await insertFirst(this.walletCurrencies, { _id, walletId, currency }))) break;
      if (!record && (await this.walletCurrencies.findOne({ _id }))?.currency === currency) break; // a twin won n
    }
    remember(this.knownCurrencies, key);
  }

  /** The wallet's currencies in the order it first held them, with their numbers (read until one is missing). */
  async currenciesOf(walletId: string): Promise<Array<{ n: number; currency: string }>> {
    const found: Array<{ n: number; currency: string }> = [];
    for (let n = 1; ; n++) {
      const record = await this.walletCurrencies.findOne({ _id: currencyRecordId(walletId, n) });
      if (!record) return found;
      if (!found.some((f) => f.currency === record.currency)) found.push({ n, currency: record.currency });
    }
  }

  /** One writer per account at a time within this process; other processes are kept apart by the chain itself. */
  private readonly accountQueues = new Map<string, Promise<unknown>>();
  private serialized<T>(account: string, work: () => Promise<T>): Promise<T> {
    const previous = this.accountQueues.get(account) ?? Promise.resolve();
    const run = previous.then(work, work);
    const tail = run.catch(() => undefined);
    this.accountQueues.set(account, tail);
    void tail.then(() => {
      if (this.accountQueues.get(account) === tail) this.accountQueues.delete(account);
    });
    return run;
  }

  /** Balances per currency: the ends of the wallet's chains, read from their cached heads forward. */
  async balances(walletId: string): Promise<Balances> {
    const currencies = (await this.currenciesOf(walletId)).map((c) => c.currency).sort();
    const ends = await Promise.all(
      currencies.map(async (currency) => {
        const [available, escrow] = await Promise.all(
          BUCKETS.map((bucket) => this.chainEnd(accountOf(walletId, currency, bucket))),
        );
        return [currency, { available: available!.balance, escrow: escrow!.balance }] as const;
      }),
    );
    return Object.fromEntries(ends);
  }

  /**
   * A page of the wallet's postings, newest first: its chains merged backwards from their ends (or from the
   * cursor's positions) by time. Refusals moved nothing and are left out. Null when the cursor is not one of ours.
   * The cursor holds a position per chain, so every posting is listed once across pages, whatever is posted meanwhile.
   */
  async listPostings(
    walletId: string,
    limit: number,
    cursor?: string,
  ): Promise<{ items: PostingDoc[]; nextCursor: string | null } | null> {
    const currencies = await this.currenciesOf(walletId);
    const from = cursor === undefined ? null : decodeEntriesCursor(cursor);
    if (from && [...from.keys()].some((key) => !currencies.some((c) => key === `${c.n}a` || key === `${c.n}e`)))
      return null;
    if (cursor !== undefined && !from) return null;
    const batch = Math.ceil((limit + 1) / Math.max(1, currencies.length * BUCKETS.length)) + 1;
    const readers = await Promise.all(
      currencies.flatMap(({ n, currency }) =>
        BUCKETS.map(async (bucket) => {
          const account = accountOf(walletId, currency, bucket);
          // A chain the cursor does not name began after the first page: everything on it is newer than the listing.
          // A cursor position past the chain's end is not one we issued; reading from the end keeps it harmless.
          const end = (await this.chainEnd(account)).seq;
          const start = from ? Math.min(from.get(`${n}${bucket[0]}`) ?? 0, end) : end;
          return new ChainReader(this.postings, n, bucket, account, start, batch);
        }),
      ),
    );
    const newest = async (): Promise<ChainReader | null> => {
      const heads = await Promise.all(readers.map(async (r) => ({ r, p: await r.peek() })));
      let best: { r: ChainReader; p: PostingDoc } | null = null;
      for (const h of heads) {
        if (
          h.p &&
          (!best ||
            h.p.at.getTime() > best.p.at.getTime() ||
            (h.p.at.getTime() === best.p.at.getTime() && h.p._id > best.p._id))
        )
          best = { r: h.r, p: h.p };
      }
      return best?.r ?? null;
    };
    const items: PostingDoc[] = [];
    for (let reader = await newest(); reader; reader = await newest()) {
      const posting = reader.take();
      if (posting.refused) continue;
      if (items.length === limit) {
        // One more real posting exists: the next page starts with it.
        const remaining = readers.map((r) => ({
          n: r.n,
          bucket: r.bucket,
          seq: r === reader ? posting.seq : r.remaining,
        }));
        return { items, nextCursor: encodeEntriesCursor(remaining.filter((r) => r.seq > 0)) };
      }
      items.push(posting);
    }
    return { items, nextCursor: null };
  }

  /**
   * The sweeper's first duty: finishes entries whose apply() died (or is slower than `startedBefore`), oldest first;
   * a refused one counts as finished. Each is looked up by its id. Returns how many it looked at and how many failed.
   */
  async finishStalledEntries(startedBefore: Date, limit: number): Promise<{ looked: number; failed: number }> {
    const started = await this.due.startedBefore(startedBefore, limit);
    let failed = 0;
    for (const { member, entryId, startedAt } of started) {
      const latest = await this.latestAttempt(entryId);
      if (!latest) {
        // Its apply() may be about to insert it; one that has not after the grace period died before it could.
        if (Date.now() - startedAt < ORPHAN_GRACE_MS) await this.due.postpone(member, startedAt + ORPHAN_GRACE_MS);
        else await this.due.entryDone(member);
        continue;
      }
      try {
        await this.finish(latest);
      } catch (err) {
        if (!isInsufficientFunds(err)) {
          failed++;
          await this.due.postpone(member, Date.now() + RETRY_FAILED_AFTER_MS);
          continue;
        }
      }
      await this.due.entryDone(member);
    }
    return { looked: started.length, failed };
  }

  /**
   * Escrow locks not yet checked against their run (see the settle sweeper): applied before `appliedBefore` and at
   * least RUN_GRACE_MS ago, whatever the sweeper's staleness setting, as the locking request stores the run next.
   */
  async locksToReconcile(appliedBefore: Date, limit: number): Promise<LedgerEntryDoc[]> {
    const before = new Date(Math.min(appliedBefore.getTime(), Date.now() - RUN_GRACE_MS));
    const locks: LedgerEntryDoc[] = [];
    for (const entryId of await this.due.locksAppliedBefore(before, limit)) {
      const latest = await this.latestAttempt(entryId);
      // Still being applied: its request (or finishStalledEntries, as its pending marker stands) finishes it first.
      if (latest?.state === 'pending') continue;
      if (latest?.state === 'applied') locks.push(latest);
      else await this.due.lockReconciled(entryId); // refused: nothing was locked
    }
    return locks;
  }

  /**
   * Scores the lock in the lock index at `at`: the sweeper reads the index up to the `appliedBefore` it passes to
   * locksToReconcile, so a caller wanting a look at time T scores T less that lag (services/escrow.ts does).
   */
  async checkLockAt(entryId: string, at: Date): Promise<void> {
    await this.due.lockCheckAt(entryId, at);
  }

  /**
   * The lock's reserve was captured: nothing left for the sweeper to decide. Only the index entry goes (one Redis
   * command on the settlement's path); the entry's `reconciled` hint stays unset, so a rare index audit may put it
   * back, and the sweeper then finds the fate decided and marks it.
   */
  async lockSettled(entryId: string): Promise<void> {
    await this.due.lockReconciled(entryId);
  }

  /** The lock's reserve is decided (or its run exists and the check is done): nothing for the sweeper to return. */
  async markReconciled(entryId: string): Promise<void> {
    const lock = await this.latestAttempt(entryId);
    if (lock) await this.entries.updateOne({ _id: lock._id }, { $set: { reconciled: true } });
    await this.due.lockReconciled(entryId);
  }

  /**
   * Rebuilds the due index from the entries in case Redis lost writes: scans ledger_entries (the one scan in the
   * ledger), so it runs at most once per AUDIT_EVERY_MS across all processes and reads at most AUDIT_LIMIT of each
   * kind. Null when another process audited recently; else what it put back (already indexed items are kept).
   */
  async auditDueIndex(): Promise<{ pending: number; locks: number } | null> {
    if (!(await this.due.claimAudit(AUDIT_EVERY_MS))) return null;
    const projection = { entryId: 1, createdAt: 1 };
    const pending = await this.entries
      .find({ state: 'pending' }, { projection, comment: RECONCILIATION_COMMENT })
      .limit(AUDIT_LIMIT)
      .toArray();
    const locks = await this.entries
      .find(
        { kind: RECONCILED_KIND, state: 'applied', reconciled: { $ne: true } },
        { projection, comment: RECONCILIATION_COMMENT },
      )
      .limit(AUDIT_LIMIT)
      .toArray();
    await this.due.restore(pending, locks);
    return { pending: pending.length, locks: locks.length };
  }

  /** Lets the next sweep rebuild the due index at once (after Redis lost writes). */
  forgetDueAuditClaim(): Promise<void> {
    return this.due.forgetAuditClaim();
  }

  /** Which of these entries have been applied in full. */
  async appliedAmong(entryIds: string[]): Promise<Set<string>> {
    const latest = await Promise.all(entryIds.map((id) => this.latestAttempt(id)));
    return new Set(latest.filter((d) => d?.state === 'applied').map((d) => d!.entryId));
  }

  /** The entry's latest attempt. */
  getEntry(entryId: string): Promise<LedgerEntryDoc | null> {
    return this.latestAttempt(entryId);
  }

  /** Whether the entry's first attempt (`_id` = the entry id) is applied: for entries never retried, like a gate's lock. */
  async firstAttemptApplied(entryId: string): Promise<boolean> {
    return (await this.entries.findOne({ _id: entryId }, { projection: { state: 1 } }))?.state === 'applied';
  }
}
