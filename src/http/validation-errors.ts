import type { FastifySchemaValidationError } from 'fastify';

/**
 * Turns TypeBox's validation errors into one clear error per offending path.
 *
 * TypeBox reports every failing keyword of every union branch: one unknown key in an agent registration gave seven
 * errors (each branch's "must have required properties", "schema is false" for the key, "must not have additional
 * properties" for its object, the pattern of a field that was never the problem). Here each raw error becomes a
 * finding at the path it is about (a missing or unknown key at the key itself), a failed union keeps only the branch
 * the value came closest to (or, when branches tie, says what the union accepts), and each path keeps its most basic
 * finding. Messages name what was expected in words; raw schema phrases never reach the caller.
 *
 * Written here rather than taken from a library: the ajv error prettifiers expect ajv's params (`missingProperty`,
 * `additionalProperty`) and do not choose among union branches; TypeBox's errors carry arrays and a `boolean` keyword.
 */

type Schema = Record<string, unknown>;

interface RawError {
  keyword: string;
  schemaPath: string;
  instancePath: string;
  params?: Record<string, unknown>;
  message?: string;
}

/** How basic a finding is: a path keeps the finding with the lowest rank. */
const RANK = { unknown: 0, missing: 0, type: 1, value: 2, constraint: 3, summary: 9 } as const;
type Kind = keyof typeof RANK;

interface Finding {
  path: string[];
  kind: Kind;
  message: string;
  /** The raw error's schema path: unions are found by it. */
  schemaPath: string;
  /** For an unknown key: the keys its object accepts (merged when tied union branches agree on the key). */
  allowed?: string[];
  order: number;
}

export function explainValidationErrors(
  rootSchema: unknown,
  value: unknown,
  errors: readonly RawError[],
  options: { describeActual: boolean },
): FastifySchemaValidationError[] {
  const root = (rootSchema ?? {}) as Schema;
  let order = 0;
  const findings = errors.flatMap((error) =>
    toFindings(root, value, error, options.describeActual).map((f) => ({ ...f, order: order++ })),
  );
  const chosen = onePerPath(resolveUnions(root, findings, ''));
  return chosen.map((f) => ({
    keyword: f.kind,
    instancePath: f.path.map((s) => '/' + s.replace(/~/g, '~0').replace(/\//g, '~1')).join(''),
    schemaPath: f.schemaPath,
    params: {},
    message: f.kind === 'unknown' ? unknownKeyMessage(f.allowed ?? []) : f.message,
  }));
}

// ---- raw error -> findings ------------------------------------------------------------------------------------

function toFindings(root: Schema, value: unknown, error: RawError, describeActual: boolean): Omit<Finding, 'order'>[] {
  const path = splitPointer(error.instancePath);
  const at = resolveSchema(root, error.schemaPath);
  const base = { schemaPath: error.schemaPath };
  switch (error.keyword) {
    case 'required': {
      const missing =
        (error.params?.requiredProperties as string[] | undefined) ??
        (error.params?.missingProperty ? [String(error.params.missingProperty)] : []);
      const properties = (at?.properties ?? {}) as Record<string, Schema>;
      return missing.map((key) => ({
        ...base,
        path: [...path, key],
        kind: 'missing' as const,
        message: `is required (expected ${describe(properties[key])})`,
      }));
    }
    case 'additionalProperties': {
      const keys =
        (error.params?.additionalProperties as string[] | undefined) ??
        (error.params?.additionalProperty ? [String(error.params.additionalProperty)] : []);
      return keys.map((key) => ({
        ...base,
        path: [...path, key],
        kind: 'unknown' as const,
        message: '',
        allowed: knownKeys(at),
      }));
    }
    case 'boolean': {
      // `additionalProperties: false` reports each extra key as "schema is false" too: the same unknown key.
      if (error.schemaPath.endsWith('/additionalProperties')) {
        const parent = resolveSchema(root, error.schemaPath.slice(0, -'/additionalProperties'.length));
        return [{ ...base, path, kind: 'unknown', message: '', allowed: knownKeys(parent) }];
      }
      return [{ ...base, path, kind: 'constraint', message: 'is not allowed here' }];
    }
    case 'type': {
      const given = valueAt(value, path);
      // An empty request body reaches the validator as null, as a JSON `null` does.
      const got = path.length === 0 && given == null ? 'no body (or null)' : jsonType(given);
      const actual = describeActual ? `, got ${got}` : '';
      return [{ ...base, path, kind: 'type', message: `expected ${describe(at, error.params?.type)}${actual}` }];
    }
    case 'const':
      return [
        { ...base, path, kind: 'value', message: `must be ${JSON.stringify(error.params?.allowedValue ?? at?.const)}` },
      ];
    case 'enum':
      return [{ ...base, path, kind: 'value', message: `must be ${oneOf((at?.enum as unknown[]) ?? [])}` }];
    case 'anyOf':
    case 'oneOf':
      return [{ ...base, path, kind: 'summary', message: `expected ${describe(at)}` }];
    case 'propertyNames':
      return [{ ...base, path, kind: 'summary', message: 'has keys that are not allowed' }];
  }
  const isKeyName = error.schemaPath.endsWith('/propertyNames');
  return [
    {
      ...base,
      path,
      kind: 'constraint',
      message: (isKeyName ? 'is not an allowed key: ' : '') + constraintMessage(error, at),
    },
  ];
}

function constraintMessage(error: RawError, at: Schema | undefined): string {
  const limit = at?.[error.keyword] ?? error.params?.limit;
  switch (error.keyword) {
    case 'pattern': {
      const description = typeof at?.description === 'string' ? at.description : undefined;
      return description
        ? `does not have the expected form (${description})`
        : `must match the pattern ${String(at?.pattern ?? error.params?.pattern)}`;
    }
    case 'format':
      return `must be a valid ${String(at?.format ?? error.params?.format)}${at?.format === 'date-time' ? ' (RFC 3339)' : ''}`;
    case 'minLength':
      return limit === 1 ? 'must not be empty' : `must be at least ${String(limit)} characters long`;
    case 'maxLength':
      return `must be at most ${String(limit)} characters long`;
    case 'minimum':
      return `must be at least ${String(limit)}`;
    case 'maximum':
      return `must be at most ${String(limit)}`;
    case 'exclusiveMinimum':
      return `must be greater than ${String(limit)}`;
    case 'exclusiveMaximum':
      return `must be less than ${String(limit)}`;
    case 'multipleOf':
      return `must be a multiple of ${String(limit)}`;
    case 'minItems':
      return limit === 1 ? 'must not be empty' : `must have at least ${String(limit)} items`;
    case 'maxItems':
      return `must have at most ${String(limit)} items`;
    case 'uniqueItems':
      return 'must not repeat an item';
    case 'minProperties':
      return `must have at least ${String(limit)} keys`;
    case 'maxProperties':
      return `must have at most ${String(limit)} keys`;
  }
  return error.message && error.message !== 'schema is false' ? error.message : 'is not valid here';
}

function unknownKeyMessage(allowed: readonly string[]): string {
  return allowed.length === 0
    ? 'is not a known field (this object takes no fields)'
    : `is not a known field (expected ${allowed.length === 1 ? '' : 'one of '}${allowed.join(', ')})`;
}

// ---- unions -----------------------------------------------------------------------------------------------------

/**
 * Each failed union keeps the findings of the branch the value came closest to: the fewest findings about the
 * union's own level (its missing or unknown keys, a wrong type for the whole value), then the fewest paths. Where
 * branches tie, the findings they share stay and the union says what it accepts. Nested unions are resolved inside
 * the chosen branch.
 */
function resolveUnions(root: Schema, findings: Finding[], within: string): Finding[] {
  const unionAt = (f: Finding) => {
    const index = f.schemaPath.indexOf('/anyOf/', within.length);
    return index === -1 ? null : f.schemaPath.slice(0, index);
  };
  const groups = new Map<string, { unionPath: string; instance: string[]; members: Finding[] }>();
  const rest: Finding[] = [];
  for (const f of findings) {
    const unionPath = unionAt(f);
    if (unionPath === null) {
      rest.push(f);
      continue;
    }
    const instance = f.path.slice(0, instanceDepth(unionPath));
    const key = `${unionPath} ${JSON.stringify(instance)}`;
    const group = groups.get(key) ?? { unionPath, instance, members: [] };
    group.members.push(f);
    groups.set(key, group);
  }
  const out = [...rest];
  for (const { unionPath, instance, members } of groups.values()) {
    const branches = new Map<string, Finding[]>();
    for (const f of members) {
      const branch = /^\/anyOf\/(\d+)/.exec(f.schemaPath.slice(unionPath.length))![1]!;
      branches.set(branch, [...(branches.get(branch) ?? []), f]);
    }
    const scored = [...branches.entries()].map(([branch, own]) => {
      const resolved = onePerPath(resolveUnions(root, own, `${unionPath}/anyOf/${branch}`));
      return { resolved, score: score(resolved, instance.length) };
    });
    const best = Math.min(...scored.map((s) => s.score));
    const tied = scored.filter((s) => s.score === best);
    if (tied.length === 1) {
      out.push(...tied[0]!.resolved);
      continue;
    }
    out.push(
      ...sharedFindings(
        tied.map((t) => t.resolved),
        instance.length,
      ),
    );
    const order = Math.min(...members.map((m) => m.order));
    // A value, not a type, finding: the keys the tied branches agree are unknown stay beside it.
    const accepts = describe(resolveSchema(root, unionPath));
    out.push({ path: instance, kind: 'value', schemaPath: unionPath, order, message: `expected ${accepts}` });
  }
  // The union's own "must match a schema in anyOf" adds nothing once its branches have spoken.
  return out.filter(
    (f) => f.kind !== 'summary' || !out.some((g) => g !== f && g.kind !== 'summary' && startsWith(g.path, f.path)),
  );
}

function score(findings: Finding[], depth: number): number {
  const paths = new Set(findings.map((f) => f.path.join('/'))).size;
  const atUnionLevel = findings.filter(
    (f) =>
      ((f.kind === 'missing' || f.kind === 'unknown') && f.path.length === depth + 1) ||
      ((f.kind === 'type' || f.kind === 'value') && f.path.length === depth),
  ).length;
  return atUnionLevel * 1000 + paths;
}

/** Findings every tied branch made, below the union's own level; an unknown key lists every branch's keys. */
function sharedFindings(branches: Finding[][], depth: number): Finding[] {
  const [first, ...others] = branches;
  const shared: Finding[] = [];
  for (const f of first ?? []) {
    if (f.path.length <= depth || f.kind === 'missing') continue;
    const same = others.map((b) => b.find((g) => g.kind === f.kind && g.path.join('/') === f.path.join('/')));
    if (same.some((g) => !g)) continue;
    const allowed = f.allowed && [...new Set([f.allowed, ...same.map((g) => g!.allowed ?? [])].flat())];
    shared.push({ ...f, ...(allowed ? { allowed } : {}) });
  }
  return shared;
}

// ---- one finding per path ---------------------------------------------------------------------------------------

function onePerPath(findings: Finding[]): Finding[] {
  const byPath = new Map<string, Finding>();
  for (const f of [...findings].sort((a, b) => a.order - b.order)) {
    const key = f.path.join('/');
    const kept = byPath.get(key);
    if (!kept || RANK[f.kind] < RANK[kept.kind]) byPath.set(key, f);
  }
  const kept = [...byPath.values()];
  // Under a value of the wrong type, or an unknown key, nothing deeper is worth reading.
  return kept
    .filter(
      (f) =>
        !kept.some(
          (g) =>
            (g.kind === 'type' || g.kind === 'unknown') && g.path.length < f.path.length && startsWith(f.path, g.path),
        ),
    )
    .sort((a, b) => a.order - b.order);
}

// ---- schema and value helpers -----------------------------------------------------------------------------------

function splitPointer(pointer: string): string[] {
  if (pointer === '') return [];
  return pointer
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
}

function startsWith(path: string[], prefix: string[]): boolean {
  return prefix.every((segment, i) => path[i] === segment);
}

/** Walks a schema path (`#/properties/a/anyOf/0`); TypeBox does not escape `/` inside a patternProperties key. */
function resolveSchema(root: Schema, schemaPath: string): Schema | undefined {
  const segments = schemaPath.replace(/^#/, '').split('/').slice(1);
  let node: unknown = root;
  for (let i = 0; i < segments.length; i++) {
    if (!node || typeof node !== 'object') return undefined;
    const record = node as Record<string, unknown>;
    let segment = segments[i]!;
    while (!(segment in record) && i + 1 < segments.length) segment += '/' + segments[++i];
    node = record[segment];
  }
  return node && typeof node === 'object' ? (node as Schema) : undefined;
}

/** How many instance path segments a schema path steps into (properties/x, items, additionalProperties, …). */
function instanceDepth(schemaPath: string): number {
  const segments = schemaPath.replace(/^#/, '').split('/').slice(1);
  let depth = 0;
  for (let i = 0; i < segments.length; i++) {
    const segment = segments[i];
    if (segment === 'properties' || segment === 'patternProperties' || segment === 'prefixItems') {
      depth++;
      i++; // the name or index that follows
    } else if (segment === 'items' || segment === 'additionalProperties' || segment === 'propertyNames') depth++;
  }
  return depth;
}

function valueAt(value: unknown, path: string[]): unknown {
  let node = value;
  for (const segment of path)
    node = node && typeof node === 'object' ? (node as Record<string, unknown>)[segment] : undefined;
  return node;
}

function jsonType(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'an integer' : 'a number with a fraction';
  if (typeof value === 'object') return 'an object';
  return `a ${typeof value}`;
}

function knownKeys(schema: Schema | undefined): string[] {
  return Object.keys((schema?.properties ?? {}) as object);
}

function oneOf(values: readonly unknown[]): string {
  const shown = values.map((v) => JSON.stringify(v));
  return shown.length <= 1 ? (shown[0] ?? 'nothing') : `one of ${shown.join(', ')}`;
}

const ARTICLE: Record<string, string> = {
  string: 'a string',
  integer: 'an integer',
  number: 'a number',
  boolean: 'a boolean',
  null: 'null',
  array: 'an array',
  object: 'an object',
};

/** What a schema accepts, in a few words: "an integer from 0 to 10000", "an object with min", "a string or null". */
function describe(schema: Schema | undefined, fallbackType?: unknown): string {
  if (!schema) return typeof fallbackType === 'string' ? (ARTICLE[fallbackType] ?? fallbackType) : 'any JSON value';
  if ('const' in schema) return JSON.stringify(schema.const);
  if (Array.isArray(schema.enum)) return oneOf(schema.enum);
  if (Array.isArray(schema.anyOf)) {
    const branches = (schema.anyOf as Schema[]).map((b) => describe(b));
    if ((schema.anyOf as Schema[]).every((b) => 'const' in b))
      return oneOf((schema.anyOf as Schema[]).map((b) => b.const));
    return [...new Set(branches)].join(' or ');
  }
  const type = Array.isArray(schema.type) ? schema.type : [schema.type ?? fallbackType];
  return type
    .map((t) => {
      const word = typeof t === 'string' ? (ARTICLE[t] ?? t) : 'any JSON value';
      if (t === 'integer' || t === 'number') return word + range(schema);
      if (t === 'object' && Array.isArray(schema.required) && schema.required.length > 0)
        return `${word} with ${(schema.required as string[]).join(', ')}`;
      if (t === 'string' && typeof schema.format === 'string') return `${word} in ${schema.format} format`;
      return word;
    })
    .join(' or ');
}

function range(schema: Schema): string {
  const min = schema.minimum;
  const max = schema.maximum;
  if (typeof min === 'number' && typeof max === 'number') return ` from ${min} to ${max}`;
  if (typeof min === 'number') return ` of at least ${min}`;
  if (typeof max === 'number') return ` of at most ${max}`;
  return '';
}
