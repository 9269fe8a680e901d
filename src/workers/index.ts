import type { Runtime } from '../runtime.ts';
import { createFinalizeProcessor } from './finalize.ts';
import type { ProcessorMap } from './runner.ts';
import { createSettleProcessor } from './settle.ts';
import { createSmokeTestProcessor } from './smoke-test.ts';
import { createWebhookDispatchProcessor } from './webhook-dispatch.ts';
import { createX402VerifyProcessor } from './x402-verify.ts';

/** The processor for each queue this codebase can work; a queue without one is not started. */
export function createProcessors(runtime: Runtime): ProcessorMap {
  return {
    finalize: createFinalizeProcessor(runtime),
    settle: createSettleProcessor(runtime),
    'x402-verify': createX402VerifyProcessor(runtime),
    'webhook-dispatch': createWebhookDispatchProcessor(runtime),
    'smoke-test': createSmokeTestProcessor(runtime),
  };
}
