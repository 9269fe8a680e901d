import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

// Every variable src/config.ts reads is explained in the README's configuration table: a setting nobody can find
// (say, the one that allows a localhost webhook receiver) is a setting nobody can use.
const root = new URL('..', import.meta.url);

describe('README configuration table', () => {
  it('names every environment variable src/config.ts reads', () => {
    const config = readFileSync(new URL('src/config.ts', root), 'utf8');
    const readme = readFileSync(new URL('README.md', root), 'utf8');
    const table = readme.slice(readme.indexOf('## Configuration'), readme.indexOf('## Operating it'));
    const read = new Set(
      [...config.matchAll(/env\.([A-Z][A-Z0-9_]+)|\(env, '([A-Z][A-Z0-9_]+)'/g)].map((m) => m[1] ?? m[2]!),
    );
    expect(read.size).toBeGreaterThan(30);
    const documented = new Set([...table.matchAll(/`([A-Z][A-Z0-9_]+)`/g)].map((m) => m[1]!));
    expect([...read].filter((name) => !documented.has(name)).sort()).toEqual([]);
  });
});
