import type { CommandStartedEvent } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gateSettlementId } from '../../src/services/x402/gates.ts';
import { accountOf } from '../../src/store/ledger.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances } from '../helpers/money.ts';
import { createGate, expectLedgerBalances, gateParties, get, post, quote, twoApiProcesses } from './helpers.ts';

/**
 * Every paid call goes through create -> quote -> authorize-payment -> verify, and on FerretDB each MongoDB command
 * is a round trip plus a SQLite statement: what each step sends is most of what it costs. This pins the commands of
 * each step (the verify job's included, as the worker runs in this process) at what the hot path needs, and checks
 * that every one of them is an exact `_id` lookup or an insert. The worker here shares the API's runtime; a worker
 * process of its own sends the same (the report carries copies of the gate and its commitment: see the block below).
 */
// create and verify each carry one command of the gate's due record (marked before the lock, removed by the verify
// job once the settlement holds the money): what lets the gate sweeper return a reserve past its deadline. Each ledger
// entry is 3 commands here (its attempt, both legs in one insert, its state), plus an account's head cache when a
// posting lands on a multiple of 8 (not in the counted flow; one is allowed for). The verify job reads no report (its
// request hands it over) and leaves its settlement no due record (nothing is held: nothing waits for the window).
const BUDGET = { create: 9, quote: 3, authorize: 2, verify: 11 };

/** Commands that read by anything but an exact `_id` (due-work collections hold only what is due: those may). */
function scansIn(events: CommandStartedEvent[]): string[] {
  const isPoint = (q: unknown) =>
    typeof q === 'object' &&
    q !== null &&
    Object.keys(q).length === 1 &&
    typeof (q as { _id?: unknown })._id === 'string';
  return events.flatMap((e) => {
    const c = e.command;
    const collection = String(c[e.commandName]);
    if (collection.startsWith('due_')) return [];
    const filters: unknown[] =
      e.commandName === 'find' || e.commandName === 'count' || e.commandName === 'distinct'
        ? [c.filter ?? c.query ?? {}]
        : e.commandName === 'update' || e.commandName === 'delete'
          ? (c.updates ?? c.deletes).map((u: { q: unknown }) => u.q)
          : e.commandName === 'findAndModify'
            ? [c.query]
            : e.commandName === 'aggregate'
              ? [null]
              : [];
    return filters.filter((f) => !isPoint(f)).map((f) => `${e.commandName} ${collection} ${JSON.stringify(f)}`);
  });
}

describe('x402 hot path: MongoDB commands per step', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({ workers: ['x402-verify', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    ({ auth } = await t.tenantWithKey(['agents:write', 'x402:write', 'wallets:write']));
  });
  afterAll(async () => {
    await t.close();
  });

  it(`sends at most ${JSON.stringify(BUDGET)} commands, none of them a scan`, async () => {
    const { payer, payee } = await gateParties(t, auth, 10_000);
    const commands: CommandStartedEvent[] = [];
    let counting = false;
    t.runtime.mongo.on('commandStarted', (e) => {
      if (counting) commands.push(e);
    });
    const step = async (work: () => Promise<unknown>) => {
      commands.length = 0;
      counting = true;
      await work();
      await new Promise((resolve) => setTimeout(resolve, 100)); // the verify job's last writes trail its answer
      counting = false;
      expect(scansIn(commands)).toEqual([]);
      return commands.filter((e) => e.commandName !== 'hello' && e.commandName !== 'ping').length;
    };
    const flow = async () => {
      let gateId = '';
      const create = await step(
        async () =>
          (gateId = (
            await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 1_000, holdbackBps: 1_000 })
          ).gateId),
      );
      let q = { quoteId: '', requestSha256: '' };
      const quoted = await step(async () => (q = await quote(t, auth, gateId)));
      const authorize = await step(async () =>
        expect(
          (
            await post(t, auth, '/x402/gate/authorize-payment', {
              gateId,
              quoteId: q.quoteId,
              requestSha256: q.requestSha256,
            })
          ).statusCode,
        ).toBe(200),
      );
      const verify = await step(async () =>
        expect(
          (await post(t, auth, '/x402/gate/verify', { gateId, evidence: { responseSha256: q.requestSha256 } })).json(),
        ).toMatchObject({ status: 'released' }),
      );
      return { create, quote: quoted, authorize, verify };
    };
    await flow(); // the first pass opens the wallets and fills the caches a running service has
    const counts = await flow();
    // Every step sends something (were command monitoring off, every count would be 0 and pass the budget).
    for (const name of Object.keys(BUDGET)) expect(counts[name as keyof typeof BUDGET], name).toBeGreaterThan(0);
    for (const [name, budget] of Object.entries(BUDGET))
      expect(counts[name as keyof typeof BUDGET], name).toBeLessThanOrEqual(budget);
    await expectLedgerBalances(t);
  });
});

describe('x402 hot path: what the API and the verify job hand each other instead of reading it', () => {
  // Requests go to `api`; the verify job runs in `worker`'s runtime: two processes posting on the payer's accounts
  // (the lock from the API, the release from the job), each of which would otherwise read past its remembered head
  // before every claim there.
  const processes = twoApiProcesses();

  it("a gate flow, whole or metered, reads no ledger posting once each process has met the other's", async () => {
    const { first: worker, second: api, auth } = processes;
    const { payer, payee } = await gateParties(api, auth, 100_000);
    // Reads by `_id` while counting, by process (a sweep scanning for its own reasons is none of these).
    const finds: Array<{ by: 'api' | 'worker'; collection: string; id: string }> = [];
    let counting = false;
    for (const [by, t] of [
      ['api', api],
      ['worker', worker],
    ] as const) {
      t.runtime.mongo.on('commandStarted', (e) => {
        const id = e.commandName === 'find' ? (e.command.filter as { _id?: unknown } | undefined)?._id : undefined;
        if (counting && typeof id === 'string') finds.push({ by, collection: String(e.command.find), id });
      });
    }
    const payerAccounts = (['escrow', 'available'] as const).map((bucket) => accountOf(payer, 'USD', bucket));
    const gateIds: string[] = [];
    const flow = async (amount?: number) => {
      const { gateId } = await createGate(api, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 1_000 });
      if (counting) gateIds.push(gateId);
      const q = await quote(api, auth, gateId);
      expect(
        (
          await post(api, auth, '/x402/gate/authorize-payment', {
            gateId,
            quoteId: q.quoteId,
            requestSha256: q.requestSha256,
          })
        ).statusCode,
      ).toBe(200);
      const verified = await post(api, auth, '/x402/gate/verify', {
        gateId,
        evidence: { responseSha256: q.requestSha256 },
        ...(amount === undefined ? {} : { amount }),
      });
      expect([200, 202]).toContain(verified.statusCode);
      // The API learns the job's heads from its completion, which may trail a 202: wait for it, not for a clock.
      await expect
        .poll(async () => (await get(api, auth, `/x402/gate/${gateId}`)).json().status, { timeout: 15_000 })
        .toBe(amount === 0 ? 'refunded' : 'released');
      const behind = () =>
        payerAccounts.filter(
          (a) =>
            (api.runtime.stores.ledger.knownHeadsOf([a])[0]?.seq ?? 0) <
            (worker.runtime.stores.ledger.knownHeadsOf([a])[0]?.seq ?? 0),
        );
      await expect.poll(behind, { timeout: 15_000 }).toEqual([]);
    };
    await flow();
    await flow(370); // each process has now lost a claim to the other on both of the payer's accounts
    counting = true;
    await flow();
    await flow(370);
    await flow(0);
    counting = false;
    // No process read a position of the payer's chains: each knew where the other had left them.
    expect(
      finds.filter((f) => f.collection === 'ledger_postings' && payerAccounts.some((a) => f.id.startsWith(`${a}#`))),
    ).toEqual([]);
    // The job carries the report, which carries copies of the gate, its commitment and its settlement: the job read
    // none of them.
    const ofCountedGates = (id: string) => gateIds.some((gateId) => id === gateId || id === gateSettlementId(gateId));
    expect(
      finds.filter(
        (f) =>
          f.by === 'worker' &&
          ['x402_verifications', 'x402_gates', 'x402_gate_commitments', 'settlements'].includes(f.collection) &&
          ofCountedGates(f.id),
      ),
    ).toEqual([]);
    expect(gateIds).toHaveLength(3);
    expect(await balances(api, auth, payer)).toEqual({ available: 100_000 - 2 * (1_000 + 370), escrow: 0 });
    await expectLedgerBalances(api);
  });
});
