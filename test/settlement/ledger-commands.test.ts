import { MongoClient, type CommandStartedEvent } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Runtime } from '../../src/runtime.ts';
import { LedgerDueIndex } from '../../src/store/ledger-due.ts';
import { LedgerStore, RUN_GRACE_MS, type NewLedgerEntry } from '../../src/store/ledger.ts';
import { createSettleProcessor } from '../../src/workers/settle.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

// On FerretDB only a filter that is exactly {_id: <string>} uses an index; anything else reads the whole
// collection. This watches what the ledger sends to MongoDB and refuses any other filter on its collections.
const LEDGER_COLLECTIONS = new Set([
  'wallets',
  'wallet_currencies',
  'ledger_accounts',
  'ledger_postings',
  'ledger_legs',
  'ledger_entries',
]);
const FILTERS_OF: Record<string, (command: Record<string, any>) => unknown[]> = {
  find: (c) => [c.filter],
  update: (c) => (c.updates as Array<{ q: unknown }>).map((u) => u.q),
  delete: (c) => (c.deletes as Array<{ q: unknown }>).map((d) => d.q),
  insert: () => [],
};

function isExactIdFilter(filter: unknown): boolean {
  return (
    typeof filter === 'object' &&
    filter !== null &&
    Object.keys(filter).length === 1 &&
    typeof (filter as { _id?: unknown })._id === 'string'
  );
}

class Crash extends Error {}

describe('ledger commands: exact _id filters only (what FerretDB can serve from its index)', () => {
  let t: TestApp;
  let client: MongoClient;
  let ledger: LedgerStore;
  let commands: CommandStartedEvent[] = [];
  beforeAll(async () => {
    t = await startTestApp({ overrides: { SWEEP_STALE_AFTER_MS: '0' } });
    client = new MongoClient(t.config.mongoUrl, { monitorCommands: true });
    client.on('commandStarted', (e) => commands.push(e));
    await client.connect();
    ledger = new LedgerStore(client.db(t.config.mongoDb), new LedgerDueIndex(t.runtime.redis, t.config.redisPrefix));
  });
  afterAll(async () => {
    await client.close();
    await t.close();
  });

  const ledgerCommands = () =>
    commands.filter((e) => LEDGER_COLLECTIONS.has(String(e.command[e.commandName] ?? e.command.collection)));
  /** Every ledger command that is not an insert or an exact-_id find, update or delete. */
  const scans = () =>
    ledgerCommands()
      .filter((e) => !FILTERS_OF[e.commandName] || !FILTERS_OF[e.commandName]!(e.command).every(isExactIdFilter))
      .map((e) => ({
        command: e.commandName,
        collection: e.command[e.commandName],
        filter: e.command.filter ?? e.command.query ?? e.command.updates ?? e.command.deletes ?? null,
      }));

  const credit = (walletId: string, id: string, amount: number, currency: string): NewLedgerEntry => ({
    _id: id,
    tenantId: 'ten_a',
    kind: 'credit',
    currency,
    legs: [{ walletId, bucket: 'available', delta: amount }],
    ref: {},
  });
  const lock = (walletId: string, runId: string, amount: number): NewLedgerEntry => ({
    _id: `escrow:${runId}:lock`,
    tenantId: 'ten_a',
    kind: 'escrow_lock',
    currency: 'USD',
    legs: [
      { walletId, bucket: 'available', delta: -amount },
      { walletId, bucket: 'escrow', delta: amount },
    ],
    ref: { runId },
  });

  it('applies, resumes, reads balances, lists entries and sweeps due work by _id alone', async () => {
    // The audit (the ledger's one scan, at most once per period for all processes) has had its turn.
    expect(await ledger.auditDueIndex()).not.toBeNull();
    commands = [];

    await ledger.ensureWallet('payer', 'ten_a', 'agent');
    await ledger.apply(credit('payer', 'credit:payer:usd', 1_000, 'USD'));
    await ledger.apply(credit('payer', 'credit:payer:eur', 500, 'EUR'));
    await ledger.apply(lock('payer', 'run_kept', 100));
    // A lock whose request died between its legs, and whose run was never stored.
    ledger.failAfterLeg = () => {
      throw new Crash('killed between legs');
    };
    await expect(ledger.apply(lock('payer', 'run_lost', 200))).rejects.toBeInstanceOf(Crash);
    ledger.failAfterLeg = null;
    await expect(ledger.apply(lock('payer', 'run_refused', 5_000))).rejects.toMatchObject({
      code: 'INSUFFICIENT_FUNDS',
    });

    const before = commands.length;
    await ledger.apply(credit('payer', 'credit:payer:usd', 1_000, 'USD'));
    expect(commands.length - before).toBe(1); // an applied entry: one read

    expect(await ledger.balances('payer')).toEqual({
      EUR: { available: 500, escrow: 0 },
      USD: { available: 700, escrow: 100 },
    });
    const first = (await ledger.listPostings('payer', 2))!;
    const second = (await ledger.listPostings('payer', 10, first.nextCursor!))!;
    expect(first.items.length + second.items.length).toBe(5); // 2 credits, a lock, the lost lock's first leg; no refusal

    // The sweeper, through the settle processor, on a runtime whose ledger is the watched one.
    const runtime: Runtime = { ...t.runtime, stores: { ...t.runtime.stores, ledger } };
    await ledger.markReconciled('escrow:run_kept:lock'); // as the run route does once the run is stored
    const sweep = createSettleProcessor(runtime).sweep!;
    // The first sweep finishes the lost lock; the next finds it applied (before that sweep began) and run-less.
    expect(await sweep()).toMatchObject({ entries: 1, locksChecked: 0 });
    await new Promise((resolve) => setTimeout(resolve, RUN_GRACE_MS + 100));
    expect(await sweep()).toMatchObject({ entries: 0, locksChecked: 1, unlocked: 1 });
    expect(await sweep()).toMatchObject({ entries: 0, locksChecked: 0, unlocked: 0 });
    await ledger.resume('escrow:run_lost:lock');
    await ledger.getEntry('escrow:run_refused:lock');
    expect(await ledger.balances('payer')).toEqual({
      EUR: { available: 500, escrow: 0 },
      USD: { available: 900, escrow: 100 },
    });

    expect(ledgerCommands().length).toBeGreaterThan(50);
    expect(scans()).toEqual([]);
  });

  it("claims a fresh entry's debit and all its credits in one insert (a metered release: to the payee, the rest back)", async () => {
    await Promise.all(['split-payer', 'split-payee'].map((w) => ledger.ensureWallet(w, 'ten_a', 'agent')));
    await ledger.apply(credit('split-payer', 'credit:split-payer', 1_000, 'USD'));
    await ledger.apply(credit('split-payee', 'credit:split-payee', 1, 'USD'));
    await ledger.apply(lock('split-payer', 'run_split', 300));
    commands = [];
    const release: NewLedgerEntry = {
      _id: 'release:split',
      tenantId: 'ten_a',
      kind: 'settlement_release',
      currency: 'USD',
      ref: {},
      legs: [
        { walletId: 'split-payer', bucket: 'escrow', delta: -300 },
        { walletId: 'split-payee', bucket: 'available', delta: 180 },
        { walletId: 'split-payer', bucket: 'available', delta: 120 },
      ],
    };
    await ledger.apply(release, { expectNew: true });
    expect(
      ledgerCommands().filter((e) => e.commandName === 'insert' && e.command.insert === 'ledger_postings'),
    ).toHaveLength(1);
    expect(await ledger.balances('split-payer')).toEqual({ USD: { available: 820, escrow: 0 } });
    expect(await ledger.balances('split-payee')).toEqual({ USD: { available: 181, escrow: 0 } });
    // Applied again (a retried job), it moves nothing more.
    await ledger.apply(release);
    expect(await ledger.balances('split-payer')).toEqual({ USD: { available: 820, escrow: 0 } });
  });
});
