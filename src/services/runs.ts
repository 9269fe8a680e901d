import { ArtifactBuildError, buildArtifact } from '../domain/artifact.ts';
import { CanonicalJsonError } from '../domain/canonical-json.ts';
import { assertClientJsonDepth } from '../domain/client-json.ts';
import { idFromIdempotency, newId, publicKeyFromRaw } from '../domain/crypto.ts';
import { errors, ServiceError, serviceError } from '../domain/errors.ts';
import { createHmac, type KeyObject } from 'node:crypto';
import {
  attestationHolds,
  batchAttestation,
  sameEvent,
  signatureKey,
  verifyEventBatch,
  type ChainHead,
  type EventEnvelope,
  type SignatureVerified,
} from '../domain/event-chain.ts';
import { parsePriceSchedule, pricingProblems, type PriceSchedule } from '../domain/pricing.ts';
import { termsProblems, type Terms } from '../domain/terms.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { AgentDoc } from '../store/agents.ts';
import type { AppendTarget, RunDoc } from '../store/runs.ts';
import { signingAgent } from './agents.ts';
import { settlementTerms, withRunEscrow, type SettlementTermsInput } from './escrow.ts';
import { emitEvent } from './events.ts';
import { sweptPartitions } from './sweep-items.ts';
import { logStep } from './work-log.ts';

/** The key of batch attestations, derived from the at-rest key every process of a deployment shares. */
const attestationKeys = new WeakMap<Runtime, Buffer>();
function attestationKey(runtime: Runtime): Buffer {
  let key = attestationKeys.get(runtime);
  if (!key)
    attestationKeys.set(
      runtime,
      (key = createHmac('sha256', runtime.config.atRestKey).update('run-batch-attestation/v1').digest()),
    );
  return key;
}

/**
 * The events of these stored batches whose signatures this service verified at append (their attestation holds),
 * so a full-chain check need not repeat those Ed25519 checks. A batch without a valid attestation (written before
 * attestations, under another key, or altered in storage) is simply checked in full.
 */
export function attestedSignatures(
  runtime: Runtime,
  runId: string,
  batches: ReadonlyArray<{ events: EventEnvelope[]; attestation: string | null }>,
): SignatureVerified {
  const key = attestationKey(runtime);
  const verified = new Set<string>();
  for (const b of batches) {
    if (b.attestation !== null && attestationHolds(key, runId, b.events, b.attestation))
      for (const e of b.events) verified.add(signatureKey(e));
  }
  return (e) => verified.has(signatureKey(e));
}

/**
 * The agent's active keys as KeyObjects. Building a KeyObject took ~0.4 ms per append under load; the agent
 * document is the credential cache's (one object until it is invalidated), so its keys are built once per entry.
 */
const keyObjects = new WeakMap<AgentDoc, Map<string, KeyObject>>();
function activeKeysOf(agent: AgentDoc): Map<string, KeyObject> {
  let keys = keyObjects.get(agent);
  if (!keys) {
    keys = new Map(
      Object.values(agent.keys)
        .filter((k) => k.status === 'active')
        .map((k) => [k.keyId, publicKeyFromRaw(Buffer.from(k.publicKey, 'base64url'))]),
    );
    keyObjects.set(agent, keys);
  }
  return keys;
}

export interface RunWithHead {
  run: RunDoc;
  head: ChainHead;
}

/**
 * Starts a run of an agent under terms; with settlement terms the amount is locked in the payer's escrow first.
 * `idempotencyScope` (the client's Idempotency-Key and who sent it) names the run: a retry after a crash or a 5xx
 * finishes that same run and its one reserve instead of starting a second.
 */
export async function createRun(
  runtime: Runtime,
  tenantId: string,
  input: { agentId: string; terms?: Terms; pricing?: PriceSchedule; settlement?: SettlementTermsInput },
  idempotencyScope: string | null = null,
): Promise<RunWithHead> {
  const { runs, agents } = runtime.stores;
  const terms: Terms = input.terms ?? {};
  const problems = termsProblems(terms);
  if (problems.length > 0)
    throw errors.unprocessable('invalid terms', {
      errors: problems.map((message) => ({ path: 'body.terms', message })),
    });
  const pricingFaults = input.pricing === undefined ? [] : pricingProblems(input.pricing);
  if (pricingFaults.length > 0)
    throw errors.unprocessable('invalid price schedule', {
      errors: pricingFaults.map((message) => ({ path: 'body.pricing', message })),
    });
  const pricing = input.pricing === undefined ? {} : { pricing: parsePriceSchedule(input.pricing) };
  const agent = await agents.get(tenantId, input.agentId);
  if (!agent) throw errors.notFound('agent');
  if (agent.status !== 'active') throw errors.transitionIllegal(`agent is ${agent.status}`, agent.status);
  const runId = idempotencyScope ? idFromIdempotency('run', idempotencyScope) : newId('run');
  const settlement = input.settlement ? settlementTerms(input.settlement) : null;
  const insert = () =>
    runs.createOrResume({
      _id: runId,
      tenantId,
      agentId: agent._id,
      terms,
      ...pricing,
      settlement,
      status: 'in_progress',
      verdict: null,
      artifactId: null,
      createdAt: new Date(),
      finalizeRequestedAt: null,
      finalHead: null,
      finalizedAt: null,
      finalizeError: null,
    });
  const run = settlement
    ? await withRunEscrow(runtime, tenantId, runId, agent._id, settlement, insert)
    : await insert();
  return { run, head: { seq: 0, chainHash: null } };
}

/** The run with its chain head (the frozen one once sealed, else the live head). */
export async function getRun(runtime: Runtime, tenantId: string, runId: string): Promise<RunWithHead> {
  const { runs } = runtime.stores;
  if (runs.hasHeadHint(runId)) {
    // This process knows a head of the run: the run and the position after that head are read at once.
    const [run, current] = await Promise.all([runs.get(tenantId, runId), runs.repairHead(runId)]);
    if (!run) throw errors.notFound('run');
    return { run, head: run.finalHead ?? current.head };
  }
  // The run and its cached head are read at once; the head is then checked against the next position.
  const [run, cached] = await Promise.all([runs.get(tenantId, runId), runs.head(runId)]);
  if (!run) throw errors.notFound('run');
  return { run, head: run.finalHead ?? (await runs.repairHead(run._id, cached)).head };
}

/**
 * Appends agent-signed events (one batch, all or nothing). An identical resend is a no-op success; the same id with
 * other content is a conflict. `accepted` counts the request's events now in the chain.
 */
export async function appendEvents(
  runtime: Runtime,
  tenantId: string,
  runId: string,
  incoming: EventEnvelope[],
): Promise<{ runId: string; accepted: number; head: ChainHead }> {
  const { runs } = runtime.stores;
  incoming.forEach((e, i) => assertClientJsonDepth(e.payload, `body.events[${i}].payload`));
  const [run, cached] = await Promise.all([runs.getForAppend(tenantId, runId), runs.knownHead(runId)]);
  if (!run) throw errors.notFound('run');
  if (run.status !== 'in_progress') throw errors.transitionIllegal(`run is ${run.status}`, run.status);
  try {
    return await appendToRun(runtime, run, cached.head, incoming);
  } catch (err) {
    // The run was remembered in progress, and a seal refused the append: say what the run is now.
    if (!(err instanceof ServiceError && err.code === 'TRANSITION_ILLEGAL')) throw err;
    const now = await runs.get(tenantId, runId);
    throw now && now.status !== 'in_progress' ? errors.transitionIllegal(`run is ${now.status}`, now.status) : err;
  }
}

async function appendToRun(
  runtime: Runtime,
  run: AppendTarget,
  knownHead: ChainHead,
  incoming: EventEnvelope[],
): Promise<{ runId: string; accepted: number; head: ChainHead }> {
  const { runs } = runtime.stores;
  const tenantId = run.tenantId;
  const ids = incoming.map((e) => e.id);
  if (new Set(ids).size !== ids.length) {
    throw errors.unprocessable('a batch may not carry the same event id twice', {
      errors: [{ path: 'body.events', message: 'duplicate event id' }],
    });
  }

  // Only events at or below the head can already be stored (a head cache left behind surfaces as a conflict and is
  // repaired), so the ordinary append skips this lookup.
  let head = knownHead;
  const maybeResent = incoming.some((e) => e.seq <= head.seq);
  const stored = new Map(maybeResent ? (await runs.findByEventIds(run._id, head, ids)).map((e) => [e.id, e]) : []);
  for (const event of incoming) {
    const previous = stored.get(event.id);
    if (previous && !sameEvent(previous, event)) {
      throw errors.conflict('CHAIN_CONFLICT', `event id ${event.id} is already used by a different event`, {
        head,
        eventId: event.id,
      });
    }
  }
  const fresh = incoming.filter((e) => !stored.has(e.id));
  if (fresh.length === 0) return { runId: run._id, accepted: incoming.length, head };

  const activeKeys = activeKeysOf(await signingAgent(runtime, tenantId, run.agentId));
  let check = verifyEventBatch(fresh, head, activeKeys, run._id);
  if (!check.ok && check.code === 'CHAIN_CONFLICT') {
    // The cached head may trail an appender that stopped after storing its batch: repair, then judge again.
    const repaired = await runs.repairHead(run._id);
    if (repaired.sealed) throw errors.transitionIllegal('the run is being finalized', 'finalizing');
    if (repaired.head.seq !== head.seq) {
      head = repaired.head;
      check = verifyEventBatch(fresh, head, activeKeys, run._id);
    }
  }
  if (!check.ok) {
    if (check.code === 'CHAIN_CONFLICT') {
      throw errors.conflict('CHAIN_CONFLICT', check.message, { head, eventId: check.eventId, index: check.index });
    }
    throw serviceError('SIGNATURE_INVALID', check.message, {
      reason: check.reason,
      eventId: check.eventId,
      index: check.index,
    });
  }
  // Every signature of the batch verified just now: attest it, so finalize and verify need not check them again.
  const newHead = await runs.append(run, head, fresh, batchAttestation(attestationKey(runtime), run._id, fresh));
  return { runId: run._id, accepted: incoming.length, head: newHead };
}

/** Seals the run and makes sure its finalize job will run; repeats are harmless and return the run as it is. */
export async function requestFinalize(runtime: Runtime, tenantId: string, runId: string): Promise<RunDoc> {
  const run = await runtime.stores.runs.beginFinalize(tenantId, runId);
  if (run.status === 'finalizing') {
    await runtime.producers.ensure('finalize', { tenantId, runId: run._id }, jobIdFor('finalize', run._id));
  }
  return run;
}

/** Build failures no retry can cure: the run's stored data cannot make an artifact. */
function isPermanentBuildFailure(err: unknown): err is Error {
  return err instanceof ArtifactBuildError || err instanceof CanonicalJsonError;
}

/**
 * The finalize job: builds the content-addressed artifact, evaluates the terms, marks the run finalized and emits
 * run.finalized. Every step is idempotent (the artifact id is its hash over data frozen at the seal, the run moves
 * only from finalizing, the event id derives from the run), so a crash anywhere is repaired by a retry. A run whose
 * data can never make an artifact is finalized with verdict `fail` and the reason, so its escrow is held by the
 * settlement rules instead of staying locked behind a job that retries for ever; that is logged as an alert.
 */
export async function finalizeRun(
  runtime: Runtime,
  tenantId: string,
  runId: string,
): Promise<{ artifactId: string | null; verdict: string | null } | { skipped: string }> {
  const { runs, agents } = runtime.stores;
  let run = await runs.get(tenantId, runId);
  if (!run || run.status === 'in_progress') return { skipped: run ? 'not finalizing' : 'no such run' };

  if (run.status === 'finalizing') {
    const finalHead = run.finalHead!;
    const [chain, agent] = await Promise.all([runs.readChain(runId, finalHead.seq), agents.get(tenantId, run.agentId)]);
    let outcome: Pick<RunDoc, 'artifactId' | 'verdict' | 'finalizeError'>;
    try {
      if (!agent) throw new ArtifactBuildError(`agent ${run.agentId} of run ${runId} is missing`);
      const artifact = buildArtifact(
        {
          runId,
          agentId: run.agentId,
          agentKeys: Object.values(agent.keys).map((k) => ({ keyId: k.keyId, publicKey: k.publicKey })),
          terms: run.terms,
          pricing: run.pricing ?? null,
          events: chain.events,
          finalizedAt: run.finalizeRequestedAt!.toISOString(),
          signatureVerified: attestedSignatures(runtime, runId, chain.batches),
        },
        runtime.keys.active,
      );
      await runs.saveArtifact(tenantId, artifact);
      await runs.markFinalized(runId, artifact.artifactId, artifact.evaluation.verdict);
      outcome = { artifactId: artifact.artifactId, verdict: artifact.evaluation.verdict, finalizeError: null };
    } catch (err) {
      if (!isPermanentBuildFailure(err)) throw err;
      runtime.logger.error(
        { alert: 'finalize_failed', runId, err: err.message },
        'run cannot be finalized into an artifact; finalized as fail',
      );
      const finalizeError = { code: 'ARTIFACT_BUILD_FAILED', message: err.message };
      await runs.markFinalizeFailed(runId, finalizeError);
      outcome = { artifactId: null, verdict: 'fail', finalizeError };
    }
    // Every worker derives the same outcome from the data frozen at the seal, so whichever wrote the run, it now
    // holds this: no need to read it back.
    run = { ...run, status: 'finalized', ...outcome };
    // A repeated job finds the run finalized already and skips this branch, so the line is written once.
    logStep(runtime, 'run.finalized', {
      tenantId,
      runId,
      agentId: run.agentId,
      verdict: run.verdict,
      artifactId: run.artifactId,
      events: finalHead.seq,
      error: run.finalizeError?.code ?? null,
    });
  }

  await emitEvent(
    runtime,
    tenantId,
    'run.finalized',
    {
      runId,
      artifactId: run.artifactId,
      verdict: run.verdict,
      status: run.status,
      ...(run.finalizeError ? { error: run.finalizeError.code } : {}),
    },
    `run.finalized:${runId}`,
  );
  // Only now is nothing owed: a failure before this line (Redis away at the emit, say) leaves the run findable.
  await runs.finalizeDue.done(runId);
  return { artifactId: run.artifactId, verdict: run.verdict };
}

/** Runs whose finalize is owed: left in finalizing, or finalized before run.finalized was recorded (job lost or failed). */
export async function sweepFinalizing(
  runtime: Runtime,
  limit: number,
  partition?: number,
): Promise<{ checked: number; repaired: number }> {
  const stale: RunDoc[] = [];
  for await (const p of sweptPartitions(runtime, 'finalize', runtime.stores.runs.finalizeDue, partition)) {
    stale.push(
      ...(await runtime.stores.runs.staleFinalizing(
        new Date(Date.now() - runtime.config.sweeper.staleAfterMs),
        limit,
        p,
      )),
    );
  }
  let repaired = 0;
  for (const run of stale) {
    const outcome = await runtime.producers.ensure(
      'finalize',
      { tenantId: run.tenantId, runId: run._id },
      jobIdFor('finalize', run._id),
    );
    if (outcome !== 'live') repaired++;
  }
  if (repaired > 0) runtime.logger.warn({ repaired }, 'finalize sweeper re-enqueued runs');
  return { checked: stale.length, repaired };
}
