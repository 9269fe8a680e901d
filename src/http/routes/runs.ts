import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import type { EventEnvelope } from '../../domain/event-chain.ts';
import type { Runtime } from '../../runtime.ts';
import { appendEvents, createRun, getRun, requestFinalize } from '../../services/runs.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses } from '../schemas/common.ts';
import { AppendBody, Appended, CreateRun, Finalizing, RunParams, RunView, runView } from '../schemas/runs.ts';

export async function runRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const tags = ['runs'];

  app.post<{ Body: Static<typeof CreateRun> }>(
    '/v1/runs',
    {
      config: { access: 'runs:write' },
      schema: {
        tags,
        operationId: 'createRun',
        summary: 'Start a run of an agent under terms; with settlement, the amount is locked in the payer escrow',
        body: CreateRun,
        response: { 201: RunView, ...errorResponses(400, 401, 402, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }) },
      },
    },
    async (request, reply) => {
      const { run, head } = await createRun(runtime, tenantOf(request), request.body, request.idempotencyScope);
      return reply.status(201).send(runView(run, head));
    },
  );

  app.get<{ Params: Static<typeof RunParams> }>(
    '/v1/runs/:runId',
    {
      config: { access: 'runs:read' },
      schema: {
        tags,
        operationId: 'getRun',
        summary: 'A run with its status, verdict, artifact and chain head',
        params: RunParams,
        response: { 200: RunView, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => {
      const { run, head } = await getRun(runtime, tenantOf(request), request.params.runId);
      return runView(run, head);
    },
  );

  app.post<{ Params: Static<typeof RunParams>; Body: Static<typeof AppendBody> }>(
    '/v1/runs/:runId/events',
    {
      config: { access: 'runs:write' },
      schema: {
        tags,
        operationId: 'appendRunEvents',
        summary: 'Append one signed event, or a batch of up to 100 (all or nothing)',
        params: RunParams,
        body: AppendBody,
        response: {
          201: Appended,
          ...errorResponses(401, 403, 404, {
            400: ['SIGNATURE_INVALID'],
            409: ['CHAIN_CONFLICT', 'TRANSITION_ILLEGAL'],
          }),
        },
      },
    },
    async (request, reply) => {
      const incoming = ('events' in request.body ? request.body.events : [request.body.event]) as EventEnvelope[];
      return reply.status(201).send(await appendEvents(runtime, tenantOf(request), request.params.runId, incoming));
    },
  );

  app.post<{ Params: Static<typeof RunParams> }>(
    '/v1/runs/:runId/finalize',
    {
      config: { access: 'runs:write' },
      schema: {
        tags,
        operationId: 'finalizeRun',
        summary: 'Freeze the run and build its artifact in the background (repeat calls are harmless)',
        params: RunParams,
        response: { 202: Finalizing, ...errorResponses(401, 403, 404) },
      },
    },
    async (request, reply) => {
      const run = await requestFinalize(runtime, tenantOf(request), request.params.runId);
      return reply.status(202).send({
        runId: run._id,
        status: run.status === 'finalized' ? 'finalized' : 'finalizing',
        artifactId: run.artifactId,
      });
    },
  );
}
