import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { CountingReceiver } from './receiver.ts';
import {
  call,
  createRunWithEvidence,
  createTenant,
  credit,
  eventually,
  must,
  registerAgent,
  ServiceProcess,
  serviceEnv,
} from './service.ts';

/** The pieces of a secret that must never be logged: the whole, and for a PEM its base64 body and each long line. */
function needles(secret: string): string[] {
  if (!secret.includes('-----BEGIN')) return [secret];
  const lines = secret.split('\n').filter((l) => l && !l.startsWith('-----'));
  return [lines.join(''), ...lines.filter((l) => l.length >= 16)];
}

describe('no secret in any log line of an end-to-end run (API and worker at debug level)', () => {
  const processes: ServiceProcess[] = [];
  const receiver = new CountingReceiver();
  beforeAll(async () => {
    await receiver.start();
  });
  afterAll(async () => {
    for (const p of processes) await p.stop().catch(() => undefined);
    await receiver.close();
  });

  it('logs the whole flow without an API key, webhook secret, admin key or private key', async () => {
    const mongoUrl = new URL(inject('mongoUrl'));
    mongoUrl.pathname = `/f_logs_${randomBytes(4).toString('hex')}`;
    const env = serviceEnv(mongoUrl.toString(), inject('redisUrl'), { LOG_LEVEL: 'debug' });
    const api = await ServiceProcess.start('api', env);
    const worker = await ServiceProcess.start('worker', env);
    processes.push(api, worker);
    const base = api.url;
    const admin = env.SERVICE_ADMIN_KEY!;

    const tenant = await createTenant(base, admin);
    const hook = await must(base, 'POST', '/v1/webhooks', 201, {
      headers: tenant.auth,
      body: { url: receiver.url, events: ['run.finalized', 'settlement.completed', 'settlement.held'] },
    });
    receiver.secret = hook.secret;
    const rotated = await must(base, 'POST', `/v1/webhooks/${hook.id}/rotate-secret`, 200, {
      headers: tenant.auth,
      body: { gracePeriodSeconds: 60 },
    }).catch(() => null);
    const payer = await registerAgent(base, tenant);
    const payee = await registerAgent(base, tenant);
    await credit(base, admin, payer.agentId, 10_000);
    const runId = await createRunWithEvidence(base, tenant, payer, payee, { pass: true, amount: 500 });
    await must(base, 'POST', `/v1/runs/${runId}/finalize`, 202, { headers: tenant.auth });
    await eventually(
      async () => (await call(base, 'GET', `/v1/runs/${runId}`, { headers: tenant.auth })).body?.status === 'finalized',
      60_000,
      'finalized',
    );
    await must(base, 'POST', `/v1/runs/${runId}/settle`, 202, {
      headers: { ...tenant.auth, 'idempotency-key': 'settle-1' },
      body: {},
    });
    await eventually(() => receiver.count('settlement.*') === 1, 60_000, 'the settlement event delivered');
    // The same request replayed from the idempotency store (its body sealed at rest), and refusals that log.
    await must(base, 'POST', `/v1/runs/${runId}/settle`, 202, {
      headers: { ...tenant.auth, 'idempotency-key': 'settle-1' },
      body: {},
    });
    expect(
      (await call(base, 'GET', `/v1/runs/${runId}`, { headers: { authorization: `Bearer ${tenant.token}x` } })).status,
    ).toBe(401);
    expect((await call(base, 'GET', '/ops/tenants', { headers: { authorization: `Bearer ${admin}x` } })).status).toBe(
      401,
    );
    expect((await call(base, 'GET', '/v1/runs/x', { headers: { 'x-api-key': admin } })).status).toBe(401);
    await call(base, 'GET', '/admin/queues', {
      headers: { authorization: `Basic ${Buffer.from(`ops:${admin}`).toString('base64')}` },
    });

    await api.stop();
    await worker.stop();
    const logs = api.logs + worker.logs;
    expect(logs.split('\n').filter(Boolean).length, 'debug logging produced lines').toBeGreaterThan(20);
    const secrets: Record<string, string> = {
      'admin key': admin,
      'API key token': tenant.token,
      'API key secret': tenant.token.split('.')[1]!,
      'webhook secret': hook.secret,
      'webhook secret bytes': hook.secret.replace(/^whsec_/, ''),
      ...(rotated?.secret ? { 'rotated webhook secret': rotated.secret } : {}),
      'service signing key': env.SERVICE_SIGNING_KEY!,
      'payer private key': payer.privateKeyPem,
      'payee private key': payee.privateKeyPem,
    };
    const leaks = Object.entries(secrets).flatMap(([name, secret]) =>
      needles(secret)
        .filter((n) => logs.includes(n))
        .map(() => name),
    );
    expect([...new Set(leaks)]).toEqual([]);
  }, 180_000);
});
