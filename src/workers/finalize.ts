import type { Runtime } from '../runtime.ts';
import { finalizeRun, sweepFinalizing } from '../services/runs.ts';
import type { QueueProcessor } from './runner.ts';

const SWEEP_BATCH = 200;

/** The `finalize` queue: builds a run's artifact (services/runs.ts finalizeRun); the sweeper repairs lost jobs. */
export function createFinalizeProcessor(runtime: Runtime): QueueProcessor<'finalize'> {
  return {
    process: ({ tenantId, runId }) => finalizeRun(runtime, tenantId, runId),
    sweep: (partition) => sweepFinalizing(runtime, SWEEP_BATCH, partition),
    sweepsPerPartition: true,
  };
}
