import { verifyArtifact, type ArtifactVerification, type RunArtifact } from '../domain/artifact.ts';
import { errors } from '../domain/errors.ts';
import type { Runtime } from '../runtime.ts';
import type { ArtifactDoc, ArtifactHeader, RunDoc } from '../store/runs.ts';
import { readSettlement } from '../store/settlements.ts';
import { attestedSignatures } from './runs.ts';

const CACHE_LIMIT = 500;
// Artifacts never change, so a verification outcome holds until the process restarts (the JWKS is fixed per process).
const verified = new WeakMap<Runtime, Map<string, ArtifactVerification>>();

export interface Verification {
  artifact: ArtifactHeader;
  result: ArtifactVerification;
  settlement: { status: string; amount: number; currency: string } | null;
}

async function verifyDoc(runtime: Runtime, doc: ArtifactDoc): Promise<Verification> {
  let cache = verified.get(runtime);
  if (!cache) verified.set(runtime, (cache = new Map()));
  const artifact = runtime.stores.runs.artifactHeader(doc);
  // The settlement does not depend on the checks: read it while they run.
  const settlementRead = (async () => {
    const s = await runtime.stores.settlements.byRun(artifact.runId);
    return (
      s && {
        status: (await readSettlement(runtime.stores.settlements, runtime.stores.ledger, s)).view.status,
        amount: s.amount,
        currency: s.currency,
      }
    );
  })();
  let result = cache.get(doc._id);
  if (!result) {
    try {
      // Every check runs, except the Ed25519 checks of events this service attested when it verified them at append.
      const { artifact: full, batches } = await runtime.stores.runs.loadArtifactChain(doc);
      result = verifyArtifact(full, runtime.keys.jwks, {
        signatureVerified: attestedSignatures(runtime, doc.runId, batches),
      });
    } catch (err) {
      settlementRead.catch(() => undefined); // its own outcome no longer matters
      throw err;
    }
    if (cache.size >= CACHE_LIMIT) cache.delete(cache.keys().next().value!);
    cache.set(doc._id, result);
  }
  return { artifact, result, settlement: await settlementRead };
}

/** The full artifact of one of the tenant's runs. */
export async function getArtifact(runtime: Runtime, tenantId: string, artifactId: string): Promise<RunArtifact> {
  const doc = await runtime.stores.runs.getArtifactDoc(artifactId);
  if (!doc || doc.tenantId !== tenantId) throw errors.notFound('artifact');
  return runtime.stores.runs.loadArtifact(doc);
}

/** Public verification by artifact id or run id: anyone holding the id may check it. */
export async function verifyPublic(runtime: Runtime, id: string): Promise<Verification> {
  let doc: ArtifactDoc | null = null;
  if (id.startsWith('art_')) doc = await runtime.stores.runs.getArtifactDoc(id);
  else {
    const run = await runtime.stores.runs.getAny(id);
    if (run?.artifactId) doc = await runtime.stores.runs.getArtifactDoc(run.artifactId);
  }
  if (!doc) throw errors.notFound('artifact');
  return verifyDoc(runtime, doc);
}

/** The verification of one of the tenant's runs, with the run itself. */
export async function verifyRun(
  runtime: Runtime,
  tenantId: string,
  runId: string,
): Promise<Verification & { run: RunDoc }> {
  const run = await runtime.stores.runs.get(tenantId, runId);
  if (!run) throw errors.notFound('run');
  if (run.status !== 'finalized' || !run.artifactId)
    throw errors.transitionIllegal('the run has no artifact yet', run.status);
  const doc = await runtime.stores.runs.getArtifactDoc(run.artifactId);
  if (!doc) throw errors.notFound('artifact');
  return { ...(await verifyDoc(runtime, doc)), run };
}
