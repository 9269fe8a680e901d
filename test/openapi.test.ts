import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Validator } from '@seriousme/openapi-schema-validator';
import { describe, expect, it } from 'vitest';
import { generateClientFiles, generateOpenApi, OPENAPI_PATH } from '../scripts/write-openapi.ts';

describe('openapi/openapi.json', () => {
  it('matches what the route schemas generate (run `npm run openapi` after changing a route)', async () => {
    const generated = await generateOpenApi();
    expect(readFileSync(OPENAPI_PATH, 'utf8')).toBe(generated);
  });

  it("and the client package's types (packages/client/src/generated/) match the document (run `npm run openapi`)", async () => {
    const files = await generateClientFiles(readFileSync(OPENAPI_PATH, 'utf8'));
    expect(Object.keys(files).length).toBe(2);
    for (const [path, text] of Object.entries(files)) expect(readFileSync(path, 'utf8'), path).toBe(text);
  });

  it('is a valid OpenAPI 3.1 document in which every operation but the public ones names its scope', async () => {
    const doc = JSON.parse(readFileSync(OPENAPI_PATH, 'utf8'));
    expect(doc.openapi).toBe('3.1.0');
    const result = await new Validator().validate(doc);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    const publicPaths = new Set([
      '/',
      '/docs',
      '/healthz',
      '/readyz',
      '/metrics',
      '/v1/verify/{id}',
      '/.well-known/jwks.json',
      '/x402/facilitator/supported',
    ]);
    for (const [path, item] of Object.entries<Record<string, { 'x-required-scope'?: string; security?: unknown[] }>>(
      doc.paths,
    )) {
      for (const operation of Object.values(item)) {
        if (!publicPaths.has(path)) expect(operation['x-required-scope'], path).toBeTypeOf('string');
        else expect(operation.security, path).toEqual([]);
      }
    }
  });

  it('passes `redocly lint` (recommended rules, redocly.yaml) with no error and no warning', async () => {
    const root = fileURLToPath(new URL('..', import.meta.url));
    const lint = await promisify(execFile)(
      `${root}node_modules/.bin/redocly`,
      ['lint', OPENAPI_PATH, '--config', `${root}redocly.yaml`, '--format=json'],
      {
        cwd: root,
        env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
        maxBuffer: 16 * 1024 * 1024,
      },
    ).catch((err: { stdout?: string }) => ({ stdout: err.stdout ?? '' })); // exits 1 on errors; the report says which
    const report = JSON.parse(lint.stdout) as {
      totals: { errors: number; warnings: number };
      problems: Array<{ ruleId: string; message: string; location: Array<{ pointer: string }> }>;
    };
    const problems = report.problems.map((p) => `${p.ruleId} ${p.location[0]?.pointer}: ${p.message}`);
    expect(problems).toEqual([]);
    expect(report.totals).toMatchObject({ errors: 0, warnings: 0 });
  }, 60_000);

  it('gives generated clients a method name, an example body and the error codes of every operation', () => {
    type Operation = {
      operationId?: string;
      requestBody?: { content: Record<string, { example?: unknown }> };
      responses: Record<string, { description: string; content?: Record<string, { schema?: { $ref?: string } }> }>;
      'x-error-codes'?: Record<string, string[]>;
    };
    const doc = JSON.parse(readFileSync(OPENAPI_PATH, 'utf8'));
    const ids: string[] = [];
    for (const [path, item] of Object.entries<Record<string, Operation>>(doc.paths)) {
      for (const [method, operation] of Object.entries(item)) {
        const where = `${method.toUpperCase()} ${path}`;
        expect(operation.operationId, where).toMatch(/^[a-z][a-zA-Z0-9]*$/);
        ids.push(operation.operationId!);
        if (operation.requestBody)
          expect(operation.requestBody.content['application/json']?.example, where).toBeDefined();
        for (const [status, response] of Object.entries(operation.responses)) {
          if (response.content?.['application/json']?.schema?.$ref !== '#/components/schemas/ErrorBody') continue;
          const codes = operation['x-error-codes']?.[status];
          expect(codes?.length, `${where} ${status}`).toBeGreaterThan(0);
          for (const code of codes!) expect(response.description, `${where} ${status}`).toContain(`\`${code}\``);
        }
      }
    }
    expect(new Set(ids).size).toBe(ids.length);
    expect(doc.servers.length).toBeGreaterThan(0);
    const tagged = new Set(doc.tags.map((t: { name: string; description?: string }) => t.description && t.name));
    for (const item of Object.values<Record<string, { tags: string[] }>>(doc.paths)) {
      for (const operation of Object.values(item))
        for (const tag of operation.tags) expect(tagged.has(tag), tag).toBe(true);
    }
  });
});
