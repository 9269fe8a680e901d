import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  agentKeyPairFromPrivateKey,
  createSettlementClient,
  exportAgentPrivateKey,
  generateAgentKeyPair,
  RunEventSigner,
  SettlementApiError,
  verifyArtifact,
  verifyReceipt,
  verifyWebhook,
  WebhookVerificationError,
  type RegisteredAgent,
  type SettlementClient,
} from 'agent-settlement-client';
import { generateWebhookSecret, signedHeaders } from '../../src/domain/webhook-signing.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

// The client against the real service (listening, with its finalize and settle workers): the signer's events are
// accepted, anything altered is refused, and what the service signs verifies here, offline.
let t: TestApp;
let baseUrl: string;
let client: SettlementClient;
let admin: SettlementClient;

beforeAll(async () => {
  t = await startTestApp({ workers: ['finalize', 'settle'] });
  await t.app.listen({ host: '127.0.0.1', port: 0 });
  baseUrl = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
  admin = createSettlementClient({ baseUrl, apiKey: t.env.adminKey });
  const { token } = await t.tenantWithKey(['agents:write', 'runs:write']);
  client = createSettlementClient({ baseUrl, apiKey: token });
});
afterAll(async () => {
  await t?.close();
});

const runOf = (agent: RegisteredAgent) =>
  client.createRun({ body: { agentId: agent.agentId, terms: { accuracy: { min: 0.5 } } } });

describe('typed errors', () => {
  it('a refused call throws SettlementApiError with the service code, message and request id', async () => {
    const err = await client.getRun({ params: { path: { runId: 'run_doesnotexist' } } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SettlementApiError);
    expect(err).toMatchObject({ status: 404, code: 'NOT_FOUND', requestId: expect.any(String) });

    const agent = await client.createAgent({ name: 'twice' });
    const again = await client
      .registerAgent({ body: { agentId: agent.agentId, publicKey: generateAgentKeyPair().publicKey } })
      .catch((e: unknown) => e);
    expect(again).toMatchObject({ status: 409, code: 'AGENT_EXISTS' });

    const noScope = await client.listTenants().catch((e: unknown) => e);
    expect(noScope).toBeInstanceOf(SettlementApiError);
    expect((noScope as SettlementApiError).status).toBe(403);
  });
});

describe('event signer', () => {
  it('signs events the service accepts, in batches and one at a time, continuing the chain across calls', async () => {
    const agent = await client.createAgent({ name: 'signer' });
    const run = await runOf(agent);
    const signer = await client.eventSigner(run.runId, agent);
    const first = await client.appendEvents(signer, [
      { type: 'sample', payload: { correct: true, latencyMs: 12 } },
      { type: 'log', payload: { line: 'ünïcödé, floats 0.1 and 1e21, nested {"a":[1,{"b":null}]}' } },
    ]);
    expect(first).toMatchObject({ accepted: 2, head: { seq: 2 } });
    const second = await client.appendEvents(signer, [{ type: 'metric', payload: { name: 'accuracy', value: 0.75 } }]);
    expect(second.head).toEqual({ seq: 3, chainHash: second.events[0]!.chainHash });

    // A signer picked up later (say, another process with the stored key) continues from the service's head.
    const stored = agentKeyPairFromPrivateKey(exportAgentPrivateKey(agent));
    expect(stored.keyId).toBe(agent.keyId);
    const resumed = await client.eventSigner(run.runId, stored);
    expect(resumed.head).toEqual(second.head);
    expect((await client.appendEvents(resumed, [{ type: 'progress', payload: { step: 4 } }])).head.seq).toBe(4);
    expect((await client.getRun({ params: { path: { runId: run.runId } } })).head.seq).toBe(4);
  });

  it('an event altered after signing, or signed with another key, is refused and leaves the chain as it was', async () => {
    const agent = await client.createAgent({ name: 'tamper' });
    const run = await runOf(agent);
    const signer = new RunEventSigner(run.runId, agent);
    const [event] = signer.sign([{ type: 'metric', payload: { name: 'accuracy', value: 0.4 } }]);
    const tampered = { ...event!, payload: { name: 'accuracy', value: 0.99 } };
    const refused = await client
      .appendRunEvents({ params: { path: { runId: run.runId } }, body: { event: tampered } })
      .catch((e: unknown) => e);
    expect(refused).toMatchObject({ status: 400, code: 'SIGNATURE_INVALID' });

    const stranger = new RunEventSigner(run.runId, generateAgentKeyPair());
    const foreign = await client
      .appendEvents(stranger, [{ type: 'metric', payload: { name: 'accuracy', value: 0.99 } }])
      .catch((e: unknown) => e);
    expect(foreign).toMatchObject({ status: 400, code: 'SIGNATURE_INVALID' });
    expect(stranger.head).toEqual({ seq: 0, chainHash: null }); // not accepted: the signer's head stays put

    expect((await client.getRun({ params: { path: { runId: run.runId } } })).head).toEqual({ seq: 0, chainHash: null });
    // The untouched event still goes in.
    expect(
      (await client.appendRunEvents({ params: { path: { runId: run.runId } }, body: { event: event! } })).head.seq,
    ).toBe(1);
  });
});

describe('offline verification', () => {
  it('an artifact and a settlement receipt verify locally, and an altered copy or a foreign JWKS does not', async () => {
    const payer = await client.createAgent({ name: 'payer' });
    const worker = await client.createAgent({ name: 'worker' });
    await admin.creditWallet({
      params: { path: { walletId: payer.agentId } },
      body: { amount: 1_000, currency: 'USD' },
    });
    const run = await client.createRun({
      body: {
        agentId: worker.agentId,
        terms: { accuracy: { min: 0.5 } },
        settlement: { payerAgentId: payer.agentId, amount: 300, currency: 'USD' },
      },
    });
    await client.appendEvents(await client.eventSigner(run.runId, worker), [
      { type: 'metric', payload: { name: 'accuracy', value: 0.8 } },
    ]);
    await client.finalizeRun({ params: { path: { runId: run.runId } } });
    const finalized = await client.waitForFinalized(run.runId);
    await client.settleRun({ params: { path: { runId: run.runId } } });
    expect((await client.waitForSettlement(run.runId)).status).toBe('completed');

    const local = await client.verifyArtifactLocally(finalized.artifactId!);
    expect(local).toMatchObject({ verified: true, failures: [] });
    const receipt = await client.verifyReceiptLocally(run.runId);
    expect(receipt).toMatchObject({ verified: true, failures: [] });

    const jwks = await client.getJwks();
    const artifact = structuredClone(local.artifact) as unknown as { metrics: Record<string, number> };
    artifact.metrics.accuracy = 0.99;
    expect(verifyArtifact(artifact, jwks)).toMatchObject({ verified: false, checks: { artifactHash: false } });
    const foreignJwks = { keys: jwks.keys.map((k) => ({ ...k, x: generateAgentKeyPair().publicKey })) };
    expect(verifyArtifact(local.artifact, foreignJwks)).toMatchObject({
      verified: false,
      checks: { serviceSignature: false },
    });

    const signed = structuredClone(receipt.settlement.receipt) as unknown as { body: { releasedNow: number } };
    signed.body.releasedNow += 1;
    expect(verifyReceipt(signed, jwks)).toMatchObject({ verified: false, checks: { receiptHash: false } });
    expect(
      verifyReceipt(receipt.settlement.receipt, jwks, { artifact: { runId: run.runId, artifactHash: '0'.repeat(64) } }),
    ).toMatchObject({ verified: false, checks: { artifact: false } });
  });
});

describe('webhook verification', () => {
  it('accepts a delivery signed with the endpoint secret and refuses an altered body or another secret', () => {
    const secret = generateWebhookSecret();
    const body = JSON.stringify({
      id: 'evt_1',
      type: 'run.finalized',
      createdAt: new Date().toISOString(),
      data: { runId: 'run_1' },
    });
    const headers = signedHeaders([secret], 'evt_1', Math.floor(Date.now() / 1000), body);
    expect(verifyWebhook(body, headers, secret)).toMatchObject({ type: 'run.finalized', data: { runId: 'run_1' } });
    expect(() => verifyWebhook(body.replace('run_1', 'run_2'), headers, secret)).toThrow(WebhookVerificationError);
    expect(() => verifyWebhook(body, headers, generateWebhookSecret())).toThrow(
      expect.objectContaining({ code: 'NO_MATCHING_SIGNATURE' }),
    );
  });
});
