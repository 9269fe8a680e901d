// Own RFC 8785 (JCS) implementation: the `canonicalize` package silently drops undefined/functions and follows toJSON
// (so Dates etc. slip through); signed hashes need every non-JSON value rejected loudly, not coerced.

/** A value of the JSON data model, the only input JCS is defined for. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

export type CanonicalJsonErrorReason =
  'NON_FINITE_NUMBER' | 'LONE_SURROGATE' | 'UNSUPPORTED_TYPE' | 'CIRCULAR' | 'TOO_DEEP';

/** Thrown when a value has no RFC 8785 representation. `path` points at the offending value (JSONPath-like). */
export class CanonicalJsonError extends Error {
  readonly code = 'CANONICAL_JSON_INVALID';
  constructor(
    readonly reason: CanonicalJsonErrorReason,
    readonly path: string,
    message: string,
  ) {
    super(`${message} at ${path}`);
    this.name = 'CanonicalJsonError';
  }
}

/**
 * Nesting limit: the serializer recurses, so an absurdly deep document must fail with a typed error rather than a
 * RangeError from the call stack. 1000 levels is far beyond any legitimate payload.
 */
export const MAX_DEPTH = 1000;

// With the `u` flag a well-formed surrogate pair is one code point, so this class only matches *lone* surrogates.
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

function serializeString(s: string, path: string): string {
  if (LONE_SURROGATE.test(s)) {
    throw new CanonicalJsonError('LONE_SURROGATE', path, 'string contains a lone surrogate');
  }
  // For well-formed strings JSON.stringify escapes exactly as RFC 8785 3.2.2.2 requires: \b \t \n \f \r \" \\,
  // other controls as lowercase \u00xx, everything else (including U+2028/2029 and DEL) literal.
  return JSON.stringify(s);
}

function serializeNumber(n: number, path: string): string {
  if (!Number.isFinite(n)) {
    throw new CanonicalJsonError('NON_FINITE_NUMBER', path, `number ${String(n)} is not allowed`);
  }
  // ECMAScript Number::toString is the RFC 8785 number format; JSON.stringify applies it and maps -0 to "0".
  return JSON.stringify(n);
}

function isPlainObject(v: object): v is Record<string, unknown> {
  const proto = Object.getPrototypeOf(v) as unknown;
  return proto === Object.prototype || proto === null;
}

function childPath(path: string, key: string): string {
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

function serialize(value: unknown, path: string, depth: number, ancestors: Set<object>): string {
  switch (typeof value) {
    case 'string':
      return serializeString(value, path);
    case 'number':
      return serializeNumber(value, path);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'object':
      break;
    default:
      // undefined, bigint, symbol, function: JSON.stringify would drop or throw inconsistently; we always refuse.
      throw new CanonicalJsonError('UNSUPPORTED_TYPE', path, `${typeof value} is not a JSON value`);
  }
  if (value === null) return 'null';
  if (depth >= MAX_DEPTH) {
    throw new CanonicalJsonError('TOO_DEEP', path, `nesting deeper than ${MAX_DEPTH}`);
  }
  if (ancestors.has(value)) {
    throw new CanonicalJsonError('CIRCULAR', path, 'circular reference');
  }
  ancestors.add(value);
  let out: string;
  if (Array.isArray(value)) {
    const parts: string[] = [];
    // Index loop (not map/forEach) so holes in sparse arrays are visited and rejected as undefined.
    for (let i = 0; i < value.length; i++) {
      parts.push(serialize(value[i], `${path}[${i}]`, depth + 1, ancestors));
    }
    out = `[${parts.join(',')}]`;
  } else if (isPlainObject(value)) {
    if (Object.getOwnPropertySymbols(value).length > 0) {
      throw new CanonicalJsonError('UNSUPPORTED_TYPE', path, 'symbol-keyed property');
    }
    // Array.prototype.sort without a comparator orders by UTF-16 code units, exactly RFC 8785 3.2.3.
    const keys = Object.keys(value).sort();
    const parts: string[] = [];
    for (const key of keys) {
      const p = childPath(path, key);
      parts.push(`${serializeString(key, p)}:${serialize(value[key], p, depth + 1, ancestors)}`);
    }
    out = `{${parts.join(',')}}`;
  } else {
    // Date, Map, Buffer, class instances...: no implicit toJSON/coercion in signed data.
    const name = (value as { constructor?: { name?: string } }).constructor?.name ?? 'object';
    throw new CanonicalJsonError('UNSUPPORTED_TYPE', path, `${name} is not a plain JSON object`);
  }
  ancestors.delete(value);
  return out;
}

/**
 * RFC 8785 canonical JSON of `value`. Throws CanonicalJsonError for anything outside the JSON data model:
 * NaN/±Infinity, lone surrogates (in strings or keys), undefined, bigint, symbols, functions, non-plain objects,
 * cycles, and nesting deeper than MAX_DEPTH.
 */
export function canonicalize(value: unknown): string {
  return serialize(value, '$', 0, new Set());
}
