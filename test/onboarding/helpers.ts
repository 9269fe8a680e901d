import { expect } from 'vitest';
import type { QueueName } from '../../src/queues/index.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { freePort } from '../helpers/redis-instance.ts';

/** The app listening on a loopback port that config.publicBaseUrl names, as the smoke test and first paid call need. */
export async function startListeningApp(
  options: { overrides?: Record<string, string>; workers?: QueueName[] } = {},
): Promise<TestApp & { baseUrl: string }> {
  const port = await freePort();
  const baseUrl = `http://127.0.0.1:${port}`;
  const t = await startTestApp({
    workers: options.workers,
    overrides: { PUBLIC_BASE_URL: baseUrl, ...options.overrides },
  });
  await t.app.listen({ host: '127.0.0.1', port });
  return Object.assign(t, { baseUrl });
}

/** A tenant with a key holding only `onboarding`, used as `x-api-key`. */
export async function onboardingTenant(t: TestApp) {
  const tenant = await t.tenantWithKey(['onboarding']);
  return { ...tenant, headers: { 'x-api-key': tenant.token } };
}

export async function bootstrap(t: TestApp, tenantId: string, headers: Record<string, string>) {
  const res = await t.app.inject({
    method: 'POST',
    url: `/v1/tenants/${tenantId}/onboarding/runtime-bootstrap`,
    headers,
  });
  expect(res.statusCode, res.body).toBe(201);
  return res.json() as {
    tenantId: string;
    apiKey: { keyId: string; scopes: string[] };
    mcp: { command: string; args: string[]; env: Record<string, string> };
    mcpHttp: { type: 'http'; url: string; headers: { Authorization: string } };
    mcpConfigJson: string;
  };
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
