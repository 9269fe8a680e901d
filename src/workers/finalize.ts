import { buildArtifact } from '../domain/artifact.ts';
import { jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import { emitEvent } from '../services/events.ts';
import type { QueueProcessor } from './runner.ts';

const SWEEP_BATCH = 200;

/**
 * Builds the run's content-addressed artifact, evaluates the terms, marks the run finalized and emits
 * run.finalized. Every step is idempotent: the artifact's id is its hash over data frozen at finalize time, the
 * run moves only from finalizing, and the event id derives from the run. A crash anywhere is repaired by a retry.
 */
export function createFinalizeProcessor(runtime: Runtime): QueueProcessor<'finalize'> {
  const { runs, agents } = runtime.stores;
  return {
    async process({ tenantId, runId }) {
      let run = await runs.get(tenantId, runId);
      if (!run || run.status === 'in_progress') return { skipped: run ? 'not finalizing' : 'no such run' };

      if (run.status === 'finalizing') {
        const finalHead = run.finalHead!;
        const [events, agent] = await Promise.all([runs.listEvents(runId, finalHead.seq), agents.get(tenantId, run.agentId)]);
        if (!agent) throw new Error(`agent ${run.agentId} of run ${runId} is missing`);
        const artifact = buildArtifact(
          {
            runId,
            agentId: run.agentId,
            agentKeys: Object.values(agent.keys).map((k) => ({ keyId: k.keyId, publicKey: k.publicKey })),
            terms: run.terms,
            events,
            finalizedAt: run.finalizeRequestedAt!.toISOString(),
          },
          runtime.keys.active,
        );
        await runs.saveArtifact(tenantId, artifact);
        await runs.markFinalized(runId, artifact.artifactId, artifact.evaluation.verdict);
        run = (await runs.get(tenantId, runId))!;
      }

      await emitEvent(runtime, 
        tenantId,
        'run.finalized',
        { runId, artifactId: run.artifactId, verdict: run.verdict, status: run.status },
        `run.finalized:${runId}`,
      );
      return { artifactId: run.artifactId, verdict: run.verdict };
    },

    /** Runs left in finalizing (their job lost, failed for good, or never enqueued because Redis was down). */
    async sweep() {
      const stale = await runs.staleFinalizing(new Date(Date.now() - runtime.config.sweeper.staleAfterMs), SWEEP_BATCH);
      let repaired = 0;
      for (const run of stale) {
        const outcome = await runtime.producers.ensure('finalize', { tenantId: run.tenantId, runId: run._id }, jobIdFor('finalize', run._id));
        if (outcome !== 'live') repaired++;
      }
      if (repaired > 0) runtime.logger.warn({ repaired }, 'finalize sweeper re-enqueued runs');
      return { checked: stale.length, repaired };
    },
  };
}
