// Builds dist/esm and dist/cjs (JavaScript and .d.ts) with tsc, once per module format; `npm pack` runs it (prepack).
import { execFileSync } from 'node:child_process';
import { rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('..', import.meta.url));
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');

rmSync(`${here}dist`, { recursive: true, force: true });
for (const project of ['tsconfig.esm.json', 'tsconfig.cjs.json']) {
  execFileSync(process.execPath, [tsc, '-p', project], { cwd: here, stdio: 'inherit' });
}
// The package is "type": "module"; this tells Node (and TypeScript) that the files under dist/cjs are CommonJS.
writeFileSync(`${here}dist/cjs/package.json`, '{ "type": "commonjs" }\n');
