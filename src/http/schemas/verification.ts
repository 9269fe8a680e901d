import { Type, type Static } from 'typebox';
import type { Verification } from '../../services/verification.ts';
import { Timestamp } from './common.ts';

const Checks = Type.Object({
  artifactHash: Type.Boolean(),
  serviceSignature: Type.Boolean(),
  eventSignatures: Type.Boolean(),
  chain: Type.Boolean(),
  pricing: Type.Optional(
    Type.Boolean({ description: 'a priced run only: its usage and amount recomputed from the events match' }),
  ),
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
export const PublicVerification = Type.Object({
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
export const RunVerification = Type.Intersect([
  PublicVerification,
  Type.Object({
    status: Type.String(),
    eventCount: Type.Integer(),
    durationMs: Type.Integer({ description: 'from run creation to the finalize request (the artifact finalizedAt)' }),
  }),
]);
export const VerifyParams = Type.Object({
  id: Type.String({ maxLength: 128, description: 'a run id or an artifact id' }),
});
export const ArtifactParams = Type.Object({ artifactId: Type.String({ maxLength: 128 }) });
export const ArtifactBody = Type.Object({ schema: Type.Literal('RunArtifact.v1') }, { additionalProperties: true });
const Jwk = Type.Object({
  kty: Type.Literal('OKP'),
  crv: Type.Literal('Ed25519'),
  x: Type.String(),
  kid: Type.String(),
  use: Type.String(),
  alg: Type.String(),
  status: Type.String(),
});
export const Jwks = Type.Object({ keys: Type.Array(Jwk) });

export function verificationView(
  { artifact, result, settlement }: Verification,
  jwksUrl: string,
): Static<typeof PublicVerification> {
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
    settlement,
  };
}
