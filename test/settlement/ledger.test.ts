import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ServiceError } from '../../src/domain/errors.ts';
import { armFailpoint, disarmFailpoints, FailpointCrash } from '../../src/domain/failpoints.ts';
import { LedgerDueIndex } from '../../src/store/ledger-due.ts';
import {
  LedgerStore,
  RUN_GRACE_MS,
  type Bucket,
  type NewLedgerEntry,
  type PostingDoc,
} from '../../src/store/ledger.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

class Crash extends Error {}
/** Dozens of racing entries take seconds alone, far longer on a loaded 2-core CI machine. */
const RACE_TIMEOUT_MS = 120_000;

describe('ledger postings (real FerretDB/MongoDB, no transactions)', () => {
  let t: TestApp;
  /** A second "process": its own store (own per-account queue and memos) on the same servers. */
  let other: LedgerStore;
  beforeAll(async () => {
    t = await startTestApp();
    other = new LedgerStore(t.runtime.db, new LedgerDueIndex(t.runtime.redis, t.config.redisPrefix));
  });
  afterAll(() => t.close());
  afterEach(() => disarmFailpoints());

  // Verification reads the whole chain by its fields: a test may scan, the store never does.
  const chainOf = async (walletId: string, currency: string, bucket: Bucket) =>
    (await t.runtime.stores.ledger.postings.find({ walletId, currency, bucket }).toArray()).sort(
      (a, b) => a.seq - b.seq,
    );
  const expectSound = (chain: PostingDoc[]) => {
    let running = 0;
    chain.forEach((p, i) => {
      running += p.delta;
      expect(p.seq).toBe(i + 1);
      expect(p.balanceAfter).toBe(running);
      expect(p.balanceAfter).toBeGreaterThanOrEqual(0);
    });
  };
  const credit = (walletId: string, id: string, amount: number, currency = 'USD'): NewLedgerEntry => ({
    _id: id,
    tenantId: 'ten_a',
    kind: 'credit',
    currency,
    legs: [{ walletId, bucket: 'available', delta: amount }],
    ref: {},
  });
  const lock = (walletId: string, id: string, amount: number, currency = 'USD'): NewLedgerEntry => ({
    _id: id,
    tenantId: 'ten_a',
    kind: 'escrow_lock',
    currency,
    legs: [
      { walletId, bucket: 'available', delta: -amount },
      { walletId, bucket: 'escrow', delta: amount },
    ],
    ref: { runId: `run_${id}` },
  });
  const postedLegs = (chain: PostingDoc[]) =>
    chain.filter((p) => !p.refused).map((p) => `${p.entryId}#${p.attempt}#${p.leg}`);

  it('applies an entry once however often it is applied, and heads match their chains', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w1', 'ten_a', 'sponsor');
    await Promise.all([
      ledger.apply(credit('w1', 'credit:w1:1', 100)),
      ledger.apply(credit('w1', 'credit:w1:1', 100)),
      other.apply(credit('w1', 'credit:w1:1', 100)),
    ]);
    expect(await ledger.balances('w1')).toEqual({ USD: { available: 100, escrow: 0 } });
    expect(await chainOf('w1', 'USD', 'available')).toHaveLength(1);
  });

  it(
    'serialises many concurrent entries on one account, refusing what the balance cannot cover',
    async () => {
      const { ledger } = t.runtime.stores;
      await ledger.ensureWallet('w2', 'ten_a', 'sponsor');
      await ledger.apply(credit('w2', 'credit:w2', 1_000));
      const outcomes = await Promise.allSettled(
        Array.from({ length: 30 }, (_, i) => (i % 2 ? other : ledger).apply(lock('w2', `lock:w2:${i}`, 50))),
      );
      expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(20);
      for (const o of outcomes)
        if (o.status === 'rejected') expect((o.reason as ServiceError).code).toBe('INSUFFICIENT_FUNDS');
      expect(await ledger.balances('w2')).toEqual({ USD: { available: 0, escrow: 1_000 } });
      const available = await chainOf('w2', 'USD', 'available');
      expectSound(available);
      expect(available.filter((p) => !p.refused)).toHaveLength(21);
      expect(available.filter((p) => p.refused)).toHaveLength(10); // each refusal holds the position it was judged at
      expect((await chainOf('w2', 'USD', 'escrow')).map((p) => p.seq)).toEqual(
        Array.from({ length: 20 }, (_, i) => i + 1),
      );
      for (const o of outcomes.entries()) {
        expect((await ledger.getEntry(`lock:w2:${o[0]}`))!.state).toBe(
          o[1].status === 'fulfilled' ? 'applied' : 'rejected',
        );
      }
    },
    RACE_TIMEOUT_MS,
  );

  it(
    'posts each leg once when two stores post the same entries at once',
    async () => {
      const { ledger } = t.runtime.stores;
      await ledger.ensureWallet('w-race', 'ten_a', 'sponsor');
      await ledger.apply(credit('w-race', 'credit:w-race', 10_000));
      const ids = Array.from({ length: 12 }, (_, i) => `lock:race:${i}`);
      await Promise.all(
        ids.flatMap((id) => [
          ledger.apply(lock('w-race', id, 100)),
          other.apply(lock('w-race', id, 100)),
          other.resume(id).catch(() => undefined),
        ]),
      );
      const available = await chainOf('w-race', 'USD', 'available');
      const escrow = await chainOf('w-race', 'USD', 'escrow');
      expectSound(available);
      expectSound(escrow);
      const legs = [...postedLegs(available), ...postedLegs(escrow)];
      expect(new Set(legs).size).toBe(legs.length);
      expect(legs).toHaveLength(1 + 2 * ids.length);
      expect(await other.balances('w-race')).toEqual({ USD: { available: 10_000 - 1_200, escrow: 1_200 } });
    },
    RACE_TIMEOUT_MS,
  );

  it(
    'keeps balances exact under 40 racing credits and debits on one account from two stores',
    async () => {
      const { ledger } = t.runtime.stores;
      await ledger.ensureWallet('w-mixed', 'ten_a', 'sponsor');
      await ledger.apply(credit('w-mixed', 'credit:w-mixed:seed', 500));
      const work = Array.from({ length: 40 }, (_, i) => {
        const store = i % 3 === 0 ? other : ledger;
        return i % 2
          ? store.apply(credit('w-mixed', `credit:w-mixed:${i}`, 7 + i))
          : store.apply(lock('w-mixed', `lock:w-mixed:${i}`, 30 + i));
      });
      const outcomes = await Promise.allSettled(work);
      let available = 500;
      let escrow = 0;
      outcomes.forEach((o, i) => {
        if (o.status === 'rejected') return expect((o.reason as ServiceError).code).toBe('INSUFFICIENT_FUNDS');
        if (i % 2) available += 7 + i;
        else {
          available -= 30 + i;
          escrow += 30 + i;
        }
      });
      expect(await ledger.balances('w-mixed')).toEqual({ USD: { available, escrow } });
      expectSound(await chainOf('w-mixed', 'USD', 'available'));
      expectSound(await chainOf('w-mixed', 'USD', 'escrow'));
    },
    RACE_TIMEOUT_MS,
  );

  it(
    'posts from a process that was away while another posted on the account hundreds of times',
    async () => {
      // An API process that locked a payer's escrow once, while other processes locked and released it 250 times: it
      // still remembers the old head. It used to step one position per lost claim, sleeping between, and gave up after
      // 200 with a 503 (a verify job took seconds behind a payer's earlier creates).
      const { ledger } = t.runtime.stores;
      await ledger.ensureWallet('w-away', 'ten_a', 'sponsor');
      await other.apply(credit('w-away', 'credit:w-away:first', 1));
      for (let i = 0; i < 250; i += 25)
        await Promise.all(
          Array.from({ length: 25 }, (_, k) => ledger.apply(credit('w-away', `credit:w-away:${i + k}`, 2))),
        );
      const late = await other.apply(credit('w-away', 'credit:w-away:late', 5));
      expect(late.state).toBe('applied');
      expect(await other.balances('w-away')).toEqual({ USD: { available: 1 + 250 * 2 + 5, escrow: 0 } });
      const chain = await chainOf('w-away', 'USD', 'available');
      expectSound(chain);
      expect(chain).toHaveLength(252);
      expect(chain.at(-1)!.entryId).toBe('credit:w-away:late');
    },
    RACE_TIMEOUT_MS,
  );

  it('repairs a crash between a position claim and its leg marker without posting twice', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w3', 'ten_a', 'sponsor');
    await ledger.apply(credit('w3', 'credit:w3:1', 10));
    other.failAfterClaim = () => {
      throw new Crash('killed after the claim');
    };
    await expect(other.apply(credit('w3', 'credit:w3:2', 5))).rejects.toBeInstanceOf(Crash);
    other.failAfterClaim = null;
    // The dead writer's posting holds position 2; no marker, and the head cache (written every few positions) and this
    // store's own head (position 1, its credit) both trail it.
    expect(await ledger.legMarks.findOne({ _id: 'credit:w3:2#0' })).toBeNull();
    expect((await ledger.accounts.findOne({ _id: 'w3|USD|available' }))?.seq ?? 0).toBeLessThan(2);
    // A debit the stale head could not cover (10 < 12) but the chain can (15); then the crashed entry is finished.
    await ledger.apply(lock('w3', 'spend:w3', 12));
    await Promise.all([ledger.resume('credit:w3:2'), other.apply(credit('w3', 'credit:w3:2', 5))]);
    expect(await ledger.balances('w3')).toEqual({ USD: { available: 3, escrow: 12 } });
    const chain = await chainOf('w3', 'USD', 'available');
    expectSound(chain);
    expect(chain.map((p) => p.entryId)).toEqual(['credit:w3:1', 'credit:w3:2', 'spend:w3']);
    expect(await ledger.legMarks.findOne({ _id: 'credit:w3:2#0' })).toMatchObject({
      posting: 'w3|USD|available#2',
      refused: false,
    });
    expect((await ledger.getEntry('credit:w3:2'))!.state).toBe('applied');
  });

  it('finishes an entry that died between its legs from the due index, and rebuilds that index when Redis lost it', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w4', 'ten_a', 'sponsor');
    await ledger.apply(credit('w4', 'credit:w4', 100));
    other.failAfterLeg = (_entry, leg) => {
      if (leg === 0) throw new Crash('killed between legs');
    };
    await expect(other.apply(lock('w4', 'lock:w4', 40))).rejects.toBeInstanceOf(Crash);
    other.failAfterLeg = null;
    expect(await ledger.balances('w4')).toEqual({ USD: { available: 60, escrow: 0 } });

    // Redis forgot everything due (and the audit claim): the audit finds the entry again, the sweep finishes it.
    await t.runtime.redis.del(
      `${t.config.redisPrefix}:{ledger}:pending`,
      `${t.config.redisPrefix}:{ledger}:locks`,
      `${t.config.redisPrefix}:{ledger}:audit`,
    );
    expect(await ledger.finishStalledEntries(new Date(), 100)).toEqual({ looked: 0, failed: 0 });
    expect(await ledger.auditDueIndex()).toMatchObject({ pending: 1 });
    expect(await ledger.auditDueIndex()).toBeNull(); // one audit per period, whoever asks
    expect(await ledger.finishStalledEntries(new Date(), 100)).toEqual({ looked: 1, failed: 0 });
    expect(await ledger.balances('w4')).toEqual({ USD: { available: 60, escrow: 40 } });
    expect((await ledger.getEntry('lock:w4'))!.state).toBe('applied');
    expect(await ledger.finishStalledEntries(new Date(), 100)).toEqual({ looked: 0, failed: 0 });
    // The finished lock waits for its run check (once its request had time to store the run) until markReconciled.
    await new Promise((resolve) => setTimeout(resolve, RUN_GRACE_MS + 100));
    const lockIds = async () => (await ledger.locksToReconcile(new Date(), 1_000)).map((l) => l.entryId);
    expect(await lockIds()).toContain('lock:w4');
    await ledger.markReconciled('lock:w4');
    expect(await lockIds()).not.toContain('lock:w4');
  });

  // A metered release: the escrow debit, the payee's share and the rest back to the payer, claimed in one ordered
  // insert. The process dies right after that insert: with every leg landed, or with the last one's position found
  // taken (its store remembered a head another process had moved on), so only the debit and the first credit landed.
  for (const lastPositionTaken of [false, true]) {
    it(`finishes a three-leg entry that died right after its one-insert claim${lastPositionTaken ? ' landed two of its legs' : ''}, each leg once`, async () => {
      const { ledger } = t.runtime.stores;
      const payer = `w3l-payer-${lastPositionTaken}`;
      const payee = `w3l-payee-${lastPositionTaken}`;
      await ledger.ensureWallet(payer, 'ten_a', 'agent');
      await ledger.ensureWallet(payee, 'ten_a', 'agent');
      // Posted through `other`, so that it remembers every head the release starts from (nothing to read first).
      await other.apply(credit(payer, `credit:${payer}`, 1_000));
      await other.apply(lock(payer, `lock:${payer}`, 1_000));
      await other.apply(credit(payee, `credit:${payee}`, 1));
      if (lastPositionTaken) await ledger.apply(credit(payer, `credit:${payer}:late`, 5)); // unknown to `other`
      const release: NewLedgerEntry = {
        _id: `release:${payer}`,
        tenantId: 'ten_a',
        kind: 'x402_release',
        currency: 'USD',
        legs: [
          { walletId: payer, bucket: 'escrow', delta: -1_000 },
          { walletId: payee, bucket: 'available', delta: 370 },
          { walletId: payer, bucket: 'available', delta: 630 },
        ],
        ref: {},
      };
      armFailpoint('ledger.position-claimed');
      await expect(other.apply(release)).rejects.toBeInstanceOf(FailpointCrash);
      const landed = await ledger.postings.find({ entryId: release._id }).toArray();
      expect(landed.map((p) => p.leg).sort()).toEqual(lastPositionTaken ? [0, 1] : [0, 1, 2]);
      expect((await ledger.getEntry(release._id))!.state).toBe('pending');

      // The sweep finishes it from the due index, while the client's retry races it: each leg lands once.
      await Promise.all([ledger.finishStalledEntries(new Date(), 100), other.apply(release)]);
      const late = lastPositionTaken ? 5 : 0;
      expect(await ledger.balances(payer)).toEqual({ USD: { available: 630 + late, escrow: 0 } });
      expect(await ledger.balances(payee)).toEqual({ USD: { available: 371, escrow: 0 } });
      const chains = await Promise.all([
        chainOf(payer, 'USD', 'available'),
        chainOf(payer, 'USD', 'escrow'),
        chainOf(payee, 'USD', 'available'),
      ]);
      chains.forEach(expectSound);
      expect(
        chains
          .flatMap(postedLegs)
          .filter((leg) => leg.startsWith(release._id))
          .sort(),
      ).toEqual([0, 1, 2].map((leg) => `${release._id}#1#${leg}`));
      expect((await ledger.getEntry(release._id))!.state).toBe('applied');
    });
  }

  it('records a refusal whole and applies a later attempt under the same id once', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w5', 'ten_a', 'sponsor');
    await ledger.apply(credit('w5', 'credit:w5:1', 30));
    const refused = await Promise.allSettled([
      ledger.apply(lock('w5', 'lock:w5', 50)),
      other.apply(lock('w5', 'lock:w5', 50)),
    ]);
    expect(refused.map((o) => o.status)).toEqual(['rejected', 'rejected']);
    expect((await ledger.getEntry('lock:w5'))!.state).toBe('rejected');
    expect(await ledger.balances('w5')).toEqual({ USD: { available: 30, escrow: 0 } });
    expect(await chainOf('w5', 'USD', 'escrow')).toEqual([]);

    await ledger.apply(credit('w5', 'credit:w5:2', 30));
    const [a, b] = await Promise.all([ledger.apply(lock('w5', 'lock:w5', 50)), other.apply(lock('w5', 'lock:w5', 50))]);
    expect(a).toMatchObject({ _id: 'lock:w5~2', entryId: 'lock:w5', attempt: 2, state: 'applied' });
    expect(b.attempt).toBe(2);
    expect(await ledger.balances('w5')).toEqual({ USD: { available: 10, escrow: 50 } });
    expect((await ledger.appliedAmong(['lock:w5'])).has('lock:w5')).toBe(true);
    const available = await chainOf('w5', 'USD', 'available');
    expectSound(available);
    expect(available.filter((p) => p.entryId === 'lock:w5').map((p) => [p.attempt, p.refused])).toEqual([
      [1, true],
      [2, false],
    ]);
  });

  it('shows every currency of a wallet', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w6', 'ten_a', 'sponsor');
    await Promise.all(
      ['USD', 'EUR', 'USDC'].flatMap((currency, i) => [
        ledger.apply(credit('w6', `credit:w6:${currency}`, 100 * (i + 1), currency)),
        other.apply(credit('w6', `credit:w6:${currency}:2`, 1, currency)),
      ]),
    );
    await ledger.apply(lock('w6', 'lock:w6', 150, 'EUR'));
    expect(await other.balances('w6')).toEqual({
      EUR: { available: 51, escrow: 150 },
      USD: { available: 101, escrow: 0 },
      USDC: { available: 301, escrow: 0 },
    });
    expect(
      new Set((await ledger.walletCurrencies.find({ walletId: 'w6' }).toArray()).map((c) => c.currency)).size,
    ).toBe(3);
  });

  it(
    "pages through a wallet's postings newest first, each exactly once, while new ones arrive",
    async () => {
      const { ledger } = t.runtime.stores;
      await ledger.ensureWallet('w7', 'ten_a', 'sponsor');
      for (let i = 0; i < 9; i++)
        await ledger.apply(credit('w7', `credit:w7:${i}`, 10 + i, ['USD', 'EUR', 'USDC'][i % 3]));
      for (let i = 0; i < 4; i++) await ledger.apply(lock('w7', `lock:w7:${i}`, 5, ['USD', 'EUR'][i % 2]));
      await ledger.apply(lock('w7', 'lock:w7:refused', 1_000)).catch(() => undefined);
      const all = (await ledger.postings.find({ walletId: 'w7' }).toArray()).filter((p) => !p.refused);
      expect(all).toHaveLength(17);

      const seen: PostingDoc[] = [];
      let cursor: string | undefined;
      for (let page = 0; page < 20; page++) {
        const listed = (await ledger.listPostings('w7', 4, cursor))!;
        seen.push(...listed.items);
        if (page === 0) await ledger.apply(credit('w7', 'credit:w7:late', 1)); // after the first page: not listed
        if (!listed.nextCursor) break;
        expect(listed.items).toHaveLength(4);
        cursor = listed.nextCursor;
      }
      expect(seen.map((p) => p._id).sort()).toEqual(all.map((p) => p._id).sort());
      for (let i = 1; i < seen.length; i++)
        if (seen[i]!.account === seen[i - 1]!.account) expect(seen[i]!.seq).toBeLessThan(seen[i - 1]!.seq);
      expect(await ledger.listPostings('w7', 4, 'bm90IG91cnM')).toBeNull();
    },
    RACE_TIMEOUT_MS,
  );
});
