import { expect } from 'vitest';
import type { TestApp } from './context.ts';
import { appendEvents, createRun, events, registerAgent, waitFinalized, type TestAgent } from './agents.ts';

export async function credit(t: TestApp, walletId: string, amount: number, currency = 'USD') {
  const res = await t.app.inject({
    method: 'POST',
    url: `/ops/wallets/${encodeURIComponent(walletId)}/credit`,
    headers: t.admin,
    payload: { amount, currency },
  });
  expect(res.statusCode, res.body).toBe(201);
  return res.json();
}

export async function balances(t: TestApp, auth: Record<string, string>, walletId: string, currency = 'USD') {
  const res = await t.app.inject({ method: 'GET', url: `/v1/wallets/${encodeURIComponent(walletId)}`, headers: auth });
  if (res.statusCode === 404) return { available: 0, escrow: 0 };
  return res.json().balances[currency] ?? { available: 0, escrow: 0 };
}

export interface Parties {
  payer: TestAgent;
  worker: TestAgent;
}

export async function parties(t: TestApp, auth: Record<string, string>, funds: number): Promise<Parties> {
  const payer = await registerAgent(t, auth);
  const worker = await registerAgent(t, auth);
  if (funds > 0) await credit(t, payer.agentId, funds);
  return { payer, worker };
}

/** A run with settlement terms whose evidence passes (accuracy 1) or fails (accuracy 0) `accuracy >= 0.9`, finalized. */
export async function finalizedRun(
  t: TestApp,
  auth: Record<string, string>,
  p: Parties,
  opts: { pass: boolean; amount: number; holdbackBps?: number; disputeWindowSeconds?: number; currency?: string },
): Promise<string> {
  const runId = await createRun(t, auth, {
    agentId: p.worker.agentId,
    terms: { accuracy: { min: 0.9 } },
    settlement: {
      payerAgentId: p.payer.agentId,
      amount: opts.amount,
      currency: opts.currency ?? 'USD',
      holdbackBps: opts.holdbackBps ?? 0,
      disputeWindowSeconds: opts.disputeWindowSeconds ?? 3600,
    },
  });
  const batch = events(runId, { seq: 0, chainHash: null }, p.worker, [
    { type: 'metric', payload: { name: 'accuracy', value: opts.pass ? 1 : 0 } },
  ]);
  expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
  expect((await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth })).statusCode).toBe(
    202,
  );
  await waitFinalized(t, auth, runId);
  return runId;
}

export async function settle(
  t: TestApp,
  auth: Record<string, string>,
  runId: string,
  body: Record<string, unknown> = {},
) {
  return t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/settle`, headers: auth, payload: body });
}

export async function waitSettlement(
  t: TestApp,
  auth: Record<string, string>,
  runId: string,
  until: (s: Record<string, any>) => boolean,
  timeoutMs = 20_000,
) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const res = await t.app.inject({ method: 'GET', url: `/runs/${runId}/settlement`, headers: auth });
    if (res.statusCode === 200 && until(res.json())) return res.json();
    if (Date.now() > deadline) throw new Error(`settlement of ${runId} not reached: ${res.body}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
