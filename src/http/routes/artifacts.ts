import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { getArtifact, verifyPublic, verifyRun } from '../../services/verification.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses } from '../schemas/common.ts';
import { RunParams } from '../schemas/runs.ts';
import {
  ArtifactBody,
  ArtifactParams,
  Jwks,
  PublicVerification,
  RunVerification,
  verificationView,
  VerifyParams,
} from '../schemas/verification.ts';

export async function artifactRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const tags = ['verification'];
  const jwksUrl = `${runtime.config.publicBaseUrl}/.well-known/jwks.json`;

  app.get(
    '/.well-known/jwks.json',
    {
      config: { access: 'public' },
      schema: {
        tags,
        operationId: 'getJwks',
        summary: 'The service public signing keys, current and retired',
        response: { 200: Jwks },
      },
    },
    async (_request, reply) => {
      reply.header('cache-control', 'public, max-age=300');
      return runtime.keys.jwks;
    },
  );

  app.get<{ Params: Static<typeof ArtifactParams> }>(
    '/v1/artifacts/:artifactId',
    {
      config: { access: 'runs:read' },
      schema: {
        tags,
        operationId: 'getArtifact',
        summary: 'The full RunArtifact.v1: every event envelope, the evaluation, the service signature',
        params: ArtifactParams,
        response: { 200: ArtifactBody, ...errorResponses(401, 403, 404) },
      },
    },
    async (request, reply) => {
      const artifact = await getArtifact(runtime, tenantOf(request), request.params.artifactId);
      // Serialised once here: artifacts can hold many thousands of events.
      return reply.type('application/json; charset=utf-8').send(JSON.stringify(artifact));
    },
  );

  /** Public: anyone holding a run or artifact id can check it; nothing beyond the artifact's own content is shown. */
  app.get<{ Params: Static<typeof VerifyParams> }>(
    '/v1/verify/:id',
    {
      config: { access: 'public' },
      schema: {
        tags,
        operationId: 'verifyArtifact',
        summary: 'Verify an artifact (by artifact or run id) without credentials',
        params: VerifyParams,
        response: { 200: PublicVerification, ...errorResponses(404) },
      },
    },
    async (request) => verificationView(await verifyPublic(runtime, request.params.id), jwksUrl),
  );

  app.get<{ Params: Static<typeof RunParams> }>(
    '/runs/:runId/verification',
    {
      config: { access: 'runs:read' },
      schema: {
        tags,
        operationId: 'getRunVerification',
        summary: 'The verification of one of your runs, with its status and size',
        params: RunParams,
        response: { 200: RunVerification, ...errorResponses(401, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }) },
      },
    },
    async (request) => {
      const verification = await verifyRun(runtime, tenantOf(request), request.params.runId);
      const { run, artifact } = verification;
      return {
        ...verificationView(verification, jwksUrl),
        status: run.status,
        eventCount: artifact.events.count,
        durationMs: run.finalizeRequestedAt!.getTime() - run.createdAt.getTime(),
      };
    },
  );
}
