import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// The layers (README "Architecture"): http and workers on top, services in the middle, store and queues below,
// domain, and under it the client package (packages/client, imported by its name), at the bottom. These checks keep
// imports pointing one way.
const root = fileURLToPath(new URL('..', import.meta.url));

function files(dir: string): string[] {
  return readdirSync(join(root, dir)).flatMap((name) => {
    const path = join(dir, name);
    return statSync(join(root, path)).isDirectory() ? files(path) : path.endsWith('.ts') ? [path] : [];
  });
}

/** Every module a file imports or re-exports, as written. */
function specifiers(file: string): string[] {
  const text = readFileSync(join(root, file), 'utf8');
  return [...text.matchAll(/^\s*(?:import|export)\s*(?:[^'"]*?from\s+)?'([^']+)'/gm)].map((m) => m[1]!);
}

const CLIENT_PACKAGE = 'agent-settlement-client';

/** Project files a file imports, as paths relative to the repository root (the client package by its source). */
function imports(file: string): string[] {
  return specifiers(file).flatMap((s) => {
    if (s.startsWith('.')) return [relative(root, join(root, file, '..', s))];
    if (s === CLIENT_PACKAGE) return ['packages/client/src/index.ts'];
    if (s.startsWith(`${CLIENT_PACKAGE}/`)) return [`packages/client/src/${s.slice(CLIENT_PACKAGE.length + 1)}.ts`];
    return [];
  });
}

describe('layers', () => {
  it('no route imports another route, and nothing outside http/app.ts imports a route', () => {
    const offenders = [...files('src'), ...files('test')]
      .filter((f) => f !== 'src/http/app.ts')
      .flatMap((f) =>
        imports(f)
          .filter((i) => i.startsWith('src/http/routes/'))
          .map((i) => `${f} -> ${i}`),
      );
    expect(offenders).toEqual([]);
  });

  it('services, stores, queues and workers never reach up into http', () => {
    const offenders = ['src/services', 'src/store', 'src/queues', 'src/workers'].flatMap(files).flatMap((f) =>
      imports(f)
        .filter((i) => i.startsWith('src/http/'))
        .map((i) => `${f} -> ${i}`),
    );
    expect(offenders).toEqual([]);
  });

  it('the runtime and the stores never reach up into services', () => {
    const offenders = ['src/runtime.ts', ...files('src/store')].flatMap((f) =>
      imports(f)
        .filter((i) => i.startsWith('src/services/'))
        .map((i) => `${f} -> ${i}`),
    );
    expect(offenders).toEqual([]);
  });

  it('services read and write MongoDB only through store methods (no collection call of their own)', () => {
    const collectionCall =
      /\.(findOne|find|insertOne|insertMany|updateOne|updateMany|deleteOne|deleteMany|replaceOne|countDocuments|aggregate|bulkWrite)\(\s*\{/;
    const offenders = files('src/services').flatMap((f) =>
      readFileSync(join(root, f), 'utf8')
        .split('\n')
        .flatMap((line, i) => (collectionCall.test(line) ? [`${f}:${i + 1}: ${line.trim()}`] : [])),
    );
    expect(offenders).toEqual([]);
  });

  it('no import circle in src and the client package (type imports included)', () => {
    const graph = new Map(
      [...files('src'), ...files('packages/client/src')].map((f) => [f, imports(f).filter((i) => i.endsWith('.ts'))]),
    );
    const circles: string[] = [];
    const state = new Map<string, 'open' | 'done'>();
    const visit = (file: string, path: string[]) => {
      if (state.get(file) === 'done') return;
      if (state.get(file) === 'open') {
        circles.push([...path.slice(path.indexOf(file)), file].join(' -> '));
        return;
      }
      state.set(file, 'open');
      for (const next of graph.get(file) ?? []) if (graph.has(next)) visit(next, [...path, file]);
      state.set(file, 'done');
    };
    for (const file of graph.keys()) visit(file, []);
    expect(circles).toEqual([]);
  });

  it('domain imports nothing outside itself but the client package', () => {
    const offenders = files('src/domain').flatMap((f) =>
      imports(f)
        .filter((i) => !i.startsWith('src/domain/') && !i.startsWith('packages/client/src/'))
        .map((i) => `${f} -> ${i}`),
    );
    expect(offenders).toEqual([]);
  });

  it('the x402 scheme packages (run in other processes) import only pure domain modules and each other', () => {
    const offenders = files('src/x402').flatMap((f) =>
      imports(f)
        .filter(
          (i) => !i.startsWith('src/domain/') && !i.startsWith('src/x402/') && !i.startsWith('packages/client/src/'),
        )
        .map((i) => `${f} -> ${i}`),
    );
    expect(offenders).toEqual([]);
  });

  it("the client package (run in users' processes) imports nothing from src/ and no server dependency", () => {
    const own = files('packages/client/src');
    const offenders = own.flatMap((f) =>
      specifiers(f)
        .filter((s) =>
          s.startsWith('.')
            ? !relative(root, join(root, f, '..', s)).startsWith('packages/client/src/')
            : !s.startsWith('node:') && s !== 'openapi-fetch',
        )
        .map((s) => `${f} -> ${s}`),
    );
    expect(own.length).toBeGreaterThan(10);
    expect(offenders).toEqual([]);
    // What an install of the package brings: openapi-fetch (and its one helper package), nothing of the service.
    const manifest = JSON.parse(readFileSync(join(root, 'packages/client/package.json'), 'utf8'));
    expect(Object.keys(manifest.dependencies ?? {})).toEqual(['openapi-fetch']);
    expect(manifest.peerDependencies ?? {}).toEqual({});
  });
});
