import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { publicKeyFromRaw } from '../../domain/crypto.ts';
import { errors, ServiceError } from '../../domain/errors.ts';
import { sameEvent, verifyEventBatch, type ChainHead, type EventEnvelope } from '../../domain/event-chain.ts';
import { MAX_TERMS, termsProblems, type Terms } from '../../domain/terms.ts';
import { newId } from '../../domain/crypto.ts';
import { jobIdFor } from '../../queues/index.ts';
import type { Runtime } from '../../runtime.ts';
import type { RunDoc } from '../../store/runs.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses, Timestamp } from '../schemas.ts';
import { AGENT_ID_PATTERN } from './agents.ts';
import { escrowLockId, lockEscrow, SettlementTermsSchema, settlementTerms } from './settlements.ts';

const Bound = Type.Union([
  Type.Object({ min: Type.Number() }, { additionalProperties: false }),
  Type.Object({ max: Type.Number() }, { additionalProperties: false }),
]);
export const TermsSchema = Type.Record(Type.String({ pattern: '^[A-Za-z][A-Za-z0-9_]{0,63}$' }), Bound, {
  maxProperties: MAX_TERMS,
  description: 'metric name -> {min} | {max} (inclusive); e.g. {"accuracy":{"min":0.9},"latencyP95":{"max":800}}',
});
const Head = Type.Object({ seq: Type.Integer(), chainHash: Type.Union([Type.String(), Type.Null()]) });
const HEX64 = Type.String({ pattern: '^[0-9a-f]{64}$' });

export const EventSchema = Type.Object(
  {
    v: Type.Literal(1),
    id: Type.String({ pattern: '^evt_[A-Za-z0-9_-]{1,128}$' }),
    runId: Type.String({ maxLength: 128 }),
    seq: Type.Integer({ minimum: 1 }),
    type: Type.String({ pattern: '^[A-Za-z][A-Za-z0-9_.:-]{0,63}$' }),
    at: Type.String({ maxLength: 64, description: 'RFC 3339 time the agent recorded the event' }),
    payload: Type.Unknown({ description: 'any JSON; metric {name, value}; sample {latencyMs?, correct?}' }),
    prevChainHash: Type.Union([HEX64, Type.Null()]),
    payloadHash: HEX64,
    chainHash: HEX64,
    signerKeyId: Type.String({ maxLength: 64 }),
    signature: Type.String({ maxLength: 200 }),
  },
  { additionalProperties: false, description: 'Agent-signed, hash-chained event (contract section 5)' },
);

const CreateRun = Type.Object(
  {
    agentId: Type.String({ pattern: AGENT_ID_PATTERN }),
    terms: Type.Optional(TermsSchema),
    settlement: Type.Optional(SettlementTermsSchema),
  },
  { additionalProperties: false },
);
export const RunView = Type.Object({
  runId: Type.String(),
  status: Type.Union([Type.Literal('in_progress'), Type.Literal('finalizing'), Type.Literal('finalized')]),
  verdict: Type.Union([Type.Literal('pass'), Type.Literal('fail'), Type.Null()]),
  artifactId: Type.Union([Type.String(), Type.Null()]),
  agentId: Type.String(),
  terms: TermsSchema,
  settlement: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  head: Head,
  eventCount: Type.Integer(),
  createdAt: Timestamp,
  finalizedAt: Type.Union([Timestamp, Type.Null()]),
});
const RunParams = Type.Object({ id: Type.String({ maxLength: 128 }) });
const AppendBody = Type.Union([
  Type.Object({ event: EventSchema }, { additionalProperties: false }),
  Type.Object({ events: Type.Array(EventSchema, { minItems: 1, maxItems: 100 }) }, { additionalProperties: false }),
]);
const Appended = Type.Object({
  runId: Type.String(),
  accepted: Type.Integer({ description: 'events of the request now in the chain (identical resends count, and change nothing)' }),
  head: Head,
});
const Finalizing = Type.Object({
  runId: Type.String(),
  status: Type.Union([Type.Literal('finalizing'), Type.Literal('finalized')]),
  artifactId: Type.Union([Type.String(), Type.Null()]),
});

export function runView(run: RunDoc, head: ChainHead): Static<typeof RunView> {
  return {
    runId: run._id,
    status: run.status,
    verdict: run.verdict,
    artifactId: run.artifactId,
    agentId: run.agentId,
    terms: run.terms,
    settlement: run.settlement as Record<string, unknown> | null,
    head,
    eventCount: head.seq,
    createdAt: run.createdAt.toISOString(),
    finalizedAt: run.finalizedAt?.toISOString() ?? null,
  };
}

export async function runRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { runtime } = opts;
  const { runs, agents } = runtime.stores;
  const tags = ['runs'];

  app.post<{ Body: Static<typeof CreateRun> }>('/v1/runs', {
    config: { access: 'runs:write' },
    schema: { tags, summary: 'Start a run of an agent under terms; with settlement, the amount is locked in the payer escrow', body: CreateRun, response: { 201: RunView, ...errorResponses(400, 401, 402, 403, 404, 409) } },
  }, async (request, reply) => {
    const tenantId = tenantOf(request);
    const terms: Terms = request.body.terms ?? {};
    const problems = termsProblems(terms);
    if (problems.length > 0) throw errors.validation('invalid terms', { errors: problems.map((message) => ({ path: 'body.terms', message })) });
    const agent = await agents.get(tenantId, request.body.agentId);
    if (!agent) throw errors.notFound('agent');
    if (agent.status !== 'active') throw errors.transitionIllegal(`agent is ${agent.status}`, agent.status);
    const runId = newId('run');
    const settlement = request.body.settlement ? settlementTerms(request.body.settlement) : null;
    // Escrow first: on 402 nothing exists. A crash between lock and insert leaves a lock the settle sweeper returns.
    if (settlement) await lockEscrow(runtime, tenantId, runId, agent._id, settlement);
    const run = await runs.create({
      _id: runId,
      tenantId,
      agentId: agent._id,
      terms,
      settlement,
      status: 'in_progress',
      verdict: null,
      artifactId: null,
      createdAt: new Date(),
      finalizeRequestedAt: null,
      finalHead: null,
      finalizedAt: null,
    });
    if (settlement) await runtime.stores.ledger.markReconciled(escrowLockId(runId)); // the lock has its run
    return reply.status(201).send(runView(run, { seq: 0, chainHash: null }));
  });

  app.get<{ Params: Static<typeof RunParams> }>('/v1/runs/:id', {
    config: { access: 'runs:read' },
    schema: { tags, summary: 'A run with its status, verdict, artifact and chain head', params: RunParams, response: { 200: RunView, ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const run = await runs.get(tenantOf(request), request.params.id);
    if (!run) throw errors.notFound('run');
    return runView(run, run.finalHead ?? (await runs.repairHead(run._id)).head);
  });

  app.post<{ Params: Static<typeof RunParams>; Body: Static<typeof AppendBody> }>('/v1/runs/:id/events', {
    config: { access: 'runs:write' },
    schema: {
      tags,
      summary: 'Append one signed event, or a batch of up to 100 (all or nothing)',
      params: RunParams,
      body: AppendBody,
      response: { 201: Appended, ...errorResponses(400, 401, 403, 404, 409) },
    },
  }, async (request, reply) => {
    const tenantId = tenantOf(request);
    const run = await runs.get(tenantId, request.params.id);
    if (!run) throw errors.notFound('run');
    if (run.status !== 'in_progress') throw errors.transitionIllegal(`run is ${run.status}`, run.status);
    const incoming = ('events' in request.body ? request.body.events : [request.body.event]) as EventEnvelope[];
    const ids = incoming.map((e) => e.id);
    if (new Set(ids).size !== ids.length) {
      throw errors.validation('a batch may not carry the same event id twice', { errors: [{ path: 'body.events', message: 'duplicate event id' }] });
    }

    // An identical resend is a no-op success; the same id with other content is a conflict. Only events at or
    // below the head can already be stored (a head cache left behind surfaces as a conflict and is repaired), so
    // the ordinary append skips this lookup.
    let { head } = await runs.head(run._id);
    const maybeResent = incoming.some((e) => e.seq <= head.seq);
    const stored = new Map(maybeResent ? (await runs.findByEventIds(run._id, ids)).map((e) => [e.id, e]) : []);
    for (const event of incoming) {
      const previous = stored.get(event.id);
      if (previous && !sameEvent(previous, event)) {
        throw errors.conflict('CHAIN_CONFLICT', `event id ${event.id} is already used by a different event`, { head, eventId: event.id });
      }
    }
    const fresh = incoming.filter((e) => !stored.has(e.id));
    if (fresh.length === 0) return reply.status(201).send({ runId: run._id, accepted: incoming.length, head });

    const agent = await agents.get(tenantId, run.agentId);
    if (!agent) throw errors.notFound('agent');
    const activeKeys = new Map(
      Object.values(agent.keys)
        .filter((k) => k.status === 'active')
        .map((k) => [k.keyId, publicKeyFromRaw(Buffer.from(k.publicKey, 'base64url'))]),
    );
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
      throw new ServiceError(400, 'SIGNATURE_INVALID', check.message, { reason: check.reason, eventId: check.eventId, index: check.index });
    }
    const newHead = await runs.append(run, head, fresh);
    return reply.status(201).send({ runId: run._id, accepted: incoming.length, head: newHead });
  });

  app.post<{ Params: Static<typeof RunParams> }>('/v1/runs/:id/finalize', {
    config: { access: 'runs:write' },
    schema: {
      tags,
      summary: 'Freeze the run and build its artifact in the background (repeat calls are harmless)',
      params: RunParams,
      response: { 202: Finalizing, ...errorResponses(401, 403, 404) },
    },
  }, async (request, reply) => {
    const tenantId = tenantOf(request);
    const run = await runs.beginFinalize(tenantId, request.params.id);
    if (run.status === 'finalizing') {
      await runtime.producers.ensure('finalize', { tenantId, runId: run._id }, jobIdFor('finalize', run._id));
    }
    return reply.status(202).send({ runId: run._id, status: run.status === 'finalized' ? 'finalized' : 'finalizing', artifactId: run.artifactId });
  });
}
