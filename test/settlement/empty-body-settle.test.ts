import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { finalizedRun, parties, waitSettlement } from '../helpers/money.ts';

// The settle body is optional (CONTRACT §7: it may carry `settlement` when the run had none). A client that sends no
// body, with or without `Content-Type: application/json`, settles; before, the header alone made it a 400.
describe('settle with an empty body', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize', 'settle'] });
    ({ auth } = await t.tenantWithKey(['agents:write', 'runs:write']));
  });
  afterAll(() => t.close());

  for (const [label, headers] of [
    ['Content-Type: application/json and no bytes', { 'content-type': 'application/json' }],
    ['no Content-Type and no bytes', {}],
  ] as const) {
    it(`is 202 and pays the worker: ${label}`, { timeout: 60_000 }, async () => {
      const p = await parties(t, auth, 1_000);
      const runId = await finalizedRun(t, auth, p, { pass: true, amount: 400 });
      const res = await t.app.inject({
        method: 'POST',
        url: `/v1/runs/${runId}/settle`,
        headers: { ...auth, ...headers },
      });
      expect(res.statusCode, res.body).toBe(202);
      expect(res.json()).toMatchObject({ runId, status: 'pending' });
      const settled = await waitSettlement(t, auth, runId, (s) => s.status === 'completed');
      expect(settled).toMatchObject({ amount: 400, releasedAmount: 400 });
    });
  }

  it('still answers a route whose body is required with 400 naming the body, not "not valid JSON"', async () => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: { ...auth, 'content-type': 'application/json' },
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'body', message: 'expected an object with agentId, got no body (or null)' }] },
    });
    const broken = await t.app.inject({
      method: 'POST',
      url: '/v1/runs',
      headers: { ...auth, 'content-type': 'application/json' },
      payload: '{"agentId":',
    });
    expect(broken.json()).toMatchObject({ code: 'VALIDATION_FAILED', message: 'the body is not valid JSON' });
  });
});
