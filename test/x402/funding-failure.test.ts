import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { expectLedgerBalances, gateParties, get, post } from './helpers.ts';

describe('a gate whose funding answer is lost', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp();
    ({ auth } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
  });
  afterAll(() => t.close());

  it('keeps the gate, so the escrow it locked is found and returned by a wind-down', async () => {
    const { payer, payee } = await gateParties(t, auth, 5_000);
    const { ledger } = t.runtime.stores;
    const apply = ledger.apply.bind(ledger);
    // The lock is applied, then the answer is lost on its way back (a connection reset, a process stalled): the
    // request fails, yet the money is in escrow.
    ledger.apply = async (entry, options) => {
      const applied = await apply(entry, options);
      if (entry.kind === 'x402_escrow_lock') throw new Error('connection reset after the write');
      return applied;
    };
    let res;
    try {
      res = await post(t, auth, '/x402/gate/create', {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 1_000,
        currency: 'USD',
      });
    } finally {
      ledger.apply = apply;
    }
    expect(res.statusCode).toBe(500);
    expect(await balances(t, auth, payer)).toEqual({ available: 4_000, escrow: 1_000 });

    const windDown = await post(t, auth, `/x402/gate/agents/${encodeURIComponent(payer)}/wind-down`, {});
    expect(windDown.statusCode, windDown.body).toBe(200);
    const summary = windDown.json();
    expect(summary.gatesCancelled).toHaveLength(1);
    expect(summary.escrowReturned).toEqual([{ walletId: payer, currency: 'USD', amount: 1_000 }]);
    expect((await get(t, auth, `/x402/gate/${summary.gatesCancelled[0]}`)).json()).toMatchObject({
      status: 'cancelled',
    });
    expect(await balances(t, auth, payer)).toEqual({ available: 5_000, escrow: 0 });
    await expectLedgerBalances(t);
  });
});
