import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createReceiverServer,
  createWebhookHandler,
  FileProcessedIds,
  type WebhookHooks,
} from '../../examples/receiver/server.ts';
import { generateWebhookSecret, signedHeaders } from '../../src/domain/webhook-signing.ts';

// The example receiver over real HTTP on 127.0.0.1 (the delivery tests drive its processing logic with real deliveries).
describe('example webhook receiver', () => {
  const secret = generateWebhookSecret();
  const calls: string[] = [];
  let failNext = false;
  const hook = (e: { id: string; type: string }) => {
    if (failNext) {
      failNext = false;
      throw new Error('downstream unavailable');
    }
    calls.push(`${e.type}:${e.id}`);
  };
  const hooks: WebhookHooks = {
    'run.finalized': hook,
    'settlement.completed': hook,
    'settlement.held': hook,
    'dispute.opened': hook,
    'dispute.resolved': hook,
    x402: hook,
  };
  const server = createReceiverServer(createWebhookHandler({ secrets: [secret], hooks }));
  let base = '';
  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const deliver = (id: string, type: string, tamper = false, path = '/webhooks') => {
    const body = JSON.stringify({ id, type, createdAt: new Date().toISOString(), data: { n: 1 } });
    const headers = signedHeaders([secret], id, Math.floor(Date.now() / 1000), body);
    return fetch(`${base}${path}`, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/json' },
      body: tamper ? body.replace('"n":1', '"n":2') : body,
    });
  };

  it('answers 204 and processes each event id once; 401 for anything that does not verify', async () => {
    expect((await deliver('evt_a', 'settlement.completed')).status).toBe(204);
    expect((await deliver('evt_a', 'settlement.completed')).status).toBe(204);
    expect((await deliver('evt_b', 'settlement.completed', true)).status).toBe(401);
    expect((await deliver('evt_c', 'x402.escalation.created')).status).toBe(204);
    expect((await deliver('evt_d', 'some.future.type')).status).toBe(204);
    expect(calls).toEqual(['settlement.completed:evt_a', 'x402.escalation.created:evt_c']);
    expect((await deliver('evt_e', 'run.finalized', false, '/elsewhere')).status).toBe(404);
    expect((await fetch(`${base}/webhooks`)).status).toBe(405);
  });

  it('answers 500 when a hook fails, so the retry is processed', async () => {
    failNext = true;
    expect((await deliver('evt_f', 'dispute.opened')).status).toBe(500);
    expect((await deliver('evt_f', 'dispute.opened')).status).toBe(204);
    expect(calls.filter((c) => c.endsWith('evt_f'))).toEqual(['dispute.opened:evt_f']);
  });

  it('remembers processed ids across restarts with the file-backed store', () => {
    const dir = mkdtempSync(join(tmpdir(), 'receiver-'));
    try {
      const file = join(dir, 'ids.log');
      new FileProcessedIds(file).add('evt_1');
      expect(new FileProcessedIds(file).has('evt_1')).toBe(true);
      expect(new FileProcessedIds(file).has('evt_2')).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
