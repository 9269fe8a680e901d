import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { openDispute, resolveDispute } from '../../services/disputes.ts';
import { getRunSettlement, resolveHeldSettlement, settleRun } from '../../services/settlement.ts';
import { tenantOf } from '../plugins/auth.ts';
import { emptyBodyIsObject, errorResponses } from '../schemas/common.ts';
import { RunParams } from '../schemas/runs.ts';
import {
  DisputeBody,
  DisputeOpened,
  DisputeParams,
  DisputeRuling,
  HeldRuling,
  SettleAccepted,
  SettleBody,
  Settlement,
  SettlementParams,
  settlementView,
} from '../schemas/settlements.ts';

export async function settlementRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const tags = ['settlement'];

  app.post<{ Params: Static<typeof RunParams>; Body: Static<typeof SettleBody> | undefined }>(
    '/v1/runs/:runId/settle',
    {
      config: { access: 'runs:write' },
      preValidation: emptyBodyIsObject,
      schema: {
        tags,
        operationId: 'settleRun',
        summary:
          'Settle a finalized run: a worker releases (pass) or holds (fail) the escrow; repeats return the same settlement',
        params: RunParams,
        body: SettleBody,
        response: { 202: SettleAccepted, ...errorResponses(400, 401, 402, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }) },
      },
    },
    async (request, reply) => {
      const { run, settlement, state } = await settleRun(
        runtime,
        tenantOf(request),
        request.params.runId,
        request.body?.settlement,
      );
      return reply.status(202).send({ runId: run._id, settlementId: settlement._id, status: state.view.status });
    },
  );

  app.get<{ Params: Static<typeof RunParams> }>(
    '/runs/:runId/settlement',
    {
      config: { access: 'runs:read' },
      schema: {
        tags,
        operationId: 'getRunSettlement',
        summary: 'The settlement of a run, with its decision and signed receipt',
        params: RunParams,
        response: { 200: Settlement, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => settlementView(await getRunSettlement(runtime, tenantOf(request), request.params.runId)),
  );

  app.post<{ Params: Static<typeof RunParams>; Body: Static<typeof DisputeBody> }>(
    '/v1/runs/:runId/disputes',
    {
      config: { access: 'runs:write' },
      schema: {
        tags,
        operationId: 'openDispute',
        summary: 'Dispute a completed settlement inside its window: freezes the holdback',
        params: RunParams,
        body: DisputeBody,
        response: { 201: DisputeOpened, ...errorResponses(400, 401, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }) },
      },
    },
    async (request, reply) =>
      reply.status(201).send(await openDispute(runtime, tenantOf(request), request.params.runId, request.body)),
  );

  // Rulings answer 200 once applied, or 202 with the ruling recorded and still applying (it completes by itself).
  app.post<{ Params: Static<typeof DisputeParams>; Body: Static<typeof DisputeRuling> }>(
    '/ops/disputes/:disputeId/resolve',
    {
      config: { access: 'admin' },
      schema: {
        tags,
        operationId: 'resolveDispute',
        summary: 'Rule on an open dispute: the frozen holdback goes to the payee, the payer, or is split',
        params: DisputeParams,
        body: DisputeRuling,
        response: {
          200: Settlement,
          202: Settlement,
          ...errorResponses(400, 401, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }),
        },
      },
    },
    async (request, reply) => {
      const { state, applied } = await resolveDispute(runtime, request.params.disputeId, request.body);
      return reply.status(applied ? 200 : 202).send(settlementView(state));
    },
  );

  app.post<{ Params: Static<typeof SettlementParams>; Body: Static<typeof HeldRuling> }>(
    '/ops/settlements/:settlementId/resolve',
    {
      config: { access: 'admin' },
      schema: {
        tags,
        operationId: 'resolveHeldSettlement',
        summary: 'End a held settlement: release the escrow to the payee, or refund the payer',
        params: SettlementParams,
        body: HeldRuling,
        response: {
          200: Settlement,
          202: Settlement,
          ...errorResponses(400, 401, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }),
        },
      },
    },
    async (request, reply) => {
      const { state, applied } = await resolveHeldSettlement(
        runtime,
        request.params.settlementId,
        request.body.outcome,
      );
      return reply.status(applied ? 200 : 202).send(settlementView(state));
    },
  );
}
