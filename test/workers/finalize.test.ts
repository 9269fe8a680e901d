import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildArtifact } from '../../src/domain/artifact.ts';
import { jobIdFor } from '../../src/queues/index.ts';
import { createFinalizeProcessor } from '../../src/workers/finalize.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { appendEvents, createRun, events, registerAgent, waitFinalized, type TestAgent } from '../helpers/agents.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));

describe('finalize, artifacts and verification', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let agent: TestAgent;
  beforeAll(async () => {
    t = await startTestApp({ workers: ['finalize'] });
    auth = (await t.tenantWithKey(['agents:write', 'runs:write', 'webhooks:write'])).auth;
    agent = await registerAgent(t, auth);
    // A subscriber (a pull endpoint: no URL to reach), so that run.finalized has somewhere to fan out to.
    const hook = await t.app.inject({
      method: 'POST',
      url: '/v1/webhooks',
      headers: auth,
      payload: { delivery: 'pull', events: ['run.finalized'] },
    });
    expect(hook.statusCode, hook.body).toBe(201);
  });
  afterAll(() => t.close());

  const get = (url: string, headers: Record<string, string> = auth) => t.app.inject({ method: 'GET', url, headers });
  const finalize = (runId: string) =>
    t.app.inject({ method: 'POST', url: `/v1/runs/${runId}/finalize`, headers: auth });

  /** A run with samples (latency and correctness) and one reported metric. */
  async function runWithEvidence(terms: Record<string, unknown>) {
    const runId = await createRun(t, auth, { agentId: agent.agentId, terms });
    const samples = Array.from({ length: 20 }, (_, i) => ({
      type: 'sample',
      payload: { latencyMs: (i + 1) * 50, correct: i !== 0 },
    }));
    const batch = events(runId, { seq: 0, chainHash: null }, agent, [
      ...samples,
      { type: 'metric', payload: { name: 'cost', value: 12 } },
      { type: 'tool_call', payload: { tool: 'search', args: { q: 'x' } } },
    ]);
    expect((await appendEvents(t, auth, runId, batch)).statusCode).toBe(201);
    return runId;
  }

  it('finalizes into a signed artifact with the evaluation, and emits run.finalized into the outbox', async () => {
    const runId = await runWithEvidence({
      accuracy: { min: 0.9 },
      latencyP95: { max: 1000 },
      cost: { max: 10 },
      recall: { min: 0.5 },
    });
    const accepted = await finalize(runId);
    expect(accepted.statusCode).toBe(202);
    expect(accepted.json()).toMatchObject({ runId, status: 'finalizing' });
    const run = await waitFinalized(t, auth, runId);
    expect(run).toMatchObject({
      status: 'finalized',
      verdict: 'fail',
      artifactId: expect.stringMatching(/^art_[0-9a-f]{64}$/),
    });

    const artifact = (await get(`/v1/artifacts/${run.artifactId}`)).json();
    expect(artifact).toMatchObject({
      schema: 'RunArtifact.v1',
      artifactId: run.artifactId,
      runId,
      agentId: agent.agentId,
      events: { count: 22 },
    });
    expect(artifact.agentKeys).toEqual([{ keyId: agent.keyId, publicKey: expect.any(String) }]);
    const byMetric = Object.fromEntries(artifact.evaluation.results.map((r: { metric: string }) => [r.metric, r]));
    expect(byMetric.accuracy).toMatchObject({ value: 0.95, pass: true }); // 19 of 20 correct
    expect(byMetric.latencyP95).toMatchObject({ value: 950, pass: true }); // nearest rank 19 of 20
    expect(byMetric.cost).toMatchObject({ value: 12, pass: false });
    expect(byMetric.recall).toMatchObject({ value: null, pass: false, reason: 'METRIC_MISSING' });
    expect(artifact.signature.keyId).toBe(t.runtime.keys.active.keyId);

    // The job marks the run finalized, then records run.finalized: a read between the two sees the status alone.
    const finalizedEvents = () =>
      t.runtime.stores.outbox.events.find({ type: 'run.finalized', 'data.runId': runId }).toArray();
    let outbox = await finalizedEvents();
    for (const until = Date.now() + 10_000; outbox.length === 0 && Date.now() < until; outbox = await finalizedEvents())
      await new Promise((r) => setTimeout(r, 50));
    expect(outbox).toHaveLength(1);
    expect(outbox[0]!.data).toEqual({ runId, artifactId: run.artifactId, verdict: 'fail', status: 'finalized' });
    // Enqueued after the event is recorded, so waited for the same way.
    const dispatchJob = () =>
      t.runtime.producers.queues['webhook-dispatch'].getJob(jobIdFor('webhook-dispatch', outbox[0]!._id));
    let dispatch = await dispatchJob();
    for (const until = Date.now() + 10_000; !dispatch && Date.now() < until; dispatch = await dispatchJob())
      await new Promise((r) => setTimeout(r, 50));
    expect(dispatch?.data).toEqual({ tenantId: outbox[0]!.tenantId, eventId: outbox[0]!._id });
  });

  it('passes a run whose every term holds, and a run with no terms', async () => {
    const runId = await runWithEvidence({ accuracy: { min: 0.9 }, latencyP95: { max: 950 } });
    await finalize(runId);
    expect((await waitFinalized(t, auth, runId)).verdict).toBe('pass');
    const bare = await createRun(t, auth, { agentId: agent.agentId });
    await finalize(bare);
    const run = await waitFinalized(t, auth, bare);
    expect(run.verdict).toBe('pass');
    expect((await get(`/v1/artifacts/${run.artifactId}`)).json().events).toEqual({
      count: 0,
      head: { seq: 0, chainHash: null },
      items: [],
    });
  });

  it('yields one artifact id however often finalize is called or its job runs, even after a crash mid-job', async () => {
    const runId = await runWithEvidence({ accuracy: { min: 0.5 } });
    const calls = await Promise.all([finalize(runId), finalize(runId), finalize(runId)]);
    expect(calls.map((c) => c.statusCode)).toEqual([202, 202, 202]);
    const run = await waitFinalized(t, auth, runId);
    expect((await finalize(runId)).json()).toEqual({ runId, status: 'finalized', artifactId: run.artifactId });

    const processor = createFinalizeProcessor(t.runtime);
    const tenantId = (await t.runtime.stores.runs.getAny(runId))!.tenantId;
    await Promise.all([
      processor.process({ tenantId, runId }, undefined as never),
      processor.process({ tenantId, runId }, undefined as never),
    ]);
    expect(await t.runtime.stores.runs.artifacts.countDocuments({ runId })).toBe(1);
    expect(await t.runtime.stores.outbox.events.countDocuments({ 'data.runId': runId })).toBe(1);

    // A worker that died after storing the artifact but before marking the run: the retry lands on the same record.
    const crashed = await runWithEvidence({ accuracy: { min: 0.5 } });
    const frozen = await t.runtime.stores.runs.beginFinalize(tenantId, crashed);
    const stored = await t.runtime.stores.runs.listEvents(crashed, frozen.finalHead!.seq);
    const agentDoc = (await t.runtime.stores.agents.get(tenantId, agent.agentId))!;
    const early = buildArtifact(
      {
        runId: crashed,
        agentId: agent.agentId,
        agentKeys: Object.values(agentDoc.keys),
        terms: frozen.terms,
        events: stored,
        finalizedAt: frozen.finalizeRequestedAt!.toISOString(),
      },
      t.runtime.keys.active,
    );
    await t.runtime.stores.runs.saveArtifact(tenantId, early);
    await processor.process({ tenantId, runId: crashed }, undefined as never);
    const after = await t.runtime.stores.runs.getAny(crashed);
    expect(after).toMatchObject({ status: 'finalized', artifactId: early.artifactId });
    expect(await t.runtime.stores.runs.artifacts.countDocuments({ runId: crashed })).toBe(1);
  });

  it('lets anyone verify by run or artifact id without a credential, showing only what the artifact holds', async () => {
    const runId = await runWithEvidence({ accuracy: { min: 0.9 } });
    await finalize(runId);
    const run = await waitFinalized(t, auth, runId);
    const artifact = (await get(`/v1/artifacts/${run.artifactId}`)).json();
    for (const id of [runId, run.artifactId]) {
      const res = await t.app.inject({ method: 'GET', url: `/v1/verify/${id}` });
      expect(res.statusCode).toBe(200);
      const body = res.json();
      expect(body).toEqual({
        verified: true,
        checks: { artifactHash: true, serviceSignature: true, eventSignatures: true, chain: true },
        failures: [],
        artifactId: artifact.artifactId,
        artifactHash: artifact.artifactHash,
        runId,
        agentId: artifact.agentId,
        verdict: artifact.evaluation.verdict,
        evaluation: artifact.evaluation,
        finalizedAt: artifact.finalizedAt,
        keyId: artifact.signature.keyId,
        jwksUrl: `${t.config.publicBaseUrl}/.well-known/jwks.json`,
        settlement: null,
      });
      expect(res.body).not.toContain(t.env.adminKey);
      expect(res.body).not.toContain('tenantId');
    }
    expect((await t.app.inject({ method: 'GET', url: '/v1/verify/art_nope' })).statusCode).toBe(404);

    const detailed = (await get(`/runs/${runId}/verification`)).json();
    expect(detailed).toMatchObject({
      verified: true,
      status: 'finalized',
      eventCount: 22,
      durationMs: expect.any(Number),
    });
    const other = (await t.tenantWithKey(['runs:read'])).auth;
    expect((await get(`/runs/${runId}/verification`, other)).statusCode).toBe(404);
    expect((await get(`/v1/artifacts/${run.artifactId}`, other)).statusCode).toBe(404);
  });

  it('publishes the signing key as an OKP/Ed25519 JWK', async () => {
    const jwks = (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json();
    expect(jwks.keys).toEqual([
      expect.objectContaining({
        kty: 'OKP',
        crv: 'Ed25519',
        kid: t.runtime.keys.active.keyId,
        use: 'sig',
        alg: 'EdDSA',
      }),
    ]);
  });

  it('the offline CLI verifies a served artifact, and names the failed check after a one-byte change', async () => {
    const runId = await runWithEvidence({ accuracy: { min: 0.9 } });
    await finalize(runId);
    const run = await waitFinalized(t, auth, runId);
    const dir = mkdtempSync(join(tmpdir(), 'verify-'));
    const artifactPath = join(dir, 'artifact.json');
    const jwksPath = join(dir, 'jwks.json');
    writeFileSync(artifactPath, (await get(`/v1/artifacts/${run.artifactId}`)).body);
    writeFileSync(jwksPath, (await t.app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).body);
    const cli = (file: string) =>
      spawnSync(process.execPath, ['bin/agent-settlement.js', 'verify', file, '--jwks', jwksPath, '--json'], {
        cwd: root,
        encoding: 'utf8',
      });

    const fresh = cli(artifactPath);
    expect(fresh.status, fresh.stderr).toBe(0);
    expect(JSON.parse(fresh.stdout).verified).toBe(true);

    const original = readFileSync(artifactPath, 'utf8');
    const tamperings: Array<[string, string, string]> = [
      ['payload', original.replace('"latencyMs":100}', '"latencyMs":900}'), 'eventSignatures'],
      ['terms', original.replace('"min":0.9', '"min":0.1'), 'artifactHash'],
      ['verdict', original.replace('"verdict":"pass"', '"verdict":"fail"'), 'artifactHash'],
    ];
    for (const [what, changed, check] of tamperings) {
      expect(changed, what).not.toBe(original);
      const file = join(dir, `${what}.json`);
      writeFileSync(file, changed);
      const out = cli(file);
      expect(out.status, what).not.toBe(0);
      expect(JSON.parse(out.stdout).checks[check], what).toBe(false);
    }
  });

  it('never loses an acknowledged event when finalize lands in the middle of appends', async () => {
    const runId = await createRun(t, auth, { agentId: agent.agentId });
    let head = { seq: 0, chainHash: null as string | null };
    const acknowledged: string[] = [];
    const refused: number[] = [];
    // Appends until the seal refuses one (however fast appends are); finalize lands once a few are acknowledged.
    const appender = (async () => {
      for (let i = 0; refused.length === 0 && i < 5_000; i++) {
        const batch = events(runId, head, agent, [
          { type: 'log', payload: { i, part: 1 } },
          { type: 'log', payload: { i, part: 2 } },
        ]);
        const res = await appendEvents(t, auth, runId, batch);
        if (res.statusCode === 201) {
          acknowledged.push(...batch.map((e) => e.id));
          head = res.json().head;
        } else {
          refused.push(res.statusCode);
          expect(res.json().code).toBe('TRANSITION_ILLEGAL');
        }
      }
    })();
    while (acknowledged.length < 10) await new Promise((r) => setTimeout(r, 5));
    expect((await finalize(runId)).statusCode).toBe(202);
    await appender;
    const run = await waitFinalized(t, auth, runId);
    const artifact = (await get(`/v1/artifacts/${run.artifactId}`)).json();
    expect(artifact.events.items.map((e: { id: string }) => e.id)).toEqual(acknowledged);
    expect(acknowledged.length).toBeGreaterThan(0);
    expect(refused.length).toBeGreaterThan(0);
    expect((await t.app.inject({ method: 'GET', url: `/v1/verify/${runId}` })).json().verified).toBe(true);
  });

  it('the sweeper re-enqueues a run left in finalizing without a job', async () => {
    const runId = await runWithEvidence({ accuracy: { min: 0.9 } });
    const tenantId = (await t.runtime.stores.runs.getAny(runId))!.tenantId;
    // Finalize was accepted but its enqueue never happened (say Redis failed right then).
    await t.runtime.stores.runs.beginFinalize(tenantId, runId, new Date(Date.now() - 10 * 60_000));
    const outcome = await createFinalizeProcessor(t.runtime).sweep!();
    expect(outcome).toMatchObject({ repaired: 1 });
    expect((await waitFinalized(t, auth, runId)).status).toBe('finalized');
  });
  it('the sweeper records run.finalized for a run finalized while its event could not be recorded', async () => {
    const runId = await runWithEvidence({});
    await finalize(runId);
    await waitFinalized(t, auth, runId);
    const tenantId = (await t.runtime.stores.runs.getAny(runId))!.tenantId;
    // The run reads finalized before its job has recorded run.finalized and cleared the due record: wait for the
    // job to finish, or its late insert would undo the failure staged below.
    const finished = Date.now() + 30_000;
    while (
      !(await t.runtime.stores.outbox.events.findOne({ type: 'run.finalized', 'data.runId': runId } as never)) ||
      (await t.runtime.stores.runs.finalizeDue.records.findOne({ _id: runId }))
    ) {
      if (Date.now() > finished) throw new Error('the finalize job did not finish');
      await new Promise((r) => setTimeout(r, 50));
    }
    // The state a failed emit leaves: run finalized, no run.finalized in the outbox, the due record still there.
    await t.runtime.stores.outbox.events.deleteOne({ type: 'run.finalized', 'data.runId': runId } as never);
    await t.runtime.stores.runs.finalizeDue.mark(runId, tenantId, new Date(0));
    expect(await createFinalizeProcessor(t.runtime).sweep!()).toMatchObject({ checked: 1, repaired: 1 });
    const deadline = Date.now() + 10_000;
    while (!(await t.runtime.stores.outbox.events.findOne({ type: 'run.finalized', 'data.runId': runId } as never))) {
      if (Date.now() > deadline) throw new Error('run.finalized was not recorded');
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(await t.runtime.stores.runs.finalizeDue.records.findOne({ _id: runId })).toBeNull();
  });
});
