import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { createRun, registerAgent } from '../helpers/agents.ts';

/**
 * What schemathesis found where the service and openapi/openapi.json disagreed, each pinned by a test: what the
 * schema forbids is 400, what it allows but a rule refuses is 422, a fixed path has only its own methods.
 */
describe('the service does what the document says', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp();
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'runs:read', 'x402:write', 'webhooks:write'])).auth;
  });
  afterAll(() => t.close());

  it('refuses query values that are not written as their type (TypeBox alone read ?limit=true as 1)', async () => {
    for (const limit of ['true', '', '1.5', '0x10', '1e1']) {
      const res = await t.app.inject({ method: 'GET', url: `/v1/webhooks?limit=${limit}`, headers: auth });
      expect(res.statusCode, `limit=${limit}`).toBe(400);
      expect(res.json()).toMatchObject({ code: 'VALIDATION_FAILED', requestId: expect.any(String) });
    }
    expect((await t.app.inject({ method: 'GET', url: '/v1/webhooks?limit=2', headers: auth })).statusCode).toBe(200);
  });

  it("answers 405 with the fixed path's own methods where a parametric route would also match", async () => {
    const get = await t.app.inject({ method: 'GET', url: '/x402/gate/create', headers: auth });
    expect(get.statusCode).toBe(405);
    expect(get.headers.allow).toBe('POST');
    const options = await t.app.inject({ method: 'OPTIONS', url: '/x402/gate/authorize-payment', headers: auth });
    expect(options.statusCode).toBe(405);
    expect(options.headers.allow).toBe('POST');
    // The parametric route itself still answers for real ids.
    expect((await t.app.inject({ method: 'GET', url: '/x402/gate/gate_none', headers: auth })).statusCode).toBe(404);
    // Long ids reach the method check too (the router's own parameter limit is the app's).
    const long = await t.app.inject({ method: 'PUT', url: `/runs/${'0'.repeat(128)}/settlement`, headers: auth });
    expect(long.statusCode).toBe(405);
    expect(long.headers.allow).toBe('GET, HEAD');
  });

  it('refuses a body with a "__proto__" key with 422 (valid JSON, refused by rule), creating nothing', async () => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: { ...auth, 'content-type': 'application/json' },
      payload: '{"url":"https://hooks.example.com/","events":["run.finalized"],"x":{"__proto__":{"admin":true}}}',
    });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ code: 'VALIDATION_FAILED', requestId: expect.any(String) });
    expect((await t.app.inject({ method: 'GET', url: '/v1/webhooks', headers: auth })).json().items).toEqual([]);
  });

  it('takes a settle without a body, as the document marks the body optional, and refuses a JSON null', async () => {
    const agent = await registerAgent(t, auth);
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    const none = await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/settle`, headers: auth });
    expect(none.statusCode).not.toBe(400); // reaches the run: 409, it is not finalized
    expect(none.json().code).toBe('TRANSITION_ILLEGAL');
    const nullBody = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${runId}/settle`,
      headers: { ...auth, 'content-type': 'application/json' },
      payload: 'null',
    });
    expect(nullBody.statusCode).toBe(400);
  });

  it('answers a second rotation of the same key 409 TRANSITION_ILLEGAL, not 404: the key exists', async () => {
    const { tenantId } = await t.tenantWithKey(['runs:read']);
    const issued = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId, scopes: ['runs:read'] },
    });
    const keyId = issued.json().keyId;
    expect(
      (await t.app.inject({ method: 'POST', url: `/ops/api-keys/${keyId}/rotate`, headers: t.admin })).statusCode,
    ).toBe(201);
    const again = await t.app.inject({ method: 'POST', url: `/ops/api-keys/${keyId}/rotate`, headers: t.admin });
    expect(again.statusCode).toBe(409);
    expect(again.json()).toMatchObject({ code: 'TRANSITION_ILLEGAL', details: { status: 'rotated' } });
    expect(
      (await t.app.inject({ method: 'POST', url: '/ops/api-keys/key_none/rotate', headers: t.admin })).statusCode,
    ).toBe(404);
  });
});
