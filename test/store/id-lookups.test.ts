import type { CommandStartedEvent } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RECONCILIATION_COMMENT } from '../../src/store/mongo.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { balances, credit, finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';
import { DELIVERY_OVERRIDES, startReceiver, type Receiver } from '../webhooks/harness.ts';

/**
 * On FerretDB only a filter that is exactly `{_id: <string>}` uses an index; anything else reads the whole
 * collection, so its cost grows with everything ever stored. This drives the whole flow with the driver's command
 * monitoring on and lists every command on a collection that grows with use whose filter is anything else.
 */
const FILTERED = ['find', 'update', 'delete', 'findAndModify', 'count', 'distinct', 'aggregate'] as const;

/**
 * Only a due index's rare, bounded reconciliation pass (marked with RECONCILIATION_COMMENT) may scan. The due
 * indexes themselves are no exception: a settlement's record waits in one for its whole dispute window.
 */

function filtersOf(e: CommandStartedEvent): unknown[] {
  const c = e.command;
  switch (e.commandName) {
    case 'find':
    case 'count':
    case 'distinct':
      return [c.filter ?? c.query ?? {}];
    case 'update':
    case 'delete':
      return (c.updates ?? c.deletes ?? []).map((u: { q: unknown }) => u.q);
    case 'findAndModify':
      return [c.query ?? {}];
    default:
      return [{ pipeline: c.pipeline }]; // aggregate: never a point lookup
  }
}

function isPointLookup(filter: unknown): boolean {
  if (typeof filter !== 'object' || filter === null) return false;
  const keys = Object.keys(filter);
  return keys.length === 1 && keys[0] === '_id' && typeof (filter as { _id: unknown })._id === 'string';
}

export function scansIn(events: CommandStartedEvent[]): string[] {
  const offenders: string[] = [];
  for (const e of events) {
    if (!(FILTERED as readonly string[]).includes(e.commandName)) continue;
    const collection = String(e.command[e.commandName]);
    if (e.command.comment === RECONCILIATION_COMMENT) continue;
    for (const filter of filtersOf(e)) {
      if (!isPointLookup(filter)) offenders.push(`${e.commandName} ${collection} ${JSON.stringify(filter)}`);
    }
  }
  return [...new Set(offenders)];
}

describe('every request and job path looks records up by exact _id', () => {
  let t: TestApp;
  let receiver: Receiver;
  const commands: CommandStartedEvent[] = [];
  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize', 'settle', 'webhook-dispatch'], overrides: DELIVERY_OVERRIDES });
    receiver = await startReceiver();
  });
  afterAll(async () => {
    await receiver.close();
    await t.close();
  });

  it('runs tenant, agents, runs, events, finalize, settle, dispute, webhooks and wallet reads without a scan', async () => {
    t.runtime.mongo.on('commandStarted', (e) => commands.push(e));
    const { auth } = await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write', 'webhooks:write']);
    const endpoint = await t.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { url: receiver.url, events: ['run.finalized', 'settlement.completed', 'dispute.opened'] },
    });
    expect(endpoint.statusCode, endpoint.body).toBe(201);
    const p = await parties(t, auth, 5_000);
    await credit(t, p.payer.agentId, 1_000, 'USDC');
    const runId = await finalizedRun(t, auth, p, {
      pass: true,
      amount: 1_000,
      holdbackBps: 1_000,
      disputeWindowSeconds: 3_600,
    });
    expect((await settle(t, auth, runId)).statusCode).toBe(202);
    await waitSettlement(t, auth, runId, (s) => s.status === 'completed');
    const dispute = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${runId}/disputes`,
      headers: auth,
      payload: { reason: 'wrong' },
    });
    expect(dispute.statusCode).toBe(201);
    await t.app.inject({
      method: 'POST',
      url: `/ops/disputes/${dispute.json().disputeId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'payer' },
    });
    await receiver.waitFor(3, 15_000);
    expect(await balances(t, auth, p.worker.agentId)).toEqual({ available: 900, escrow: 0 });
    for (const url of [
      `/v1/runs/${runId}`,
      `/runs/${runId}/settlement`,
      `/runs/${runId}/verification`,
      `/v1/verify/${runId}`,
      `/v1/wallets/${p.payer.agentId}/entries`,
      `/v1/webhooks/${endpoint.json().id}/deliveries`,
      '/v1/webhooks',
    ]) {
      const res = await t.app.inject({ method: 'GET', url, headers: auth });
      expect(res.statusCode, `${url}: ${res.body}`).toBe(200);
    }
    // Let the sweepers take a few turns over the stored work.
    await new Promise((r) => setTimeout(r, 4_500));

    expect(commands.length).toBeGreaterThan(50);
    expect(scansIn(commands)).toEqual([]);
  });
});
