import type { Runtime } from '../runtime.ts';
import type { ProcessorMap } from './runner.ts';

/** The processor for each queue this codebase can work; a queue without one is not started. */
export function createProcessors(_runtime: Runtime): ProcessorMap {
  return {
    // webhook processors
  };
}
