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

async function verifyDoc(rt: Runtime, doc: ArtifactDoc): Promise<Verification> {
  let cache = verified.get(rt);
  if (!cache) verified.set(rt, (cache = new Map()));
  const artifact = rt.stores.runs.artifactHeader(doc);
  // The settlement does not depend on the checks: read it while they run.
  const settlementRead = (async () => {
    const s = await rt.stores.settlements.byRun(artifact.runId);
    return (
      s && {
        status: (await readSettlement(rt.stores.settlements, rt.stores.ledger, s)).view.status,
        amount: s.amount,
        currency: s.currency,
      }
    );
  })();
  let result = cache.get(doc._id);
  if (!result) {
    try {
      // Every check runs, except the Ed25519 checks of events this service attested when it verified them at append.
      const { artifact: full, batches } = await rt.stores.runs.loadArtifactChain(doc);
      result = verifyArtifact(full, rt.keys.jwks, { signatureVerified: attestedSignatures(rt, doc.runId, batches) });
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
export async function getArtifact(rt: Runtime, tenantId: string, artifactId: string): Promise<RunArtifact> {
  const doc = await rt.stores.runs.getArtifactDoc(artifactId);
  if (!doc || doc.tenantId !== tenantId) throw errors.notFound('artifact');
  return rt.stores.runs.loadArtifact(doc);
}

/** Public verification by artifact id or run id: anyone holding the id may check it. */
export async function verifyPublic(rt: Runtime, id: string): Promise<Verification> {
  let doc: ArtifactDoc | null = null;
  if (id.startsWith('art_')) doc = await rt.stores.runs.getArtifactDoc(id);
  else {
    const run = await rt.stores.runs.getAny(id);
    if (run?.artifactId) doc = await rt.stores.runs.getArtifactDoc(run.artifactId);
  }
  if (!doc) throw errors.notFound('artifact');
  return verifyDoc(rt, doc);
}

/** The verification of one of the tenant's runs, with the run itself. */
export async function verifyRun(rt: Runtime, tenantId: string, runId: string): Promise<Verification & { run: RunDoc }> {
  const run = await rt.stores.runs.get(tenantId, runId);
  if (!run) throw errors.notFound('run');
  if (run.status !== 'finalized' || !run.artifactId)
    throw errors.transitionIllegal('the run has no artifact yet', run.status);
  const doc = await rt.stores.runs.getArtifactDoc(run.artifactId);
  if (!doc) throw errors.notFound('artifact');
  return { ...(await verifyDoc(rt, doc)), run };
}
