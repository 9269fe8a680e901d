import { readFileSync } from 'node:fs';
import { Validator } from '@seriousme/openapi-schema-validator';
import { describe, expect, it } from 'vitest';
import { generateOpenApi, OPENAPI_PATH } from '../scripts/write-openapi.ts';

describe('openapi/openapi.json', () => {
  it('matches what the route schemas generate (run `npm run openapi` after changing a route)', async () => {
    const generated = await generateOpenApi();
    expect(readFileSync(OPENAPI_PATH, 'utf8')).toBe(generated);
  });

  it('is a valid OpenAPI 3.1 document in which every operation but the public ones names its scope', async () => {
    const doc = JSON.parse(readFileSync(OPENAPI_PATH, 'utf8'));
    expect(doc.openapi).toBe('3.1.0');
    const result = await new Validator().validate(doc);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    const publicPaths = new Set(['/healthz', '/readyz', '/metrics', '/v1/verify/{id}', '/.well-known/jwks.json']);
    for (const [path, item] of Object.entries<Record<string, { 'x-required-scope'?: string }>>(doc.paths)) {
      for (const operation of Object.values(item)) {
        if (!publicPaths.has(path)) expect(operation['x-required-scope'], path).toBeTypeOf('string');
      }
    }
  });
});
