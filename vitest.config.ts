import { defineConfig } from 'vitest/config';

export default defineConfig({
  // tsconfig.json's paths: the client package is imported by name and run from its source.
  resolve: { tsconfigPaths: true },
  test: {
    include: ['test/**/*.test.ts'],
    // test/faults/ stops and kills real servers and processes, and test/contract/ runs schemathesis against a service
    // process; they run on their own, one file at a time (vitest.faults.config.ts, `npm run test:faults`;
    // scripts/test.sh runs both).
    exclude: ['test/faults/**', 'test/contract/**', '**/node_modules/**'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Each file gets its own database and Redis key prefix, so files run in parallel.
    pool: 'forks',
    maxWorkers: 2,
  },
});
