import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { PRODUCTION_NODE_FLAGS } from '../bench/production-service.ts';

// The memory flags production runs with are written in four places; the benchmarks measure with the bench's copy, so
// a place that drifts would run something other than what was measured.
const read = (path: string) => readFileSync(new URL(`../${path}`, import.meta.url), 'utf8');
const nodeFlags = (commandLine: string) => commandLine.split(/[\s",[\]]+/).filter((word) => /^--(?!import)/.test(word));

describe('node flags of the production start', () => {
  it.each([
    [
      'Dockerfile ENTRYPOINT',
      () =>
        read('Dockerfile')
          .split('\n')
          .find((line) => line.startsWith('ENTRYPOINT'))!,
    ],
    [
      'npm run start:prod',
      () => (JSON.parse(read('package.json')) as { scripts: Record<string, string> }).scripts['start:prod']!,
    ],
    [
      'npm start (scripts/start.sh)',
      () =>
        read('scripts/start.sh')
          .split('\n')
          .find((line) => line.startsWith('exec node'))!
          .split('#')[0]!,
    ],
  ])('%s runs node with the flags the benchmarks measured', (_where, commandLine) => {
    expect(nodeFlags(commandLine())).toEqual(PRODUCTION_NODE_FLAGS);
  });
});
