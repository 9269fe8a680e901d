import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/crypto.ts';
import { LIST_ENTRY_REPAIR_AFTER_MS } from '../../src/store/list-index.ts';
import { rebuildListIndex } from '../../src/store/list-rebuild.ts';
import { createRun, registerAgent, type TestAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('lists', () => {
  let t: TestApp;
  let a: { tenantId: string; auth: Record<string, string> };
  let b: { tenantId: string; auth: Record<string, string> };
  let alice: TestAgent;
  let bob: TestAgent;
  const runsOfA: string[] = [];
  beforeAll(async () => {
    t = await startTestApp();
    a = await t.tenantWithKey(['agents:write', 'runs:write']);
    b = await t.tenantWithKey(['agents:write', 'runs:write']);
    alice = await registerAgent(t, a.auth);
    bob = await registerAgent(t, a.auth);
    for (let i = 0; i < 5; i++)
      runsOfA.push(await createRun(t, a.auth, { agentId: i % 2 === 0 ? alice.agentId : bob.agentId }));
    const carol = await registerAgent(t, b.auth);
    await createRun(t, b.auth, { agentId: carol.agentId });
  });
  afterAll(() => t.close());

  const get = (url: string, headers: Record<string, string>) => t.app.inject({ method: 'GET', url, headers });
  const ids = (body: { items: Array<{ runId: string }> }) => body.items.map((r) => r.runId);

  it('pages runs newest first with a cursor, without duplicates or gaps while new runs arrive', async () => {
    const first = await get('/v1/runs?limit=2', a.auth);
    expect(first.statusCode, first.body).toBe(200);
    expect(ids(first.json())).toEqual([runsOfA[4], runsOfA[3]]);
    const arrived = await createRun(t, a.auth, { agentId: alice.agentId }); // newer than every page being read
    const second = (await get(`/v1/runs?limit=2&cursor=${first.json().nextCursor}`, a.auth)).json();
    expect(ids(second)).toEqual([runsOfA[2], runsOfA[1]]);
    const third = (await get(`/v1/runs?limit=2&cursor=${second.nextCursor}`, a.auth)).json();
    expect(ids(third)).toEqual([runsOfA[0]]);
    expect(third.nextCursor).toBeNull();
    expect(ids((await get('/v1/runs?limit=1', a.auth)).json())).toEqual([arrived]);
    runsOfA.push(arrived);
  });

  it('filters by agent, status and creation time', async () => {
    const byBob = (await get(`/v1/runs?agentId=${bob.agentId}`, a.auth)).json();
    expect(ids(byBob)).toEqual([runsOfA[3], runsOfA[1]]);
    expect(
      (await t.app.inject({ method: 'POST', url: `/v1/runs/${runsOfA[1]}/finalize`, headers: a.auth })).statusCode,
    ).toBe(202);
    const finalizing = (await get('/v1/runs?status=finalizing', a.auth)).json();
    expect(ids(finalizing)).toEqual([runsOfA[1]]);
    expect(ids((await get('/v1/runs?status=in_progress', a.auth)).json())).not.toContain(runsOfA[1]);
    const third = (await get(`/v1/runs/${runsOfA[2]}`, a.auth)).json();
    const after = (await get(`/v1/runs?createdAfter=${encodeURIComponent(third.createdAt)}`, a.auth)).json();
    expect(ids(after)).toEqual(runsOfA.slice(3).reverse());
    const before = (await get(`/v1/runs?createdBefore=${encodeURIComponent(third.createdAt)}`, a.auth)).json();
    expect(ids(before)).toEqual(runsOfA.slice(0, 2).reverse());
    const agents = (await get('/v1/agents', a.auth)).json();
    expect(agents.items.map((x: { agentId: string }) => x.agentId)).toEqual([bob.agentId, alice.agentId]);
  });

  it('refuses a cursor it never issued, an empty time range and a limit out of range, in the contract shape', async () => {
    const bad = await get(`/v1/runs?cursor=${Buffer.from('nonsense').toString('base64url')}`, a.auth);
    expect(bad.statusCode).toBe(422);
    expect(bad.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'querystring.cursor' }] },
    });
    const range = await get('/v1/runs?createdAfter=2026-01-02T00:00:00Z&createdBefore=2026-01-01T00:00:00Z', a.auth);
    expect(range.statusCode).toBe(422);
    expect(range.json().details.errors[0].path).toBe('querystring.createdAfter');
    for (const limit of [0, 201])
      expect((await get(`/v1/runs?limit=${limit}`, a.auth)).json().code).toBe('VALIDATION_FAILED');
    expect((await get('/v1/runs?status=done', a.auth)).statusCode).toBe(400);
  });

  it('shows a tenant key only its tenant, and the operator every tenant (or one)', async () => {
    const ofB = (await get('/v1/runs', b.auth)).json();
    expect(ofB.items).toHaveLength(1);
    expect(ofB.items.every((r: { runId: string }) => !runsOfA.includes(r.runId))).toBe(true);
    expect((await get(`/v1/runs?agentId=${alice.agentId}`, b.auth)).json().items).toEqual([]);
    expect((await get('/v1/runs', t.admin)).statusCode).toBe(403);
    const all = (await get('/ops/runs?limit=200', t.admin)).json();
    expect(all.items.length).toBeGreaterThanOrEqual(runsOfA.length + 1);
    expect(ids((await get(`/ops/runs?tenantId=${a.tenantId}`, t.admin)).json()).sort()).toEqual([...runsOfA].sort());
    expect((await get('/ops/runs', a.auth)).statusCode).toBe(403);
    const readOnly = await t.tenantWithKey(['runs:read']);
    expect((await get('/v1/agents', readOnly.auth)).statusCode).toBe(403);
    expect((await get('/v1/runs', readOnly.auth)).statusCode).toBe(200);
  });

  it('never shows an entry whose object was never stored, and removes it once no writer can be on its way', async () => {
    const { lists } = t.runtime.stores;
    const fresh = {
      kind: 'runs' as const,
      id: newId('run'),
      tenantId: a.tenantId,
      at: new Date(),
      agentIds: [alice.agentId],
    };
    const old = { ...fresh, id: newId('run'), at: new Date(Date.now() - LIST_ENTRY_REPAIR_AFTER_MS - 60_000) };
    await lists.add(fresh); // as if the process died between the index write and the insert
    await lists.add(old);
    const before = await lists.size('runs', { tenantId: a.tenantId });
    const res = await get('/v1/runs?limit=200', a.auth);
    expect(res.statusCode, res.body).toBe(200);
    const page = res.json();
    expect(ids(page)).not.toContain(fresh.id);
    expect(ids(page)).not.toContain(old.id);
    expect(ids(page).sort()).toEqual([...runsOfA].sort());
    expect(await lists.size('runs', { tenantId: a.tenantId })).toBe(before - 1); // the old one is repaired away
  });

  it('lists an object stored without its index entry once the index is rebuilt', async () => {
    const { runs } = t.runtime.stores;
    const stored = { ...(await runs.runs.findOne({ _id: runsOfA[0]! }))!, _id: newId('run'), createdAt: new Date() };
    await runs.runs.insertOne(stored); // stored, index entry never written (data from before the lists)
    expect(ids((await get('/v1/runs?limit=1', a.auth)).json())).not.toContain(stored._id);
    const counts = await rebuildListIndex(t.runtime.stores.lists, t.runtime.stores);
    expect(counts.runs).toBeGreaterThanOrEqual(runsOfA.length + 2);
    expect(ids((await get('/v1/runs?limit=1', a.auth)).json())).toEqual([stored._id]);
    expect(ids((await get(`/v1/runs?agentId=${alice.agentId}&limit=1`, a.auth)).json())).toEqual([stored._id]);
  });
});
