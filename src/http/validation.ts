import { TypeBoxValidatorCompiler } from '@fastify/type-provider-typebox';
import type { FastifySchemaCompiler } from 'fastify';
import type { TSchema } from 'typebox';
import { explainValidationErrors } from './validation-errors.ts';

/**
 * TypeBox's validator, with strict conversion of query strings, path parameters and headers. TypeBox converts
 * loosely (`?limit=true` becomes 1, `?limit=` becomes 0), so a request the document forbids would be accepted; here
 * a number or integer must be written as one and a boolean as `true` or `false`, else the value stays a string
 * and fails validation with 400. Bodies are never converted (a string is not an amount).
 */
const INTEGER = /^-?\d+$/;
const NUMBER = /^-?\d+(\.\d+)?([eE][+-]?\d+)?$/;

function strictlyConvertible(schema: TSchema | undefined, value: unknown): boolean {
  if (typeof value !== 'string' || !schema) return true;
  const type = (schema as { type?: unknown }).type;
  if (type === 'integer') return INTEGER.test(value);
  if (type === 'number') return NUMBER.test(value);
  if (type === 'boolean') return value === 'true' || value === 'false';
  return true;
}

export const strictValidatorCompiler: FastifySchemaCompiler<TSchema> = (route) => {
  const validate = TypeBoxValidatorCompiler(route);
  const isBody = route.httpPart === 'body';
  // One clear error per offending path (validation-errors.ts); a body names the JSON type it got, the URL's parts
  // are all strings.
  const explain = (value: unknown, errors: unknown) =>
    explainValidationErrors(route.schema, value, errors as Parameters<typeof explainValidationErrors>[2], {
      describeActual: isBody,
    });
  const properties = ((route.schema as { properties?: Record<string, TSchema> }).properties ?? {}) as Record<
    string,
    TSchema
  >;
  return (value) => {
    if (!isBody && value && typeof value === 'object') {
      for (const [name, given] of Object.entries(value as Record<string, unknown>)) {
        if (!strictlyConvertible(properties[name], given)) {
          const error = { keyword: 'type', instancePath: `/${name}`, schemaPath: `#/properties/${name}`, params: {} };
          return { error: explain(value, [error]) };
        }
      }
    }
    const result = validate(value) as { value?: unknown; error?: unknown };
    return result.error ? { error: explain(value, result.error) } : { value: result.value };
  };
};
