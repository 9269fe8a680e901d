import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyArtifact } from '../../src/domain/artifact.ts';
import type { JsonValue } from '../../src/domain/canonical-json.ts';
import { MAX_CLIENT_JSON_DEPTH } from '../../src/domain/client-json.ts';
import { generateEd25519KeyPair } from '../../src/domain/crypto.ts';
import { signEvents } from '../../src/domain/event-chain.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { appendEvents, createRun, events, registerAgent, waitFinalized } from '../helpers/agents.ts';
import { balances, credit, settle, waitSettlement } from '../helpers/money.ts';

/** `[[…[leaf]…]]` nested `depth` levels deep. */
function nested(depth: number, leaf: JsonValue = 'bottom'): JsonValue {
  let value: JsonValue = leaf;
  for (let i = 0; i < depth; i++) value = i % 2 === 0 ? [value] : { [`k$.${i}`]: value };
  return value;
}

/** JSON a document store would reject or reinterpret if it were stored as a document. */
const awkward: Record<string, JsonValue> = {
  $where: 'not an operator',
  'a.b.c': 'dotted',
  'nul\u0000key': 'a NUL in a key',
  arrays: [[1, [2, [3]]], [], [[]]],
  deep: nested(MAX_CLIENT_JSON_DEPTH - 1),
  '': 'empty key',
  unicode: 'ünïcødé \u2028 😀',
};

describe('client JSON is kept intact, whatever its keys and nesting', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize', 'settle'] });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'wallets:write'])).auth;
  });
  afterAll(() => t.close());

  it('stores and returns agent metadata with $, dots, NUL keys, arrays in arrays and deep nesting', async () => {
    const pair = generateEd25519KeyPair();
    const publicKey = pair.keyObject.export({ type: 'spki', format: 'pem' }).toString();
    const created = await t.app.inject({
      method: 'POST',
      url: '/v1/agents',
      headers: auth,
      payload: { namespace: 'json', name: 'meta', publicKey, metadata: awkward },
    });
    expect(created.statusCode, created.body).toBe(201);
    const agent = await t.app.inject({ method: 'GET', url: `/v1/agents/${created.json().agentId}`, headers: auth });
    expect(agent.json().metadata).toEqual(awkward);
  });

  it("appends, finalizes, settles and verifies offline runs whose payloads are awkward JSON: every hash is the client's", async () => {
    const payer = await registerAgent(t, auth);
    const worker = await registerAgent(t, auth);
    await credit(t, payer.agentId, 1_000);
    const runId = await createRun(t, auth, {
      agentId: worker.agentId,
      terms: {},
      settlement: { payerAgentId: payer.agentId, amount: 400, currency: 'USD', disputeWindowSeconds: 3600 },
    });
    const batch = events(runId, { seq: 0, chainHash: null }, worker, [
      { type: 'tool_call', payload: awkward },
      { type: 'log', payload: nested(MAX_CLIENT_JSON_DEPTH) },
      { type: 'log', payload: [[['x']], { $gt: [] }] },
    ]);
    const appended = await appendEvents(t, auth, runId, batch);
    expect(appended.statusCode, appended.body).toBe(201);
    await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    const run = await waitFinalized(t, auth, runId);
    expect(run).toMatchObject({ verdict: 'pass', finalizeError: null });

    const artifact = (
      await t.app.inject({ method: 'GET', url: `/v1/artifacts/${run.artifactId}`, headers: auth })
    ).json();
    expect(artifact.events.items.map((e: { payload: unknown }) => e.payload)).toEqual(batch.map((e) => e.payload));
    expect(
      artifact.events.items.map((e: { payloadHash: string; chainHash: string }) => [e.payloadHash, e.chainHash]),
    ).toEqual(batch.map((e) => [e.payloadHash, e.chainHash]));
    const jwks = (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
    expect(verifyArtifact(artifact, jwks)).toMatchObject({ verified: true });

    await settle(t, auth, runId);
    await waitSettlement(t, auth, runId, (s) => s.status === 'completed');
    const disputed = await t.app.inject({
      method: 'POST',
      url: `/v1/runs/${runId}/disputes`,
      headers: auth,
      payload: { reason: 'see evidence', evidence: awkward },
    });
    expect(disputed.statusCode, disputed.body).toBe(201);
  });

  it('refuses nesting beyond the limit with 400 in the contract shape, and appends nothing', async () => {
    const worker = await registerAgent(t, auth);
    const runId = await createRun(t, auth, { agentId: worker.agentId });
    const tooDeep = await appendEvents(
      t,
      auth,
      runId,
      events(runId, { seq: 0, chainHash: null }, worker, [{ type: 'log', payload: nested(MAX_CLIENT_JSON_DEPTH + 1) }]),
    );
    expect(tooDeep.statusCode).toBe(400);
    expect(tooDeep.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'body.events[0].payload' }] },
      requestId: expect.any(String),
    });
    expect((await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json().head).toEqual({
      seq: 0,
      chainHash: null,
    });

    const publicKey = JSON.stringify(
      generateEd25519KeyPair().keyObject.export({ type: 'spki', format: 'pem' }).toString(),
    );
    const body = `{"namespace":"json","name":"deep","publicKey":${publicKey},"metadata":{"a":${'['.repeat(10_000)}${']'.repeat(10_000)}}}`;
    const deepBody = await t.app.inject({
      method: 'POST',
      url: '/v1/agents',
      headers: { ...auth, 'content-type': 'application/json' },
      payload: body,
    });
    expect(deepBody.statusCode).toBe(400);
    expect(deepBody.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      details: { errors: [{ path: 'body.metadata' }] },
      requestId: expect.any(String),
    });
    expect((await t.app.inject({ method: 'GET', url: '/v1/agents/json:agent:deep', headers: auth })).statusCode).toBe(
      404,
    );

    // The run still finalizes: nothing of the refused request was stored.
    await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    expect(await waitFinalized(t, auth, runId)).toMatchObject({ artifactId: expect.stringMatching(/^art_/) });
  });

  it('refuses an event id reused with other content at a new position (409), keeping the chain as it was', async () => {
    const worker = await registerAgent(t, auth);
    const runId = await createRun(t, auth, { agentId: worker.agentId });
    const [first] = events(runId, { seq: 0, chainHash: null }, worker, [{ type: 'log', payload: { n: 1 } }]);
    expect((await appendEvents(t, auth, runId, [first!])).statusCode).toBe(201);
    // Same id as the first event, other content, next position, properly signed: only the id reuse is wrong.
    const [withOldId] = signEvents(
      [{ id: first!.id, runId, type: 'log', at: first!.at, payload: { n: 2 } }],
      { seq: 1, chainHash: first!.chainHash },
      worker.privateKey,
      worker.keyId,
    );
    const refused = await appendEvents(t, auth, runId, [withOldId!]);
    expect(refused.statusCode).toBe(409);
    expect(refused.json()).toMatchObject({ code: 'CHAIN_CONFLICT', details: { eventId: first!.id } });
    expect((await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}`, headers: auth })).json().head.seq).toBe(1);
    // A fresh id at that position is fine, and the identical resend of the first event is a no-op success.
    const fresh = events(runId, { seq: 1, chainHash: first!.chainHash }, worker, [{ type: 'log', payload: { n: 2 } }]);
    expect((await appendEvents(t, auth, runId, fresh)).statusCode).toBe(201);
    expect((await appendEvents(t, auth, runId, [first!])).json()).toMatchObject({ accepted: 1, head: { seq: 2 } });
  });

  it('checks in full at finalize a signature altered in storage: the append-time attestation no longer covers it', async () => {
    const worker = await registerAgent(t, auth);
    const runId = await createRun(t, auth, { agentId: worker.agentId, terms: {} });
    const batch = events(runId, { seq: 0, chainHash: null }, worker, [
      { type: 'log', payload: { n: 1 } },
      { type: 'log', payload: { n: 2 } },
    ]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    const stored = (await t.runtime.stores.runs.batches.findOne({ _id: `${runId}:1` }))!;
    expect(stored.attestation).toEqual(expect.any(String));
    const altered = JSON.parse(stored.eventsJson!) as Array<{ signature: string }>;
    altered[1]!.signature = altered[0]!.signature;
    await t.runtime.stores.runs.batches.updateOne(
      { _id: `${runId}:1` },
      { $set: { eventsJson: JSON.stringify(altered) } },
    );
    await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    expect(await waitFinalized(t, auth, runId)).toMatchObject({
      verdict: 'fail',
      artifactId: null,
      finalizeError: { code: 'ARTIFACT_BUILD_FAILED', message: expect.stringContaining('SIGNATURE_MISMATCH') },
    });
  });

  it('finalizes a run whose stored data can never make an artifact as fail, and holds its escrow for a ruling', async () => {
    const payer = await registerAgent(t, auth);
    const worker = await registerAgent(t, auth);
    await credit(t, payer.agentId, 500);
    const runId = await createRun(t, auth, {
      agentId: worker.agentId,
      terms: {},
      settlement: { payerAgentId: payer.agentId, amount: 500, currency: 'USD' },
    });
    const batch = events(runId, { seq: 0, chainHash: null }, worker, [{ type: 'log', payload: { ok: true } }]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    // Storage corruption the chain check will catch: the artifact can never be built.
    const stored = (await t.runtime.stores.runs.batches.findOne({ _id: `${runId}:1` }))!;
    const corrupted = JSON.parse(stored.eventsJson!) as Array<{ payloadJson: string }>;
    corrupted[0]!.payloadJson = '{"ok":false}';
    await t.runtime.stores.runs.batches.updateOne(
      { _id: `${runId}:1` },
      { $set: { eventsJson: JSON.stringify(corrupted) } },
    );
    await t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });
    const run = await waitFinalized(t, auth, runId);
    expect(run).toMatchObject({ verdict: 'fail', artifactId: null, finalizeError: { code: 'ARTIFACT_BUILD_FAILED' } });

    await settle(t, auth, runId);
    const held = await waitSettlement(t, auth, runId, (s) => s.status === 'held');
    expect(held.decision).toMatchObject({ verdict: 'fail', reason: 'ARTIFACT_BUILD_FAILED' });
    expect(held.receipt.body).toMatchObject({ artifactId: null, artifactHash: null });
    const refund = await t.app.inject({
      method: 'POST',
      url: `/ops/settlements/${held.settlementId}/resolve`,
      headers: t.admin,
      payload: { outcome: 'refund' },
    });
    expect(refund.json()).toMatchObject({ status: 'refunded', refundedAmount: 500 });
    expect(await balances(t, auth, payer.agentId)).toEqual({ available: 500, escrow: 0 });
  });
});
