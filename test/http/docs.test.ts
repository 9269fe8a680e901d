import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

/** A newcomer opening the service in a browser finds the reference, rendered offline from the served document. */
describe('GET / and the API reference at /docs', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(() => t.close());

  it('answers / without credentials with where to go next', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    expect(res.json().links).toMatchObject({ docs: '/docs', openapi: '/openapi.json', health: '/healthz' });
  });

  it('serves /docs without credentials: a page rendering /openapi.json with a script this service serves', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/docs' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(res.body).toContain('spec-url="/openapi.json"');
    const scripts = [...res.body.matchAll(/<script src="([^"]+)"/g)].map((m) => m[1]!);
    expect(scripts).toEqual(['/docs/redoc.standalone.js']); // same origin: no CDN at run time
    expect(res.body).not.toMatch(/https?:\/\//);

    const bundle = await t.app.inject({ method: 'GET', url: scripts[0]! });
    expect(bundle.statusCode).toBe(200);
    expect(bundle.headers['content-type']).toMatch(/^application\/javascript/);
    expect(bundle.rawPayload.length).toBeGreaterThan(100_000);

    const document = await t.app.inject({ method: 'GET', url: '/openapi.json' });
    expect(document.statusCode).toBe(200);
    expect(document.json().paths['/docs'].get.operationId).toBe('getApiReference');
  });
});
