import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ERROR_STATUS, serviceError, statusOf, X402_ERROR_STATUS } from '../../src/domain/errors.ts';

const SRC = fileURLToPath(new URL('../../src', import.meta.url));

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith('.ts') ? [path] : [];
  });
}

describe('one code → status table', () => {
  const files = sourceFiles(SRC).filter((f) => !f.endsWith(join('domain', 'errors.ts')));

  it('no error is built with an inline status outside src/domain/errors.ts', () => {
    const inline = files.filter((f) => /new ServiceError\(/.test(readFileSync(f, 'utf8')));
    expect(inline).toEqual([]);
  });

  it('every code the HTTP layer writes into an error body is in the table', () => {
    const known = new Set([...Object.keys(ERROR_STATUS), ...Object.keys(X402_ERROR_STATUS)]);
    const written = files
      .filter((f) => f.includes(`${join('src', 'http')}`))
      .flatMap((f) => [...readFileSync(f, 'utf8').matchAll(/code: '([A-Z][A-Z0-9_]+)'/g)].map((m) => m[1]!));
    expect(written.length).toBeGreaterThan(5);
    expect(written.filter((code) => !known.has(code))).toEqual([]);
  });

  it('a code is thrown at its status, and each code has one', () => {
    expect(serviceError('IDEMPOTENCY_KEY_REUSED', 'x').status).toBe(422);
    expect(serviceError('X402_AGENT_WOUND_DOWN', 'x').status).toBe(410);
    expect(statusOf('INSUFFICIENT_FUNDS')).toBe(402);
    const overlap = Object.keys(ERROR_STATUS).filter((code) => code in X402_ERROR_STATUS);
    expect(overlap).toEqual([]);
  });
});
