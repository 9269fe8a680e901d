import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { finalizeRun } from '../../src/services/runs.ts';
import { advanceSettlement, sweepSettlements } from '../../src/services/settlement.ts';
import { WORK_STEPS } from '../../src/services/work-log.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { appendEvents, createRun, events, waitFinalized } from '../helpers/agents.ts';
import { parties, settle, waitSettlement } from '../helpers/money.ts';

// Logs that follow the work: the log lines a real service (app + finalize and settle workers, the process logger
// with its redaction) writes for a run from its start to its settlement, read back as an operator would. One line
// per finished step, in order, with the tenant, the ids and the amounts; request lines name the tenant and key;
// no token, secret, signature or key anywhere.

interface Line {
  msg: string;
  level: number;
  [field: string]: unknown;
}

describe('logs that follow the work', () => {
  let t: TestApp;
  let captured = '';
  const lines = (): Line[] =>
    captured
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Line);
  beforeAll(async () => {
    const sink = new Writable({
      write(chunk, _enc, done) {
        captured += chunk.toString();
        done();
      },
    });
    t = await startTestApp({
      workers: ['finalize', 'settle'],
      // Sweepers look at everything at once, so a repeated pass over a finished step would show here as a second line.
      overrides: { LOG_LEVEL: 'info', SWEEP_INTERVAL_MS: '300', SWEEP_STALE_AFTER_MS: '0' },
      logTo: sink,
    });
  });
  afterAll(() => t.close());

  it('reads a run from start to settlement: one line per step with ids and amounts, never a secret', async () => {
    const { tenantId, keyId, token, auth } = await t.tenantWithKey([
      'agents:write',
      'runs:write',
      'wallets:write',
      'webhooks:write',
    ]);
    const webhook = await t.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { url: 'https://hooks.example.com/in', events: ['settlement.completed'] },
    });
    expect(webhook.statusCode, webhook.body).toBe(201);
    const p = await parties(t, auth, 10_000);
    const runId = await createRun(t, auth, {
      agentId: p.worker.agentId,
      terms: { accuracy: { min: 0.9 } },
      settlement: {
        payerAgentId: p.payer.agentId,
        amount: 1_000,
        currency: 'USD',
        holdbackBps: 1_500,
        disputeWindowSeconds: 2,
      },
    });
    const batch = events(runId, { seq: 0, chainHash: null }, p.worker, [
      { type: 'metric', payload: { name: 'accuracy', value: 1 } },
    ]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    expect((await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth })).statusCode).toBe(
      202,
    );
    const run = await waitFinalized(t, auth, runId);
    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    const settled = await waitSettlement(t, auth, runId, (s) => s.holdbackState === 'released');
    // The jobs run again (at-least-once) and the sweeper passes over the settlement: nothing is logged again.
    expect(await finalizeRun(t.runtime, tenantId, runId)).toMatchObject({ verdict: 'pass' });
    expect(await advanceSettlement(t.runtime, settled.settlementId)).toBeTruthy();
    await sweepSettlements(t.runtime, 100);

    const steps = lines().filter((l) => (WORK_STEPS as readonly string[]).includes(l.msg) && l.tenantId === tenantId);
    expect(steps.every((l) => l.level === 30)).toBe(true); // info
    const ids = { runId, gateId: null, sessionId: null, settlementId: settled.settlementId };
    expect(
      steps.map(({ msg, level: _l, time: _t, pid: _p, hostname: _h, name: _n, service: _s, ...rest }) => ({
        msg,
        ...rest,
      })),
    ).toEqual([
      {
        msg: 'run.finalized',
        tenantId,
        runId,
        agentId: p.worker.agentId,
        verdict: 'pass',
        artifactId: run.artifactId,
        events: 1,
        error: null,
      },
      {
        msg: 'settlement.decided',
        tenantId,
        ...ids,
        verdict: 'pass',
        reason: null,
        amount: 1_000,
        captured: 1_000,
        releaseNow: 850,
        holdback: 150,
        currency: 'USD',
      },
      {
        msg: 'settlement.released',
        tenantId,
        ...ids,
        entryId: expect.any(String),
        kind: 'settlement_release',
        toPayee: 850,
        toPayer: 0,
        currency: 'USD',
      },
      {
        msg: 'settlement.released',
        tenantId,
        ...ids,
        entryId: expect.any(String),
        kind: 'holdback_release',
        toPayee: 150,
        toPayer: 0,
        currency: 'USD',
      },
    ]);

    // Request lines name who acted: the tenant and the key id (never the token).
    const requests = lines().filter((l) => l.msg === 'request completed');
    const settleLine = requests.find(
      (l) =>
        (l.req as { url: string }).url === `/v1/runs/${runId}/settle` &&
        (l.req as { method: string }).method === 'POST',
    );
    expect(settleLine).toMatchObject({ tenantId, keyId, res: { statusCode: 202 } });
    const adminLine = requests.find((l) => (l.req as { url: string }).url === '/ops/tenants');
    expect(adminLine).toMatchObject({ keyId: 'admin' });
    expect(adminLine).not.toHaveProperty('tenantId');
    const handlerLine = lines().find((l) => l.msg === 'webhook endpoint created');
    expect(handlerLine).toMatchObject({ tenantId, keyId, endpointId: webhook.json().id });

    // No secret in any line: the API token (and its secret part), the admin key, the webhook secret, the event
    // signatures, the settlement receipt's signature.
    const log = captured;
    const receipt = (await t.app.inject({ method: 'GET', url: `/runs/${runId}/settlement`, headers: auth })).json()
      .receipt as { signature: { value: string } };
    const secrets = [
      token,
      token.split('.').at(-1)!,
      t.env.adminKey,
      webhook.json().secret as string,
      ...batch.map((e) => e.signature),
      receipt.signature.value,
    ];
    for (const secret of secrets) {
      expect(secret.length).toBeGreaterThan(20);
      expect(log.includes(secret), `a secret (${secret.slice(0, 6)}…) is in the log`).toBe(false);
    }
  });
});
