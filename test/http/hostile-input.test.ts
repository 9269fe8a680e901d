import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { appendEvents, createRun, events, registerAgent } from '../helpers/agents.ts';
import { balances, credit } from '../helpers/money.ts';

/** Every hostile request gets its 4xx in the contract's shape, with a requestId, and changes nothing. */
describe('hostile input', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp();
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
  });
  afterAll(() => t.close());

  const expectRefused = (
    res: { statusCode: number; json(): unknown; headers: Record<string, unknown> },
    status: number,
    code: string,
  ) => {
    expect(res.statusCode).toBe(status);
    expect(res.json()).toMatchObject({ code, message: expect.any(String), requestId: res.headers['x-request-id'] });
  };

  it('refuses invalid UTF-8, non-JSON media types and a body that is not JSON, creating nothing', async () => {
    const invalidUtf8 = Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"}')]);
    expectRefused(
      await t.app.inject({
        method: 'POST',
        url: '/ops/tenants',
        headers: { ...t.admin, 'content-type': 'application/json' },
        payload: invalidUtf8,
      }),
      400,
      'VALIDATION_FAILED',
    );
    for (const type of [
      'text/plain',
      'application/x-www-form-urlencoded',
      'application/xml',
      'multipart/form-data; boundary=x',
    ]) {
      expectRefused(
        await t.app.inject({
          method: 'POST',
          url: '/v1/runs',
          headers: { ...auth, 'content-type': type },
          payload: 'agentId=x',
        }),
        415,
        'UNSUPPORTED_MEDIA_TYPE',
      );
    }
    expectRefused(
      await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: { ...auth, 'content-type': 'application/json' },
        payload: '{"agentId":',
      }),
      400,
      'VALIDATION_FAILED',
    );
    expect(await t.runtime.db.collection('runs').countDocuments()).toBe(0);
  });

  it('refuses negative, fractional, beyond-2^53 and string amounts with 400, moving no money', async () => {
    const payer = await registerAgent(t, auth);
    const worker = await registerAgent(t, auth);
    await credit(t, payer.agentId, 1_000);
    for (const amount of [-1, 0, 1.5, 2 ** 53, 1e300, '100', null]) {
      const res = await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: auth,
        payload: { agentId: worker.agentId, settlement: { payerAgentId: payer.agentId, amount, currency: 'USD' } },
      });
      expectRefused(res, 400, 'VALIDATION_FAILED');
    }
    const overflow = await t.app.inject({
      method: 'POST',
      url: `/ops/wallets/${payer.agentId}/credit`,
      headers: { ...t.admin, 'content-type': 'application/json' },
      payload: '{"amount":9007199254740993,"currency":"USD"}',
    });
    expectRefused(overflow, 400, 'VALIDATION_FAILED');
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: 1_000, escrow: 0 });
  });

  it('keeps path traversal and encoded separators inside one id: not found, never another resource', async () => {
    const runId = await createRun(t, auth, { agentId: (await registerAgent(t, auth)).agentId });
    for (const id of ['..%2F..%2Fops%2Ftenants', `${runId}%2F..%2F..`, '%2e%2e', `${runId}%00`, 'run_%E2%80%AE']) {
      const res = await t.app.inject({ method: 'GET', url: `/v1/runs/${id}`, headers: auth });
      expect([400, 404], id).toContain(res.statusCode);
      expect(res.json()).toMatchObject({ requestId: expect.any(String) });
    }
  });

  it('refuses a signed event replayed into another run, leaving both chains as they were', async () => {
    const agent = await registerAgent(t, auth);
    const first = await createRun(t, auth, { agentId: agent.agentId });
    const second = await createRun(t, auth, { agentId: agent.agentId });
    const signed = events(first, { seq: 0, chainHash: null }, agent, [{ type: 'log', payload: { step: 1 } }]);
    expect((await appendEvents(t, auth, first, signed)).statusCode).toBe(201);
    const replayed = await appendEvents(t, auth, second, signed);
    expectRefused(replayed, 400, 'SIGNATURE_INVALID');
    expect(replayed.json()).toMatchObject({ details: { reason: 'RUN_MISMATCH' } });
    expect((await t.app.inject({ method: 'GET', url: `/v1/runs/${second}`, headers: auth })).json().head.seq).toBe(0);
  });

  it('refuses an idempotency key reused with another body (422) and a malformed key (400), creating once', async () => {
    const agent = await registerAgent(t, auth);
    const key = { ...auth, 'idempotency-key': 'hostile-reuse-1' };
    const created = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: key,
      payload: { agentId: agent.agentId },
    });
    expect(created.statusCode).toBe(201);
    expectRefused(
      await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: key,
        payload: { agentId: agent.agentId, terms: { accuracy: { min: 0.5 } } },
      }),
      422,
      'IDEMPOTENCY_KEY_REUSED',
    );
    expectRefused(
      await t.app.inject({
        method: 'POST',
        url: '/v1/runs',
        headers: { ...auth, 'idempotency-key': 'bad key with spaces' },
        payload: { agentId: agent.agentId },
      }),
      400,
      'INVALID_IDEMPOTENCY_KEY',
    );
    const runs = await t.runtime.db.collection('runs').countDocuments({ agentId: agent.agentId });
    expect(runs).toBe(1);
  });
});
