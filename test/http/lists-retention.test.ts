import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../src/domain/crypto.ts';
import { ListIndex } from '../../src/store/list-index.ts';
import { rebuildListIndex } from '../../src/store/list-rebuild.ts';
import { createRun, registerAgent, type TestAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

// LIST_RETENTION_DAYS bounds what the lists keep in Redis: every write trims the sets it writes to, so a row older
// than the retention leaves its tenant's, its agents' and the operator's lists at the next write there, and a
// rebuild leaves it out. The row itself stays readable by id.
describe('lists with LIST_RETENTION_DAYS', () => {
  let t: TestApp;
  let a: { tenantId: string; auth: Record<string, string> };
  let alice: TestAgent;
  beforeAll(async () => {
    t = await startTestApp({ overrides: { LIST_RETENTION_DAYS: '1' } });
    a = await t.tenantWithKey(['agents:write', 'runs:write']);
    alice = await registerAgent(t, a.auth);
  });
  afterAll(() => t.close());

  const ids = async (url: string) => {
    const res = await t.app.inject({ method: 'GET', url, headers: a.auth });
    expect(res.statusCode, res.body).toBe(200);
    return (res.json() as { items: Array<{ runId: string }> }).items.map((r) => r.runId);
  };

  it('drops a row past retention from every list it was in at the next write, and keeps it readable by id', async () => {
    const recent = await createRun(t, a.auth, { agentId: alice.agentId });
    // A run from two days ago, listed before the retention was set (an index without one, over the same sets).
    const { runs } = t.runtime.stores;
    const old = {
      ...(await runs.runs.findOne({ _id: recent }))!,
      _id: newId('run'),
      createdAt: new Date(Date.now() - 2 * 86_400_000),
    };
    await runs.runs.insertOne(old);
    await new ListIndex(t.runtime.redis, t.env.redisPrefix).add({
      kind: 'runs',
      id: old._id,
      tenantId: a.tenantId,
      at: old.createdAt,
      agentIds: [alice.agentId],
    });
    expect(await ids('/v1/runs?limit=10')).toEqual([recent, old._id]);
    expect(await t.runtime.stores.lists.size('runs', 'all')).toBeGreaterThanOrEqual(2);

    const next = await createRun(t, a.auth, { agentId: alice.agentId });
    expect(await ids('/v1/runs?limit=10')).toEqual([next, recent]);
    expect(await ids(`/v1/runs?agentId=${alice.agentId}&limit=10`)).toEqual([next, recent]);
    const all = await t.runtime.redis.zrange(t.runtime.stores.lists.key('runs', 'all'), 0, -1);
    expect(all.some((m) => m.includes(old._id))).toBe(false);
    const byId = await t.app.inject({ method: 'GET', url: `/v1/runs/${old._id}`, headers: a.auth });
    expect(byId.statusCode, byId.body).toBe(200);

    // A rebuild (after a Redis loss, say) leaves it out too.
    await t.runtime.redis.del(t.runtime.stores.lists.key('runs', { tenantId: a.tenantId }));
    await rebuildListIndex(t.runtime.stores.lists, t.runtime.stores);
    expect(await ids('/v1/runs?limit=10')).toEqual([next, recent]);
  });
});
