import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('ledger postings (real FerretDB/MongoDB, no transactions)', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  const chainOf = async (walletId: string, currency: string, bucket: 'available' | 'escrow') =>
    (await t.runtime.stores.ledger.postings.find({ walletId, currency, bucket }).toArray()).sort((a, b) => a.seq - b.seq);

  it('applies an entry once however often it is applied, and heads match their chains', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w1', 'ten_a', 'sponsor');
    const credit = { _id: 'credit:w1:1', tenantId: 'ten_a', kind: 'credit', currency: 'USD', legs: [{ walletId: 'w1', bucket: 'available' as const, delta: 100 }], ref: {} };
    await Promise.all([ledger.apply(credit), ledger.apply(credit), ledger.apply(credit)]);
    expect(await ledger.balances('w1')).toEqual({ USD: { available: 100, escrow: 0 } });
    expect(await chainOf('w1', 'USD', 'available')).toHaveLength(1);
  });

  it('serialises many concurrent entries on one account, refusing what the balance cannot cover', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w2', 'ten_a', 'sponsor');
    await ledger.apply({ _id: 'credit:w2', tenantId: 'ten_a', kind: 'credit', currency: 'USD', legs: [{ walletId: 'w2', bucket: 'available', delta: 1_000 }], ref: {} });
    const outcomes = await Promise.allSettled(
      Array.from({ length: 30 }, (_, i) =>
        ledger.apply({ _id: `lock:${i}`, tenantId: 'ten_a', kind: 'escrow_lock', currency: 'USD', legs: [{ walletId: 'w2', bucket: 'available', delta: -50 }, { walletId: 'w2', bucket: 'escrow', delta: 50 }], ref: {} }),
      ),
    );
    expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(20);
    expect(await ledger.balances('w2')).toEqual({ USD: { available: 0, escrow: 1_000 } });
    expect((await chainOf('w2', 'USD', 'escrow')).map((p) => p.seq)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    const chain = await chainOf('w2', 'USD', 'available');
    expect(chain.map((p) => p.seq)).toEqual(Array.from({ length: 21 }, (_, i) => i + 1));
    expect(chain.at(-1)!.balanceAfter).toBe(0);
  });

  it('repairs a head left behind by a writer that died between its posting and its head update', async () => {
    const { ledger } = t.runtime.stores;
    await ledger.ensureWallet('w3', 'ten_a', 'sponsor');
    await ledger.apply({ _id: 'credit:w3:1', tenantId: 'ten_a', kind: 'credit', currency: 'USD', legs: [{ walletId: 'w3', bucket: 'available', delta: 10 }], ref: {} });
    // The dead writer's posting: stored, head not moved.
    await ledger.postings.insertOne({ _id: 'credit:w3:2#0', account: 'w3|USD|available', walletId: 'w3', currency: 'USD', bucket: 'available', seq: 2, entryId: 'credit:w3:2', leg: 0, delta: 5, balanceAfter: 15, kind: 'credit', at: new Date() });
    await ledger.entries.insertOne({ _id: 'credit:w3:2', tenantId: 'ten_a', kind: 'credit', currency: 'USD', legs: [{ walletId: 'w3', bucket: 'available', delta: 5 }], state: 'pending', ref: {}, createdAt: new Date(0), settledAt: null });
    // A debit the stale head could not cover (10 < 12) but the true balance can (15).
    await ledger.apply({ _id: 'spend:w3', tenantId: 'ten_a', kind: 'escrow_lock', currency: 'USD', legs: [{ walletId: 'w3', bucket: 'available', delta: -12 }, { walletId: 'w3', bucket: 'escrow', delta: 12 }], ref: {} });
    await ledger.resume('credit:w3:2');
    expect(await ledger.balances('w3')).toEqual({ USD: { available: 3, escrow: 12 } });
    expect((await ledger.accounts.findOne({ _id: 'w3|USD|available' }))).toMatchObject({ seq: 3, balance: 3 });
    expect((await ledger.getEntry('credit:w3:2'))!.state).toBe('applied');
  });
});
