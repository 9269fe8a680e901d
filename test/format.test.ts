import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';

// The formatter nobody argues with: code that `npm run format` would change fails here, in CI, with its file names.
it('every source file is formatted by prettier (npm run format:check)', () => {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const result = spawnSync(process.execPath, ['node_modules/prettier/bin/prettier.cjs', '--list-different', '.'], {
    cwd: root,
    encoding: 'utf8',
  });
  expect(result.stdout.trim().split('\n').filter(Boolean)).toEqual([]);
  expect(result.status).toBe(0);
}, 600_000);
