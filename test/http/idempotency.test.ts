import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('Idempotency-Key (Redis, shared by every API process)', () => {
  let t: TestApp;
  let other: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
    other = await startTestApp({ env: t.env, dropOnClose: false }); // a second API process on the same Redis and DB
  });
  afterAll(async () => {
    await other.close();
    await t.close();
  });

  const createTenant = (app: TestApp, key: string, name: string, header = 'idempotency-key') =>
    app.app.inject({ method: 'POST', url: '/ops/tenants', headers: { ...t.admin, [header]: key }, payload: { name } });

  it('replays the first status and body with Idempotent-Replayed, from any API process, and creates once', async () => {
    const first = await createTenant(t, 'create-acme-1', 'acme');
    expect(first.statusCode).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const again = await createTenant(other, 'create-acme-1', 'acme');
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.json()).toEqual(first.json());
    expect(await t.runtime.db.collection('tenants').countDocuments({ name: 'acme' })).toBe(1);
  });

  it('keeps replayable responses encrypted in Redis, so a token shown once is not stored in the clear', async () => {
    const tenant = (await createTenant(t, 'for-key', 'keyed')).json();
    const issued = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: { ...t.admin, 'idempotency-key': 'issue-1' },
      payload: { tenantId: tenant.tenantId, scopes: ['runs:read'] },
    });
    const token = issued.json().token as string;
    const keys = await t.runtime.redis.keys(`${t.env.redisPrefix}:idem:*issue-1`);
    expect(keys).toHaveLength(1);
    const stored = (await t.runtime.redis.get(keys[0]!))!;
    expect(stored).not.toContain(token.split('.')[1]);
    expect(stored).not.toContain(tenant.tenantId);
    const replay = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: { ...t.admin, 'idempotency-key': 'issue-1' },
      payload: { tenantId: tenant.tenantId, scopes: ['runs:read'] },
    });
    expect(replay.json().token).toBe(token);
  });

  it('accepts x-idempotency-key and the quoted structured-field form as the same key', async () => {
    const first = await createTenant(t, 'quoted-1', 'q', 'x-idempotency-key');
    const quoted = await createTenant(t, '"quoted-1"', 'q');
    expect(quoted.headers['idempotent-replayed']).toBe('true');
    expect(quoted.json().tenantId).toBe(first.json().tenantId);
  });

  it('answers 422 IDEMPOTENCY_KEY_REUSED when the same key carries another request, and changes nothing', async () => {
    await createTenant(t, 'reuse-1', 'first');
    const res = await createTenant(t, 'reuse-1', 'second');
    expect(res.statusCode).toBe(422);
    expect(res.json().code).toBe('IDEMPOTENCY_KEY_REUSED');
    expect(await t.runtime.db.collection('tenants').countDocuments({ name: 'second' })).toBe(0);
  });

  it('answers 409 IDEMPOTENCY_IN_PROGRESS to a concurrent duplicate, and still creates exactly once', async () => {
    const pairs = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        Promise.all([createTenant(t, `race-${i}`, `race-${i}`), createTenant(other, `race-${i}`, `race-${i}`)]),
      ),
    );
    let inProgress = 0;
    for (const pair of pairs) {
      const fresh = pair.filter((r) => r.statusCode === 201 && r.headers['idempotent-replayed'] === undefined);
      expect(fresh).toHaveLength(1);
      for (const r of pair) {
        if (r === fresh[0]) continue;
        if (r.statusCode === 409) {
          expect(r.json().code).toBe('IDEMPOTENCY_IN_PROGRESS');
          expect(r.headers['retry-after']).toBe('1');
          inProgress++;
        } else {
          expect(r.headers['idempotent-replayed']).toBe('true');
        }
      }
    }
    expect(inProgress).toBeGreaterThan(0);
    expect(await t.runtime.db.collection('tenants').countDocuments({ name: /^race-/ })).toBe(20);
  });

  it('answers 400 INVALID_IDEMPOTENCY_KEY to a malformed key and stores nothing', async () => {
    for (const bad of ['has space', 'x'.repeat(256), 'semi;colon', '""']) {
      const res = await createTenant(t, bad, 'bad-key');
      expect(res.statusCode).toBe(400);
      expect(res.json().code).toBe('INVALID_IDEMPOTENCY_KEY');
    }
    expect(await t.runtime.db.collection('tenants').countDocuments({ name: 'bad-key' })).toBe(0);
  });

  it('stores nothing for a request that fails validation, so a corrected retry with the same key runs', async () => {
    const invalid = await createTenant(t, 'fix-me', '');
    expect(invalid.statusCode).toBe(400);
    const fixed = await createTenant(t, 'fix-me', 'fixed');
    expect(fixed.statusCode).toBe(201);
    expect(fixed.headers['idempotent-replayed']).toBeUndefined();
  });

  it('scopes keys by credential: another caller using the same key string is a new request', async () => {
    const ops = await t.tenantWithKey(['ops']);
    const mine = await createTenant(t, 'shared-key', 'mine');
    const theirs = await t.app.inject({
      method: 'POST',
      url: '/ops/tenants',
      headers: { ...ops.auth, 'idempotency-key': 'shared-key' },
      payload: { name: 'theirs' },
    });
    expect(theirs.statusCode).toBe(201);
    expect(theirs.json().tenantId).not.toBe(mine.json().tenantId);
  });
});
