import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from './harness.ts';

// The registry with the service's default test configuration: https only, no private addresses.
describe('webhook endpoint registry', () => {
  let h: Harness;
  let auth: Record<string, string>;
  beforeAll(async () => {
    h = await startHarness();
    ({ auth } = await h.tenantWithKey());
  });
  afterAll(() => h.close());

  const create = (payload: unknown, headers = auth, url = '/v1/webhooks') =>
    h.app.inject({ method: 'POST', url, headers, payload: payload as object });
  const get = (url: string, headers = auth) => h.app.inject({ method: 'GET', url, headers });

  it('registers an endpoint and shows its secret once; lists never show it; it is encrypted at rest', async () => {
    const res = await create({
      url: 'https://hooks.example.com/in',
      events: ['run.finalized', 'settlement.held'],
      description: 'books',
    });
    expect(res.statusCode).toBe(201);
    const body = res.json();
    expect(body).toMatchObject({
      id: expect.stringMatching(/^whe_[A-Za-z0-9]{24}$/),
      url: 'https://hooks.example.com/in',
      events: ['run.finalized', 'settlement.held'],
      status: 'active',
      secret: expect.stringMatching(/^whsec_[A-Za-z0-9+/]{43}=$/),
      createdAt: expect.any(String),
    });
    const secretPart = body.secret.slice('whsec_'.length);

    const list = await get('/v1/webhooks');
    expect(list.statusCode).toBe(200);
    expect(list.json().items.find((e: { id: string }) => e.id === body.id)).toMatchObject({
      url: body.url,
      status: 'active',
      description: 'books',
    });
    expect(list.body).not.toContain(secretPart);
    expect(list.body).not.toContain('"secret"');
    const one = await get(`/v1/webhooks/${body.id}`);
    expect(one.body).not.toContain(secretPart);

    const stored = await h.runtime.db.collection('webhook_endpoints').findOne({ _id: body.id });
    expect(stored).not.toBeNull();
    expect(JSON.stringify(stored)).not.toContain(secretPart);
  });

  it('refuses unknown event types with 422 VALIDATION_FAILED naming them (400 for an empty list, which the schema forbids)', async () => {
    const res = await create({
      url: 'https://hooks.example.com/in',
      events: ['run.finalized', 'run.started', 'money.moved'],
    });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { unknownEventTypes: ['run.started', 'money.moved'] },
    });
    expect(res.json().message).toContain('run.started');
    expect(res.json().message).toContain('money.moved');
    expect(res.json().details.errors).toEqual([
      { path: 'body.events.1', message: 'unknown event type "run.started"' },
      { path: 'body.events.2', message: 'unknown event type "money.moved"' },
    ]);
    expect((await create({ url: 'https://hooks.example.com/in', events: [] })).statusCode).toBe(400);
  });

  it('refuses http URLs (insecure webhooks are not allowed here), credentials and private address literals', async () => {
    for (const url of [
      'http://hooks.example.com/in',
      'ftp://hooks.example.com/in',
      'not a url',
      'https://user:pw@hooks.example.com/',
      'https://127.0.0.1/in',
      'https://10.1.2.3/in',
      'https://[::1]/in',
      'https://169.254.169.254/latest',
    ]) {
      const res = await create({ url, events: ['run.finalized'] });
      expect(res.statusCode, url).toBe(422); // a string the schema allows, refused by the URL rules
      expect(res.json().code).toBe('VALIDATION_FAILED');
      expect(res.json().details.errors[0].path).toBe('body.url');
    }
  });

  it("keeps tenants apart: another tenant's endpoint is 404 everywhere and absent from its list", async () => {
    const mine = (await create({ url: 'https://hooks.example.com/a', events: ['dispute.opened'] })).json();
    const other = await h.tenantWithKey();
    expect((await get(`/v1/webhooks/${mine.id}`, other.auth)).statusCode).toBe(404);
    expect((await get(`/v1/webhooks/${mine.id}/deliveries`, other.auth)).statusCode).toBe(404);
    expect(
      (await h.app.inject({ method: 'DELETE', url: `/v1/webhooks/${mine.id}`, headers: other.auth })).statusCode,
    ).toBe(404);
    expect(
      (
        await h.app.inject({
          method: 'POST',
          url: `/v1/webhooks/${mine.id}/rotate-secret`,
          headers: other.auth,
          payload: {},
        })
      ).statusCode,
    ).toBe(404);
    expect(
      (await h.app.inject({ method: 'POST', url: `/v1/webhooks/${mine.id}/enable`, headers: other.auth })).statusCode,
    ).toBe(404);
    expect(
      (
        await h.app.inject({
          method: 'POST',
          url: `/x402/webhooks/endpoints/${mine.id}/rotate-secret`,
          headers: other.auth,
          payload: {},
        })
      ).statusCode,
    ).toBe(404);
    expect((await get('/v1/webhooks', other.auth)).json().items).toEqual([]);
    // Still there and unchanged for its owner.
    expect((await get(`/v1/webhooks/${mine.id}`)).json()).toMatchObject({
      id: mine.id,
      status: 'active',
      previousSecretExpiresAt: null,
    });
  });

  it('requires a webhooks scope on every webhook route (webhooks:write to change, webhooks:read to look)', async () => {
    const reader = await h.tenantWithKey(['runs:read']);
    expect((await get('/v1/webhooks', reader.auth)).statusCode).toBe(403);
    expect(
      (await create({ url: 'https://hooks.example.com/a', events: ['run.finalized'] }, reader.auth)).statusCode,
    ).toBe(403);
    expect((await get('/x402/webhooks/endpoints', reader.auth)).statusCode).toBe(403);
    expect((await get('/v1/webhooks', {})).statusCode).toBe(401);
  });

  it('rotates the secret with a grace period (default one day, at most seven) and shows the new one once', async () => {
    const ep = (await create({ url: 'https://hooks.example.com/r', events: ['run.finalized'] })).json();
    const rotated = await h.app.inject({ method: 'POST', url: `/v1/webhooks/${ep.id}/rotate-secret`, headers: auth });
    expect(rotated.statusCode).toBe(200);
    const body = rotated.json();
    expect(body.secret).toMatch(/^whsec_/);
    expect(body.secret).not.toBe(ep.secret);
    const graceEnds = Date.parse(body.previousSecretExpiresAt) - Date.now();
    expect(graceEnds).toBeGreaterThan(86_390_000);
    expect(graceEnds).toBeLessThanOrEqual(86_400_000);

    const tooLong = await h.app.inject({
      method: 'POST',
      url: `/v1/webhooks/${ep.id}/rotate-secret`,
      headers: auth,
      payload: { gracePeriodSeconds: 604_801 },
    });
    expect(tooLong.statusCode).toBe(400);
    const noGrace = await h.app.inject({
      method: 'POST',
      url: `/v1/webhooks/${ep.id}/rotate-secret`,
      headers: auth,
      payload: { gracePeriodSeconds: 0 },
    });
    // The secret from the first rotation is dropped at once; the original one keeps its own grace period.
    expect(noGrace.json().previousSecretExpiresAt).toBe(body.previousSecretExpiresAt);
    const stored = await h.runtime.db.collection('webhook_endpoints').findOne({ _id: ep.id });
    expect(stored!.secrets).toHaveLength(2);
    expect((await get(`/v1/webhooks/${ep.id}`)).body).not.toContain(noGrace.json().secret.slice(6));
  });

  it('serves the same registry under /x402/webhooks/endpoints', async () => {
    const res = await create(
      { url: 'https://hooks.example.com/x402', events: ['x402.escalation.created', 'x402.agent.wound_down'] },
      auth,
      '/x402/webhooks/endpoints',
    );
    expect(res.statusCode).toBe(201);
    const ep = res.json();
    expect(ep).toMatchObject({
      id: expect.stringMatching(/^whe_/),
      status: 'active',
      secret: expect.stringMatching(/^whsec_/),
    });
    expect((await get('/v1/webhooks?limit=100')).json().items.map((e: { id: string }) => e.id)).toContain(ep.id);
    expect((await get('/x402/webhooks/endpoints?limit=100')).json().items.map((e: { id: string }) => e.id)).toContain(
      ep.id,
    );
    const rotated = await h.app.inject({
      method: 'POST',
      url: `/x402/webhooks/endpoints/${ep.id}/rotate-secret`,
      headers: auth,
      payload: { gracePeriodSeconds: 60 },
    });
    expect(rotated.statusCode).toBe(200);
    expect(rotated.json().secret).not.toBe(ep.secret);
    expect(
      (
        await create(
          { url: 'http://hooks.example.com/x402', events: ['x402.escalation.created'] },
          auth,
          '/x402/webhooks/endpoints',
        )
      ).statusCode,
    ).toBe(422);
  });

  it('deletes an endpoint: 204, then 404 and gone from the list', async () => {
    const ep = (await create({ url: 'https://hooks.example.com/d', events: ['run.finalized'] })).json();
    const del = await h.app.inject({ method: 'DELETE', url: `/v1/webhooks/${ep.id}`, headers: auth });
    expect(del.statusCode).toBe(204);
    expect((await get(`/v1/webhooks/${ep.id}`)).statusCode).toBe(404);
    expect((await h.app.inject({ method: 'DELETE', url: `/v1/webhooks/${ep.id}`, headers: auth })).statusCode).toBe(
      404,
    );
    expect(
      (await h.app.inject({ method: 'POST', url: `/v1/webhooks/${ep.id}/rotate-secret`, headers: auth, payload: {} }))
        .statusCode,
    ).toBe(404);
    expect((await get('/v1/webhooks?limit=100')).json().items.map((e: { id: string }) => e.id)).not.toContain(ep.id);
  });

  it('pages the list with limit and cursor, newest first, without repeats', async () => {
    const tenant = await h.tenantWithKey();
    const ids: string[] = [];
    for (let i = 0; i < 5; i++)
      ids.push(
        (await create({ url: `https://hooks.example.com/${i}`, events: ['run.finalized'] }, tenant.auth)).json().id,
      );
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const page: { items: Array<{ id: string }>; nextCursor: string | null } = (
        await get(`/v1/webhooks?limit=2${cursor ? `&cursor=${cursor}` : ''}`, tenant.auth)
      ).json();
      seen.push(...page.items.map((e) => e.id));
      cursor = page.nextCursor;
    } while (cursor);
    expect(seen).toEqual([...ids].reverse());
    expect((await get('/v1/webhooks?cursor=%%%', tenant.auth)).statusCode).toBe(400);
  });

  it('never writes a secret to the logs', async () => {
    const ep = (await create({ url: 'https://hooks.example.com/log', events: ['run.finalized'] })).json();
    const rotated = (
      await h.app.inject({ method: 'POST', url: `/v1/webhooks/${ep.id}/rotate-secret`, headers: auth, payload: {} })
    ).json();
    await get('/v1/webhooks');
    const logs = h.logs();
    expect(logs).toContain(ep.id); // the log lines exist and name the endpoint...
    for (const secret of [ep.secret, rotated.secret]) expect(logs).not.toContain(secret.slice(6)); // ...but never a secret
  });
});
