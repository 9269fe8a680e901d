import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

describe('HTTP platform', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  it('answers unknown routes with 404 NOT_FOUND in the contract body', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/v1/nothing-here' });
    expect(res.statusCode).toBe(404);
    expect(res.json()).toEqual({ code: 'NOT_FOUND', message: expect.any(String), requestId: expect.any(String) });
  });

  it('reports schema failures as 400 VALIDATION_FAILED with the failing paths, and stores nothing', async () => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/ops/tenants',
      headers: t.admin,
      payload: { name: '', extra: 1 },
    });
    expect(res.statusCode).toBe(400);
    const body = res.json();
    expect(body.code).toBe('VALIDATION_FAILED');
    const paths = body.details.errors.map((e: { path: string }) => e.path);
    expect(paths).toContain('body.name');
    expect(await t.runtime.db.collection('tenants').countDocuments()).toBe(0);
  });

  it('answers malformed JSON with 400, other media types with 415 and bodies over 1 MiB with 413', async () => {
    const bad = await t.app.inject({
      method: 'POST',
      url: '/ops/tenants',
      headers: { ...t.admin, 'content-type': 'application/json' },
      payload: '{"name":',
    });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().code).toBe('VALIDATION_FAILED');
    const text = await t.app.inject({
      method: 'POST',
      url: '/ops/tenants',
      headers: { ...t.admin, 'content-type': 'text/plain' },
      payload: 'hi',
    });
    expect(text.statusCode).toBe(415);
    expect(text.json().code).toBe('UNSUPPORTED_MEDIA_TYPE');
    const big = await t.app.inject({
      method: 'POST',
      url: '/ops/tenants',
      headers: { ...t.admin, 'content-type': 'application/json' },
      payload: JSON.stringify({ name: 'x'.repeat(1024 * 1024 + 10) }),
    });
    expect(big.statusCode).toBe(413);
    expect(big.json().code).toBe('BODY_TOO_LARGE');
  });

  it('echoes a sane x-request-id and replaces an unsafe one', async () => {
    const echoed = await t.app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': 'abc-123' } });
    expect(echoed.headers['x-request-id']).toBe('abc-123');
    const replaced = await t.app.inject({
      method: 'GET',
      url: '/healthz',
      headers: { 'x-request-id': 'bad id\u0000<script>' },
    });
    expect(replaced.headers['x-request-id']).toMatch(/^req_/);
  });

  it('reports liveness and readiness against the real servers', async () => {
    expect((await t.app.inject({ method: 'GET', url: '/healthz' })).json()).toEqual({ status: 'ok' });
    const ready = await t.app.inject({ method: 'GET', url: '/readyz' });
    expect(ready.statusCode).toBe(200);
    expect(ready.json()).toEqual({ status: 'ready', checks: { redis: true, mongo: true } });
  });

  it('exposes Prometheus metrics with per-route counts and queue depths', async () => {
    await t.app.inject({ method: 'GET', url: '/healthz' });
    const res = await t.app.inject({ method: 'GET', url: '/metrics' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^text\/plain/);
    expect(res.body).toMatch(/http_requests_total\{method="GET",route="\/healthz",status="200"\} \d+/);
    expect(res.body).toMatch(/http_request_duration_seconds_bucket\{[^}]*route="\/healthz"/);
    expect(res.body).toMatch(/queue_jobs\{queue="finalize",state="waiting"\} 0/);
  });

  it('serves Bull Board to the admin only', async () => {
    expect((await t.app.inject({ method: 'GET', url: '/admin/queues' })).statusCode).toBe(401);
    const tenantKey = await t.tenantWithKey(['runs:write']);
    expect((await t.app.inject({ method: 'GET', url: '/admin/queues', headers: tenantKey.auth })).statusCode).toBe(403);
    const page = await t.app.inject({ method: 'GET', url: '/admin/queues', headers: t.admin });
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('Agent Settlement queues');
    const api = await t.app.inject({ method: 'GET', url: '/admin/queues/api/queues', headers: t.admin });
    expect(api.statusCode).toBe(200);
    expect(
      api
        .json()
        .queues.map((q: { name: string }) => q.name)
        .sort(),
    ).toEqual(['finalize', 'settle', 'smoke-test', 'webhook-dispatch', 'x402-verify']);
  });

  it('never puts secrets in logs: the auth header and tokens are redacted', async () => {
    const lines: string[] = [];
    const { pino } = await import('pino');
    const { REDACT_PATHS } = await import('../../src/logger.ts');
    const capture = pino(
      { redact: { paths: REDACT_PATHS, censor: '[redacted]' } },
      { write: (s: string) => lines.push(s) },
    );
    capture.info(
      {
        req: { headers: { authorization: 'Bearer sk_key_x.SECRET1' } },
        body: { token: 'SECRET2', secret: 'whsec_SECRET3' },
      },
      'hello',
    );
    expect(lines.join('')).not.toMatch(/SECRET/);
    expect(lines.join('')).toContain('[redacted]');
  });
  it('answers a method the path does not have with 405 and Allow, even a bodiless QUERY, and an over-long id with 400', async () => {
    const { auth } = await t.tenantWithKey(['runs:write']);
    for (const method of ['DELETE', 'PUT', 'QUERY'] as const) {
      const res = await t.app.inject({ method: method as 'DELETE', url: '/v1/runs/run_x/finalize', headers: auth });
      expect(res.statusCode, method).toBe(405);
      expect(res.headers.allow).toBe('POST');
      expect(res.json()).toMatchObject({ code: 'METHOD_NOT_ALLOWED', requestId: expect.any(String) });
    }
    const long = await t.app.inject({ method: 'GET', url: `/v1/runs/${'r'.repeat(300)}`, headers: auth });
    expect(long.statusCode).toBe(400);
    expect(long.json()).toMatchObject({ code: 'VALIDATION_FAILED', details: { errors: [{ path: 'params.runId' }] } });
  });
});
