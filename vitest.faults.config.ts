import { defineConfig } from 'vitest/config';

// Process tests: each file starts its own servers and service processes (the fault tests kill some of them; the
// contract test runs schemathesis against one), so files run one at a time (they measure latency bounds the
// contract states, which a second heavy file on 2 cores would distort).
export default defineConfig({
  // tsconfig.json's paths: the client package is imported by name and run from its source.
  resolve: { tsconfigPaths: true },
  test: {
    include: ['test/faults/**/*.test.ts', 'test/contract/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 180_000,
    hookTimeout: 120_000,
    pool: 'forks',
    maxWorkers: 1,
    fileParallelism: false,
  },
});
