import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { verifyArtifact, type ArtifactVerification } from '../../domain/artifact.ts';
import { errors } from '../../domain/errors.ts';
import type { Runtime } from '../../runtime.ts';
import type { ArtifactDoc, ArtifactHeader, RunDoc } from '../../store/runs.ts';
import { readSettlement } from '../../store/settlements.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses, Timestamp } from '../schemas.ts';

const Checks = Type.Object({
  artifactHash: Type.Boolean(),
  serviceSignature: Type.Boolean(),
  eventSignatures: Type.Boolean(),
  chain: Type.Boolean(),
});
const Evaluation = Type.Object({
  verdict: Type.Union([Type.Literal('pass'), Type.Literal('fail')]),
  results: Type.Array(
    Type.Object({
      metric: Type.String(),
      bound: Type.Record(Type.String(), Type.Number()),
      value: Type.Union([Type.Number(), Type.Null()]),
      pass: Type.Boolean(),
      reason: Type.Optional(Type.String()),
    }),
  ),
});
const SettlementSummary = Type.Union([
  Type.Object({ status: Type.String(), amount: Type.Integer(), currency: Type.String() }),
  Type.Null(),
]);
const PublicVerification = Type.Object({
  verified: Type.Boolean(),
  checks: Checks,
  failures: Type.Array(Type.String()),
  artifactId: Type.String(),
  artifactHash: Type.String(),
  runId: Type.String(),
  agentId: Type.String(),
  verdict: Type.Union([Type.Literal('pass'), Type.Literal('fail')]),
  evaluation: Evaluation,
  finalizedAt: Timestamp,
  keyId: Type.String({ description: 'kid of the service key that signed the artifact' }),
  jwksUrl: Type.String(),
  settlement: SettlementSummary,
});
const RunVerification = Type.Intersect([
  PublicVerification,
  Type.Object({
    status: Type.String(),
    eventCount: Type.Integer(),
    durationMs: Type.Integer({ description: 'from run creation to the finalize request (the artifact finalizedAt)' }),
  }),
]);
const IdParams = Type.Object({ id: Type.String({ maxLength: 128 }) });
const RunIdParams = Type.Object({ runId: Type.String({ maxLength: 128 }) });
const Jwk = Type.Object({ kty: Type.Literal('OKP'), crv: Type.Literal('Ed25519'), x: Type.String(), kid: Type.String(), use: Type.String(), alg: Type.String(), status: Type.String() });

const CACHE_LIMIT = 500;

export async function artifactRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { runtime } = opts;
  const { runs } = runtime.stores;
  const jwksUrl = `${runtime.config.publicBaseUrl}/.well-known/jwks.json`;
  // Artifacts never change, so a verification outcome holds until the process restarts (the JWKS is fixed per process).
  const verified = new Map<string, ArtifactVerification>();

  const verify = async (doc: ArtifactDoc): Promise<{ artifact: ArtifactHeader; result: ArtifactVerification }> => {
    let result = verified.get(doc._id);
    if (!result) {
      result = verifyArtifact(await runs.loadArtifact(doc), runtime.keys.jwks);
      if (verified.size >= CACHE_LIMIT) verified.delete(verified.keys().next().value!);
      verified.set(doc._id, result);
    }
    return { artifact: runs.artifactHeader(doc), result };
  };

  const summary = async (artifact: ArtifactHeader, result: ArtifactVerification): Promise<Static<typeof PublicVerification>> => {
    const doc = await runtime.stores.settlements.byRun(artifact.runId);
    const settlement = doc && { ...(await readSettlement(runtime.stores.settlements, runtime.stores.ledger, doc)).view, amount: doc.amount, currency: doc.currency };
    return {
      verified: result.verified,
      checks: result.checks,
      failures: result.failures,
      artifactId: artifact.artifactId,
      artifactHash: artifact.artifactHash,
      runId: artifact.runId,
      agentId: artifact.agentId,
      verdict: artifact.evaluation.verdict,
      evaluation: artifact.evaluation as Static<typeof Evaluation>,
      finalizedAt: artifact.finalizedAt,
      keyId: artifact.signature.keyId,
      jwksUrl,
      settlement: settlement ? { status: settlement.status, amount: settlement.amount, currency: settlement.currency } : null,
    };
  };

  app.get('/.well-known/jwks.json', {
    config: { access: 'public' },
    schema: { tags: ['verification'], summary: 'The service public signing keys, current and retired', response: { 200: Type.Object({ keys: Type.Array(Jwk) }) } },
  }, async (_request, reply) => {
    reply.header('cache-control', 'public, max-age=300');
    return runtime.keys.jwks;
  });

  app.get<{ Params: Static<typeof IdParams> }>('/v1/artifacts/:id', {
    config: { access: 'runs:read' },
    schema: {
      tags: ['verification'],
      summary: 'The full RunArtifact.v1: every event envelope, the evaluation, the service signature',
      params: IdParams,
      response: { 200: Type.Object({ schema: Type.Literal('RunArtifact.v1') }, { additionalProperties: true }), ...errorResponses(401, 403, 404) },
    },
  }, async (request, reply) => {
    const doc = await runs.getArtifactDoc(request.params.id);
    if (!doc || doc.tenantId !== tenantOf(request)) throw errors.notFound('artifact');
    // Serialised once here: artifacts can hold many thousands of events.
    return reply.type('application/json; charset=utf-8').send(JSON.stringify(await runs.loadArtifact(doc)));
  });

  /** Public: anyone holding a run or artifact id can check it; nothing beyond the artifact's own content is shown. */
  app.get<{ Params: Static<typeof IdParams> }>('/v1/verify/:id', {
    config: { access: 'public' },
    schema: { tags: ['verification'], summary: 'Verify an artifact (by artifact or run id) without credentials', params: IdParams, response: { 200: PublicVerification, ...errorResponses(404) } },
  }, async (request) => {
    const id = request.params.id;
    let doc: ArtifactDoc | null = null;
    if (id.startsWith('art_')) doc = await runs.getArtifactDoc(id);
    else {
      const run = await runs.getAny(id);
      if (run?.artifactId) doc = await runs.getArtifactDoc(run.artifactId);
    }
    if (!doc) throw errors.notFound('artifact');
    const { artifact, result } = await verify(doc);
    return await summary(artifact, result);
  });

  app.get<{ Params: Static<typeof RunIdParams> }>('/runs/:runId/verification', {
    config: { access: 'runs:read' },
    schema: { tags: ['verification'], summary: 'The verification of one of your runs, with its status and size', params: RunIdParams, response: { 200: RunVerification, ...errorResponses(401, 403, 404, 409) } },
  }, async (request) => {
    const run: RunDoc | null = await runs.get(tenantOf(request), request.params.runId);
    if (!run) throw errors.notFound('run');
    if (run.status !== 'finalized' || !run.artifactId) throw errors.transitionIllegal('the run has no artifact yet', run.status);
    const doc = await runs.getArtifactDoc(run.artifactId);
    if (!doc) throw errors.notFound('artifact');
    const { artifact, result } = await verify(doc);
    return {
      ...(await summary(artifact, result)),
      status: run.status,
      eventCount: artifact.events.count,
      durationMs: run.finalizeRequestedAt!.getTime() - run.createdAt.getTime(),
    };
  });
}
