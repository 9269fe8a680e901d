import type { Runtime } from '../runtime.ts';
import { smokeTestJob } from '../services/onboarding.ts';
import type { QueueProcessor } from './runner.ts';

/** The `smoke-test` queue: starts the MCP server with a bootstrap env and records what it saw (services/onboarding.ts). */
export function createSmokeTestProcessor(runtime: Runtime): QueueProcessor<'smoke-test'> {
  return {
    async process(payload) {
      const { outcome } = await smokeTestJob(runtime, payload);
      return { passed: outcome.passed, failedStep: outcome.failedStep };
    },
  };
}
