import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { signEvent } from '../../src/domain/event-chain.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import {
  appendEvents,
  collidingEventIds,
  createRun,
  events,
  registerAgent,
  type TestAgent,
} from '../helpers/agents.ts';

describe('runs and signed events', () => {
  let t: TestApp;
  let second: TestApp;
  let auth: Record<string, string>;
  let agent: TestAgent;
  let stranger: TestAgent;
  beforeAll(async () => {
    t = await startTestApp();
    second = await startTestApp({ env: t.env, dropOnClose: false });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write'])).auth;
    agent = await registerAgent(t, auth);
    stranger = await registerAgent(t, auth);
  });
  afterAll(async () => {
    await second.close();
    await t.close();
  });

  const getRun = async (runId: string) =>
    (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
  const storedEvents = async (runId: string) =>
    (await t.runtime.stores.runs.listEvents(runId, Number.MAX_SAFE_INTEGER)).length;

  it('creates a run in_progress with its terms and an empty chain', async () => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: auth,
      payload: { agentId: agent.agentId, terms: { accuracy: { min: 0.9 }, latencyP95: { max: 800 } } },
    });
    expect(res.statusCode).toBe(201);
    expect(res.json()).toMatchObject({
      runId: expect.stringMatching(/^run_/),
      status: 'in_progress',
      artifactId: null,
      agentId: agent.agentId,
      head: { seq: 0, chainHash: null },
    });
  });

  it('refuses terms with both or neither bound, or a bad metric name, with 400', async () => {
    for (const terms of [
      { accuracy: { min: 1, max: 2 } },
      { accuracy: {} },
      { '9bad': { min: 1 } },
      { accuracy: { min: 'high' } },
    ]) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: { agentId: agent.agentId, terms },
      });
      expect(res.statusCode, JSON.stringify(terms)).toBe(400);
      expect(res.json().code).toBe('VALIDATION_FAILED');
    }
  });

  it('appends single events and batches, moving the head', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const one = events(runId, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: { msg: 'hello' } }]);
    const res = await appendEvents(t, auth, runId, one);
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toEqual({ runId, accepted: 1, head: { seq: 1, chainHash: one[0]!.chainHash } });
    const batch = events(
      runId,
      res.json().head,
      agent,
      Array.from({ length: 100 }, (_, i) => ({ type: 'sample', payload: { latencyMs: i } })),
    );
    const res2 = await appendEvents(t, auth, runId, batch);
    expect(res2.statusCode).toBe(201);
    expect(res2.json().head).toEqual({ seq: 101, chainHash: batch[99]!.chainHash });
    expect((await getRun(runId)).eventCount).toBe(101);
  });

  it('refuses a batch over 100 events with 400', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const batch = events(
      runId,
      { seq: 0, chainHash: null },
      agent,
      Array.from({ length: 101 }, () => ({ type: 'log', payload: {} })),
    );
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(400);
    expect(await storedEvents(runId)).toBe(0);
  });

  it("refuses an event signed with another agent's key, with 400 SIGNATURE_INVALID", async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const forged = events(runId, { seq: 0, chainHash: null }, stranger, [{ type: 'log', payload: {} }]);
    const res = await appendEvents(t, auth, runId, forged);
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('SIGNATURE_INVALID');
    // Claiming the right key id does not help: the signature does not verify under it.
    const claimed = signEvent(
      { id: 'evt_claimed', runId, seq: 1, type: 'log', at: new Date().toISOString(), payload: {} },
      null,
      stranger.privateKey,
      agent.keyId,
    );
    expect((await appendEvents(t, auth, runId, [claimed])).json().code).toBe('SIGNATURE_INVALID');
    expect(await storedEvents(runId)).toBe(0);
  });

  it('refuses events signed with a revoked key', async () => {
    const revokable = await registerAgent(t, auth);
    const runId = await createRun(t, auth, { agentId: revokable.agentId });
    const ok = events(runId, { seq: 0, chainHash: null }, revokable, [{ type: 'log', payload: { n: 1 } }]);
    expect((await appendEvents(t, auth, runId, ok)).statusCode).toBe(201);
    await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${revokable.agentId}/keys/${revokable.keyId}/revoke`,
      headers: auth,
    });
    const after = events(runId, { seq: 1, chainHash: ok[0]!.chainHash }, revokable, [
      { type: 'log', payload: { n: 2 } },
    ]);
    const res = await appendEvents(t, auth, runId, after);
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('SIGNATURE_INVALID');
  });

  it('keeps an agent key revoked even if a lost update writes the agent back with the key active', async () => {
    const agentB = await registerAgent(t, auth);
    const runId = await createRun(t, auth, { agentId: agentB.agentId });
    await t.app.inject({
      method: 'POST',
      url: `/v1/agents/${agentB.agentId}/keys/${agentB.keyId}/revoke`,
      headers: auth,
    });
    await t.runtime.db
      .collection('agents')
      .updateOne({ _id: agentB.agentId as never }, { $set: { [`keys.${agentB.keyId}.status`]: 'active' } });
    const res = await appendEvents(
      t,
      auth,
      runId,
      events(runId, { seq: 0, chainHash: null }, agentB, [{ type: 'log', payload: {} }]),
    );
    expect(res.statusCode).toBe(400);
    expect(res.json().code).toBe('SIGNATURE_INVALID');
  });

  it('refuses an event whose payload was altered after signing', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const [e] = events(runId, { seq: 0, chainHash: null }, agent, [
      { type: 'metric', payload: { name: 'accuracy', value: 0.5 } },
    ]);
    const altered = { ...e!, payload: { name: 'accuracy', value: 0.99 } };
    const res = await appendEvents(t, auth, runId, [altered]);
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: 'SIGNATURE_INVALID', details: { eventId: e!.id } });
  });

  it('answers 409 CHAIN_CONFLICT with the head for a wrong prevChainHash, and stores nothing of a bad batch', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const first = events(runId, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: {} }]);
    await appendEvents(t, auth, runId, first);
    const head = { seq: 1, chainHash: first[0]!.chainHash };
    const wrongPrev = events(runId, { seq: 1, chainHash: 'f'.repeat(64) }, agent, [{ type: 'log', payload: {} }]);
    const conflict = await appendEvents(t, auth, runId, wrongPrev);
    expect(conflict.statusCode).toBe(409);
    expect(conflict.json()).toMatchObject({ code: 'CHAIN_CONFLICT', details: { head } });

    const batch = events(
      runId,
      head,
      agent,
      Array.from({ length: 5 }, (_, i) => ({ type: 'sample', payload: { latencyMs: i } })),
    );
    batch[3] = { ...batch[3]!, payload: { latencyMs: 999 } }; // tampered in the middle
    const bad = await appendEvents(t, auth, runId, batch);
    expect(bad.statusCode).toBe(400);
    expect(await storedEvents(runId)).toBe(1);
    expect((await getRun(runId)).head).toEqual(head);
  });

  it('treats an identical resend as a no-op success, and the same id with other content as a conflict', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const batch = events(runId, { seq: 0, chainHash: null }, agent, [
      { type: 'log', payload: { a: 1 } },
      { type: 'log', payload: { a: 2 } },
    ]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    const resend = await appendEvents(t, auth, runId, batch);
    expect(resend.statusCode).toBe(201);
    expect(resend.json()).toEqual({ runId, accepted: 2, head: { seq: 2, chainHash: batch[1]!.chainHash } });
    // A resend of event 1 whose content changed (properly signed, so only the id gives it away).
    const altered = signEvent({ ...batch[0]!, payload: { a: 'changed' } }, null, agent.privateKey, agent.keyId);
    const clash = await appendEvents(t, auth, runId, [altered]);
    expect(clash.statusCode).toBe(409);
    expect(await storedEvents(runId)).toBe(2);
  });

  it('refuses an event id the run already used, at a new position, whichever process stored the first one', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const first = events(runId, { seq: 0, chainHash: null }, agent, [
      { type: 'log', payload: { n: 1 } },
      { type: 'log', payload: { n: 2 } },
    ]);
    expect((await appendEvents(second, auth, runId, first)).statusCode).toBe(201); // stored by the other process
    let head = { seq: 2, chainHash: first[1]!.chainHash };
    for (const [app, reused] of [
      [t, first[0]!],
      [second, first[1]!],
    ] as const) {
      // A new, properly signed event at the next position, carrying an id the run already holds.
      const [fresh] = events(runId, head, agent, [{ type: 'log', payload: { n: 'again' } }]);
      const clash = await appendEvents(app, auth, runId, [
        signEvent({ ...fresh!, id: reused.id }, head.chainHash, agent.privateKey, agent.keyId),
      ]);
      expect(clash.statusCode, clash.body).toBe(409);
      expect(clash.json()).toMatchObject({ code: 'CHAIN_CONFLICT', details: { eventId: reused.id, head } });
      // The position is still free: the same event under a new id takes it.
      const ok = await appendEvents(app, auth, runId, [fresh!]);
      expect(ok.statusCode, ok.body).toBe(201);
      head = ok.json().head;
    }
    expect(await storedEvents(runId)).toBe(4);
  });

  it('accepts two different event ids whose index hashes collide', async () => {
    const pair = collidingEventIds('evt_collide_');
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const [a] = events(runId, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: { n: 1 } }]);
    const first = signEvent({ ...a!, id: pair[0] }, null, agent.privateKey, agent.keyId);
    expect((await appendEvents(t, auth, runId, [first])).statusCode).toBe(201);
    const [b] = events(runId, { seq: 1, chainHash: first.chainHash }, agent, [{ type: 'log', payload: { n: 2 } }]);
    const res = await appendEvents(t, auth, runId, [
      signEvent({ ...b!, id: pair[1] }, first.chainHash, agent.privateKey, agent.keyId),
    ]);
    expect(res.statusCode, res.body).toBe(201);
    expect(await storedEvents(runId)).toBe(2);
  });

  it('treats a resend as a success when the first try stored the batch but the head cache never caught up', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const batch = events(runId, { seq: 0, chainHash: null }, agent, [
      { type: 'log', payload: { a: 1 } },
      { type: 'log', payload: { a: 2 } },
    ]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    await t.runtime.stores.runs.heads.deleteOne({ _id: runId }); // the answer and the head cache write were lost
    const resend = await appendEvents(t, auth, runId, batch);
    expect(resend.statusCode, resend.body).toBe(201);
    expect(resend.json()).toEqual({ runId, accepted: 2, head: { seq: 2, chainHash: batch[1]!.chainHash } });
    expect(await storedEvents(runId)).toBe(2);
  });

  it('lets exactly one of two racing clients win each seq (two API processes)', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    let head = { seq: 0, chainHash: null as string | null };
    for (let round = 0; round < 15; round++) {
      const mine = events(runId, head, agent, [{ type: 'log', payload: { who: 'a', round } }]);
      const theirs = events(runId, head, agent, [{ type: 'log', payload: { who: 'b', round } }]);
      const [a, b] = await Promise.all([appendEvents(t, auth, runId, mine), appendEvents(second, auth, runId, theirs)]);
      const statuses = [a.statusCode, b.statusCode].sort();
      expect(statuses).toEqual([201, 409]);
      const winner = a.statusCode === 201 ? a : b;
      const loser = a.statusCode === 201 ? b : a;
      expect(loser.json().code).toBe('CHAIN_CONFLICT');
      head = winner.json().head;
      expect(loser.json().details.head).toEqual(head);
    }
    expect(await storedEvents(runId)).toBe(15);
  });

  it('shows the true head and finalized state in one process after another process appended and finalized', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const getRun = async (app: typeof t) =>
      (await app.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
    const first = events(runId, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: { n: 1 } }]);
    expect((await appendEvents(t, auth, runId, first)).statusCode).toBe(201);
    expect((await getRun(t)).head.seq).toBe(1); // this process now remembers head 1
    const later = events(runId, { seq: 1, chainHash: first[0]!.chainHash }, agent, [
      { type: 'log', payload: { n: 2 } },
      { type: 'log', payload: { n: 3 } },
    ]);
    expect((await appendEvents(second, auth, runId, later)).statusCode).toBe(201);
    expect((await getRun(t)).head).toEqual({ seq: 3, chainHash: later[1]!.chainHash });
    // An append built on the head this process remembered is refused with the true head, and one on it succeeds.
    const stale = events(runId, { seq: 1, chainHash: first[0]!.chainHash }, agent, [
      { type: 'log', payload: { n: 9 } },
    ]);
    expect((await appendEvents(t, auth, runId, stale)).json()).toMatchObject({
      code: 'CHAIN_CONFLICT',
      details: { head: { seq: 3 } },
    });
    expect(
      (await second.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth })).statusCode,
    ).toBe(202);
    const late = events(runId, { seq: 3, chainHash: later[1]!.chainHash }, agent, [{ type: 'log', payload: { n: 4 } }]);
    // This process remembers the run in progress (it appended to it); the seal the other one stored refuses the append.
    expect((await appendEvents(t, auth, runId, late)).json()).toMatchObject({
      code: 'TRANSITION_ILLEGAL',
      details: { status: expect.stringMatching(/^finaliz/) },
    });
    expect(await getRun(t)).toMatchObject({ head: { seq: 3 }, status: expect.stringMatching(/^finaliz/) });
    expect(await storedEvents(runId)).toBe(3);
  });

  it('refuses appends once the run is finalizing', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const fin = await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    expect(fin.statusCode).toBe(202);
    const late = await appendEvents(
      t,
      auth,
      runId,
      events(runId, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: {} }]),
    );
    expect(late.statusCode).toBe(409);
    expect(late.json()).toMatchObject({ code: 'TRANSITION_ILLEGAL', details: { status: 'finalizing' } });
  });

  it("answers 404 for another tenant's run, for reads, appends and finalize", async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const other = (await t.tenantWithKey(['runs:write'])).auth;
    expect((await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: other })).statusCode).toBe(404);
    expect(
      (
        await appendEvents(
          t,
          other,
          runId,
          events(runId, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: {} }]),
        )
      ).statusCode,
    ).toBe(404);
    expect((await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: other })).statusCode).toBe(
      404,
    );
    expect((await getRun(runId)).status).toBe('in_progress');
  });
});
