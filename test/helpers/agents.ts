import type { KeyObject } from 'node:crypto';
import { expect } from 'vitest';
import { generateEd25519KeyPair, newId } from '../../src/domain/crypto.ts';
import { signEvents, type ChainHead, type EventEnvelope } from '../../src/domain/event-chain.ts';
import type { JsonValue } from '../../src/domain/canonical-json.ts';
import { eventIdHash } from '../../src/store/event-id-index.ts';
import type { TestApp } from './context.ts';

export interface TestAgent {
  agentId: string;
  keyId: string;
  privateKey: KeyObject;
  publicKeyPem: string;
}

/** Registers an agent over HTTP with a fresh Ed25519 key, as a client would. */
export async function registerAgent(t: TestApp, auth: Record<string, string>, name = newId('a')): Promise<TestAgent> {
  const pair = generateEd25519KeyPair();
  const publicKeyPem = pair.keyObject.export({ type: 'spki', format: 'pem' }).toString();
  const res = await t.app.inject({
    method: 'POST',
    url: '/v1/agents',
    headers: auth,
    payload: { name, publicKey: publicKeyPem },
  });
  expect(res.statusCode, res.body).toBe(201);
  return { agentId: res.json().agentId, keyId: res.json().keyId, privateKey: pair.privateKey, publicKeyPem };
}

export async function createRun(
  t: TestApp,
  auth: Record<string, string>,
  body: Record<string, unknown>,
): Promise<string> {
  const res = await t.app.inject({ method: 'POST', url: '/v1/runs', headers: auth, payload: body });
  expect(res.statusCode, res.body).toBe(201);
  return res.json().runId;
}

export function events(
  runId: string,
  head: ChainHead,
  agent: Pick<TestAgent, 'privateKey' | 'keyId'>,
  payloads: Array<{ type: string; payload: JsonValue }>,
): EventEnvelope[] {
  return signEvents(
    payloads.map((p) => ({ id: newId('evt'), runId, type: p.type, at: new Date().toISOString(), payload: p.payload })),
    head,
    agent.privateKey,
    agent.keyId,
  );
}

export function appendEvents(t: TestApp, auth: Record<string, string>, runId: string, batch: EventEnvelope[]) {
  return t.app.inject({
    method: 'POST',
    url: `/v1/runs/${runId}/events`,
    headers: auth,
    payload: batch.length === 1 ? { event: batch[0] } : { events: batch },
  });
}

/** Polls GET /v1/runs/{id} until the run is finalized (a worker must be running). */
export async function waitFinalized(t: TestApp, auth: Record<string, string>, runId: string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = (await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json();
    if (run.status === 'finalized') return run;
    if (Date.now() > deadline) throw new Error(`run ${runId} still ${run.status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Two different event ids with the same event-id index hash (a birthday search: about 80,000 tries, under 1 s). */
export function collidingEventIds(prefix = 'evt_'): [string, string] {
  const seen = new Map<number, string>();
  for (let i = 0; ; i++) {
    const id = `${prefix}${i}`;
    const other = seen.get(eventIdHash(id));
    if (other) return [other, id];
    seen.set(eventIdHash(id), id);
  }
}
