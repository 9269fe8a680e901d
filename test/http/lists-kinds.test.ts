import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/crypto.ts';
import { SCAN_BUDGET } from '../../src/services/lists.ts';
import type { ListEntry } from '../../src/store/list-index.ts';
import type { EscalationDoc, ResolutionDoc } from '../../src/store/x402.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';
import { createGate, gateParties, post, quote } from '../x402/helpers.ts';

// The lists of settlements, disputes, gates, escalations and sessions (test/http/lists.test.ts covers runs and
// agents and the shared rules): newest first, their status filters, a tenant's key sees its tenant only, and a
// status filter that has to read past more than SCAN_BUDGET entries hands back a short page with a cursor.

describe('lists of settlements, disputes, gates, escalations and sessions', () => {
  let t: TestApp;
  let a: { tenantId: string; auth: Record<string, string> };
  let b: { tenantId: string; auth: Record<string, string> };
  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize', 'settle'], overrides: { RATE_LIMIT_MAX: '100000' } });
    a = await t.tenantWithKey(['agents:write', 'runs:write', 'x402:write', 'wallets:write']);
    b = await t.tenantWithKey(['agents:write', 'runs:write', 'x402:write', 'wallets:write']);
  });
  afterAll(() => t.close());

  const list = async (url: string, auth: Record<string, string> = a.auth) => {
    const res = await t.app.inject({ method: 'GET', url, headers: auth });
    expect(res.statusCode, `${url}: ${res.body}`).toBe(200);
    return res.json() as { items: Array<Record<string, any>>; nextCursor: string | null };
  };
  const field = (name: string) => (page: { items: Array<Record<string, any>> }) => page.items.map((i) => i[name]);

  it('settlements and disputes: newest first, by status and agent, one tenant only', async () => {
    const p = await parties(t, a.auth, 10_000);
    const passed = await finalizedRun(t, a.auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 2_000,
      disputeWindowSeconds: 3_600,
    });
    await settle(t, a.auth, passed);
    const completed = await waitSettlement(t, a.auth, passed, (s) => s.status === 'completed');
    const failed = await finalizedRun(t, a.auth, p, { pass: false, amount: 500 });
    await settle(t, a.auth, failed);
    const held = await waitSettlement(t, a.auth, failed, (s) => s.status === 'held');

    const settlementIds = field('settlementId');
    expect(settlementIds(await list('/v1/settlements'))).toEqual([held.settlementId, completed.settlementId]);
    expect(settlementIds(await list('/v1/settlements?status=held'))).toEqual([held.settlementId]);
    expect(
      settlementIds(await list(`/v1/settlements?agentId=${encodeURIComponent(p.worker.agentId)}&limit=1`)),
    ).toEqual([held.settlementId]);
    expect((await list('/v1/settlements', b.auth)).items).toEqual([]);

    const opened = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${passed}/disputes`,
      headers: a.auth,
      payload: { reason: 'output was wrong' },
    });
    expect(opened.statusCode, opened.body).toBe(201);
    const disputes = await list('/v1/disputes');
    expect(disputes.items).toEqual([
      expect.objectContaining({
        disputeId: opened.json().disputeId,
        status: 'open',
        settlementId: completed.settlementId,
        runId: passed,
      }),
    ]);
    expect(field('disputeId')(await list('/v1/disputes?status=open'))).toEqual([opened.json().disputeId]);
    expect((await list('/v1/disputes?status=resolved')).items).toEqual([]);
    expect((await list('/v1/disputes', b.auth)).items).toEqual([]);
    expect(field('disputeId')(await list(`/ops/disputes?tenantId=${a.tenantId}`, t.admin))).toEqual([
      opened.json().disputeId,
    ]);
  });

  it('gates and sessions: newest first, by status, one tenant only', async () => {
    const { payer, payee } = await gateParties(t, a.auth, 5_000);
    const first = await createGate(t, a.auth, { payerAgentId: payer, payeeAgentId: payee, amount: 100 });
    const second = await createGate(t, a.auth, { payerAgentId: payer, payeeAgentId: payee, amount: 200 });
    const gateIds = field('gateId');
    expect(gateIds(await list('/v1/gates'))).toEqual([second.gateId, first.gateId]);
    expect(gateIds(await list(`/v1/gates?status=${first.status}`))).toEqual([second.gateId, first.gateId]);
    expect((await list('/v1/gates?status=released')).items).toEqual([]);
    expect(gateIds(await list(`/v1/gates?agentId=${encodeURIComponent(payee)}&limit=1`))).toEqual([second.gateId]);
    expect((await list('/v1/gates', b.auth)).items).toEqual([]);

    const opened = await post(
      t,
      a.auth,
      '/x402/sessions',
      { currency: 'USD', payerAgentId: payer, payeeAgentIds: [payee], budget: 300, maxPerCall: 50 },
      { 'idempotency-key': newId('k') },
    );
    expect(opened.statusCode, opened.body).toBe(201);
    const sessionId = opened.json().sessionId;
    expect(field('sessionId')(await list('/v1/sessions'))).toEqual([sessionId]);
    expect(field('sessionId')(await list('/v1/sessions?status=open'))).toEqual([sessionId]);
    expect((await list('/v1/sessions?status=closed')).items).toEqual([]);
    expect((await list('/v1/sessions', b.auth)).items).toEqual([]);
  });

  it(`escalations: a waiting one is found behind decided ones; behind more than ${SCAN_BUDGET} a page comes back short, with a cursor that leads to it`, async () => {
    const { payer, payee } = await gateParties(t, a.auth, 5_000);
    await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: a.auth,
      payload: { currency: 'USD', perCallLimit: 100 },
    });
    const escalate = async () => {
      const gate = await createGate(t, a.auth, { payerAgentId: payer, payeeAgentId: payee, amount: 500 });
      const q = await quote(t, a.auth, gate.gateId);
      const breach = await post(t, a.auth, '/x402/gate/authorize-payment', {
        gateId: gate.gateId,
        quoteId: q.quoteId,
        requestSha256: q.requestSha256,
      });
      expect(breach.statusCode, breach.body).toBe(409);
      return breach.json().details.escalationId as string;
    };
    const waiting = await escalate();
    const decided = await escalate();
    expect(
      (await post(t, a.auth, `/x402/gate/escalations/${decided}/resolve`, { action: 'deny', reason: 'not this one' }))
        .statusCode,
    ).toBe(200);
    const ids = field('escalationId');
    expect(ids(await list('/v1/escalations'))).toEqual([decided, waiting]);
    expect(ids(await list('/v1/escalations?status=pending'))).toEqual([waiting]);
    expect(ids(await list('/v1/escalations?status=denied'))).toEqual([decided]);
    expect((await list('/v1/escalations', b.auth)).items).toEqual([]);

    // Many more decided escalations after it (copies of the decided one, stored and indexed as the service does).
    const { x402, lists } = t.runtime.stores;
    const original = (await x402.escalations.findOne({ _id: decided }))!;
    const resolution = (await x402.resolutions.findOne({ _id: decided }))!;
    const base = original.createdAt.getTime() + 1_000;
    const copy = (i: number): EscalationDoc => ({ ...original, _id: newId('esc'), createdAt: new Date(base + i) });
    const insertDecided = async (from: number, count: number) => {
      const docs = Array.from({ length: count }, (_, i) => copy(from + i));
      await x402.escalations.insertMany(docs);
      await x402.resolutions.insertMany(docs.map((d): ResolutionDoc => ({ ...resolution, _id: d._id })));
      await lists.addMany(
        docs.map((d): ListEntry => ({
          kind: 'escalations',
          id: d._id,
          tenantId: d.tenantId,
          at: d.createdAt,
          agentIds: [d.payerAgentId, d.payeeAgentId],
        })),
      );
    };
    await insertDecided(0, 300);
    // Within the bound: one page finds it.
    expect(ids(await list('/v1/escalations?status=pending'))).toEqual([waiting]);

    await insertDecided(300, SCAN_BUDGET);
    const short = await list('/v1/escalations?status=pending');
    expect(short.items).toEqual([]); // the page read SCAN_BUDGET entries, all decided
    expect(short.nextCursor).toEqual(expect.any(String));
    const next = await list(`/v1/escalations?status=pending&cursor=${short.nextCursor}`);
    expect(ids(next)).toEqual([waiting]);
    expect(next.nextCursor).toBeNull();
  }, 120_000);
});
