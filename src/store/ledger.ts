import type { Collection, Db } from 'mongodb';
import { errors, ServiceError } from '../domain/errors.ts';
import { insertFirst } from './mongo.ts';

export type Bucket = 'available' | 'escrow';

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

/**
 * The head of one account's postings chain (wallet x currency x bucket): a cache of its last posting. It lives in
 * its own document so that writers of different accounts never touch the same document, and it is repaired from
 * the postings whenever it trails them.
 */
export interface AccountDoc {
  _id: string;
  walletId: string;
  currency: string;
  bucket: Bucket;
  seq: number;
  balance: number;
}

export type Balances = Record<string, { available: number; escrow: number }>;

/**
 * One change to one account. Its id is `entryId#leg`, so a leg can be posted once whatever happens; the unique
 * index on (account, seq) lets exactly one posting hold each position of the account's chain.
 */
export interface PostingDoc {
  _id: string;
  account: string;
  walletId: string;
  currency: string;
  bucket: Bucket;
  seq: number;
  entryId: string;
  leg: number;
  delta: number;
  balanceAfter: number;
  kind: string;
  at: Date;
}

export interface Leg {
  walletId: string;
  bucket: Bucket;
  delta: number;
}

/**
 * A balance change, recorded before it is applied: a crash leaves it `pending` and the sweeper finishes it. Only the
 * first leg may debit, so an entry is refused whole (insufficient funds) or applies whole.
 */
export interface LedgerEntryDoc {
  _id: string;
  tenantId: string;
  kind: string;
  currency: string;
  legs: Leg[];
  state: 'pending' | 'applied' | 'rejected';
  ref: Record<string, string>;
  createdAt: Date;
  settledAt: Date | null;
}

const MAX_POST_ATTEMPTS = 200;

function legId(entryId: string, leg: number): string {
  return `${entryId}#${leg}`;
}

function accountOf(walletId: string, currency: string, bucket: Bucket): string {
  return `${walletId}|${currency}|${bucket}`;
}

function insufficientFunds(walletId: string, currency: string, needed: number, available: number) {
  return new ServiceError(402, 'INSUFFICIENT_FUNDS', `wallet ${walletId} cannot cover ${needed} ${currency}`, {
    walletId,
    currency,
    needed,
    available,
  });
}

/**
 * The ledger without transactions: every leg of an entry is a posting on its account's chain, at most once (unique
 * entryId+leg), in order (unique account+seq). Balances are the running balance of each chain's last posting.
 */
export class LedgerStore {
  /** Fault injection for tests: called after each leg is posted; throwing there simulates a crash between legs. */
  failAfterLeg: ((entryId: string, leg: number) => void) | null = null;
  readonly wallets: Collection<WalletDoc>;
  readonly accounts: Collection<AccountDoc>;
  readonly postings: Collection<PostingDoc>;
  readonly entries: Collection<LedgerEntryDoc>;

  constructor(db: Db) {
    this.wallets = db.collection<WalletDoc>('wallets');
    this.accounts = db.collection<AccountDoc>('ledger_accounts');
    this.postings = db.collection<PostingDoc>('ledger_postings');
    this.entries = db.collection<LedgerEntryDoc>('ledger_entries');
  }

  async ensureWallet(walletId: string, tenantId: string, kind: WalletDoc['kind']): Promise<WalletDoc> {
    await insertFirst(this.wallets, { _id: walletId, tenantId, kind, createdAt: new Date() }); // or it already exists
    return (await this.wallets.findOne({ _id: walletId }))!;
  }

  getWallet(walletId: string): Promise<WalletDoc | null> {
    return this.wallets.findOne({ _id: walletId });
  }

  /**
   * Records and applies an entry once; a repeat (or a retry after a crash) finishes what is missing and returns
   * the same outcome. Throws 402 INSUFFICIENT_FUNDS when its debit cannot be covered (and records the refusal).
   */
  async apply(entry: Omit<LedgerEntryDoc, 'state' | 'createdAt' | 'settledAt'>): Promise<LedgerEntryDoc> {
    for (const [i, leg] of entry.legs.entries()) {
      if (!Number.isSafeInteger(leg.delta) || leg.delta === 0) throw new Error(`entry ${entry._id} leg ${i}: delta must be a non-zero integer`);
      if (i > 0 && leg.delta < 0) throw new Error(`entry ${entry._id}: only the first leg may debit`);
    }
    if (entry.legs.reduce((sum, l) => sum + l.delta, 0) !== 0 && entry.kind !== 'credit') {
      throw new Error(`entry ${entry._id} does not balance`);
    }
    const existing = await this.entries.findOne({ _id: entry._id });
    if (existing?.state === 'applied') return existing; // the common repeat: one read
    // A refused entry moved nothing, so a later attempt under the same id (say, after a top-up) may replace it.
    if (existing?.state === 'rejected') await this.entries.deleteOne({ _id: entry._id, state: 'rejected' });
    if (!existing || existing.state === 'rejected') {
      // Losing means a concurrent attempt recorded it first: finish that one.
      await insertFirst(this.entries, { ...entry, state: 'pending', createdAt: new Date(), settledAt: null });
    }
    return this.resume(entry._id);
  }

  /** Finishes a recorded entry (what apply does after recording it; the sweeper calls it for pending entries). */
  async resume(entryId: string): Promise<LedgerEntryDoc> {
    const entry = await this.entries.findOne({ _id: entryId });
    if (!entry) throw new Error(`ledger entry ${entryId} not found`);
    if (entry.state === 'rejected') {
      const debit = entry.legs[0]!;
      const head = await this.head(accountOf(debit.walletId, entry.currency, debit.bucket));
      throw insufficientFunds(debit.walletId, entry.currency, -debit.delta, head.balance);
    }
    if (entry.state === 'applied') return entry;
    for (const [leg, spec] of entry.legs.entries()) {
      try {
        await this.post(entry, leg, spec);
        this.failAfterLeg?.(entryId, leg);
      } catch (err) {
        if (leg === 0 && err instanceof ServiceError && err.code === 'INSUFFICIENT_FUNDS') {
          await this.entries.updateOne({ _id: entryId, state: 'pending' }, { $set: { state: 'rejected', settledAt: new Date() } });
          throw err;
        }
        throw err;
      }
    }
    const settledAt = new Date();
    await this.entries.updateOne({ _id: entryId, state: 'pending' }, { $set: { state: 'applied', settledAt } });
    return { ...entry, state: 'applied', settledAt };
  }

  private async head(account: string): Promise<AccountHead> {
    const doc = await this.accounts.findOne({ _id: account });
    return doc ? { seq: doc.seq, balance: doc.balance } : { seq: 0, balance: 0 };
  }

  /** Moves an account head from `from` to `to` if it still stands at `from` (creating it at the first posting). */
  private async moveHead(account: string, spec: { walletId: string; currency: string; bucket: Bucket }, from: AccountHead, to: AccountHead): Promise<void> {
    if (from.seq === 0 && (await insertFirst(this.accounts, { _id: account, ...spec, seq: to.seq, balance: to.balance }))) return;
    await this.accounts.updateOne({ _id: account, seq: from.seq }, { $set: { seq: to.seq, balance: to.balance } });
  }

  private readonly knownWallets = new Set<string>();

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

  /** Puts one leg on its account's chain exactly once. */
  private async post(entry: LedgerEntryDoc, leg: number, spec: Leg): Promise<void> {
    const { currency } = entry;
    const account = accountOf(spec.walletId, currency, spec.bucket);
    const where = { walletId: spec.walletId, currency, bucket: spec.bucket };
    await this.serialized(account, async (): Promise<void> => {
      // Postings on a wallet that does not exist would belong to nobody: wallets are created before money moves.
      // Wallets are never deleted, so one that was seen once need not be looked up again.
      if (!this.knownWallets.has(spec.walletId)) {
        if (!(await this.wallets.findOne({ _id: spec.walletId }))) throw new Error(`wallet ${spec.walletId} does not exist`);
        this.knownWallets.add(spec.walletId);
      }
      for (let attempt = 0; attempt < MAX_POST_ATTEMPTS; attempt++) {
        const head = await this.head(account);
        const balanceAfter = head.balance + spec.delta;
        if (balanceAfter < 0 || !Number.isSafeInteger(balanceAfter)) {
          if (await this.postings.findOne({ _id: legId(entry._id, leg) })) {
            await this.repairHead(account, where);
            return;
          }
          // The cached head may trail a crashed writer's credit: repair, and refuse only on the true balance.
          const truth = await this.repairHead(account, where);
          if (truth.seq !== head.seq) continue;
          if (balanceAfter < 0) throw insufficientFunds(spec.walletId, currency, -spec.delta, head.balance);
          throw new ServiceError(409, 'BALANCE_LIMIT', `balance of ${account} would exceed the largest safe integer`);
        }
        const seq = head.seq + 1;
        const posted = await insertFirst(this.postings, { _id: legId(entry._id, leg), account, ...where, seq, entryId: entry._id, leg, delta: spec.delta, balanceAfter, kind: entry.kind, at: new Date() });
        if (!posted) {
          // Either this leg is already on the chain, or another entry took this position first.
          if (await this.postings.findOne({ _id: legId(entry._id, leg) })) {
            await this.repairHead(account, where);
            return;
          }
          await this.repairHead(account, where);
          await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(50, attempt * 5)));
          continue;
        }
        // If this loses, a repair already moved the head over this posting.
        await this.moveHead(account, where, head, { seq, balance: balanceAfter });
        return;
      }
      throw errors.unavailable(`account ${account} is too contended; retry`);
    });
  }

  /** Moves a cached head forward over postings it trails (a writer that died, or a lost cache write). */
  async repairHead(account: string, where: { walletId: string; currency: string; bucket: Bucket }): Promise<AccountHead> {
    for (;;) {
      const head = await this.head(account);
      const next = await this.postings.findOne({ account, seq: head.seq + 1 });
      if (!next) return head;
      await this.moveHead(account, where, head, { seq: next.seq, balance: next.balanceAfter });
    }
  }

  /** Balances per currency, every account head repaired first, so what is shown is what the postings say. */
  async balances(walletId: string): Promise<Balances> {
    const accounts = await this.postings.distinct('account', { walletId });
    const balances: Balances = {};
    for (const account of accounts.sort()) {
      const [, currency, bucket] = account.split('|') as [string, string, Bucket];
      const head = await this.repairHead(account, { walletId, currency, bucket });
      balances[currency] ??= { available: 0, escrow: 0 };
      balances[currency][bucket] = head.balance;
    }
    return balances;
  }

  /** Postings of a wallet, newest first, paged by a cursor of "<at ms>:<posting id>". */
  async listPostings(walletId: string, limit: number, cursor?: { at: Date; id: string }): Promise<PostingDoc[]> {
    const filter = cursor
      ? { walletId, $or: [{ at: { $lt: cursor.at } }, { at: cursor.at, _id: { $lt: cursor.id } }] }
      : { walletId };
    return this.postings.find(filter).sort({ at: -1, _id: -1 }).limit(limit).toArray();
  }

  pendingEntries(olderThan: Date, limit: number): Promise<LedgerEntryDoc[]> {
    return this.entries.find({ state: 'pending', createdAt: { $lt: olderThan } }).limit(limit).toArray();
  }

  /** Applied escrow locks not yet checked against their run (see the settle sweeper). */
  unreconciledLocks(olderThan: Date, limit: number): Promise<LedgerEntryDoc[]> {
    return this.entries.find({ kind: 'escrow_lock', state: 'applied', reconciled: { $ne: true }, createdAt: { $lt: olderThan } } as never).limit(limit).toArray();
  }

  async markReconciled(entryId: string): Promise<void> {
    await this.entries.updateOne({ _id: entryId }, { $set: { reconciled: true } as never });
  }

  /** Which of these entries have been applied in full. */
  async appliedAmong(entryIds: string[]): Promise<Set<string>> {
    // One lookup by id each: on FerretDB an id lookup is far cheaper than any other filter.
    const docs = await Promise.all(entryIds.map((_id) => this.entries.findOne({ _id }, { projection: { state: 1 } })));
    return new Set(docs.filter((d) => d?.state === 'applied').map((d) => d!._id));
  }

  getEntry(entryId: string): Promise<LedgerEntryDoc | null> {
    return this.entries.findOne({ _id: entryId });
  }
}
