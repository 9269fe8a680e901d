import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';

it('typechecks under TypeScript strict (tsc --noEmit)', () => {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const result = spawnSync(process.execPath, ['node_modules/typescript/bin/tsc', '--noEmit', '-p', 'tsconfig.json'], {
    cwd: root,
    encoding: 'utf8',
  });
  expect(result.stdout + result.stderr).toBe('');
  expect(result.status).toBe(0);
}, 600_000);
