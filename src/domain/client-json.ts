// Client-chosen JSON (event payloads, agent metadata, dispute evidence): accepted within one nesting limit, and
// stored as its RFC 8785 text, so no key (`$`, `.`, NUL), nested array or depth can be rejected or reinterpreted
// by the store, and what is returned and hashed is exactly what the client sent.
import { canonicalize, MAX_DEPTH } from './canonical-json.ts';
import { errors } from './errors.ts';

/**
 * Deepest nesting a client may send. Far below MAX_DEPTH, so an event payload stays serialisable inside its
 * artifact (which wraps it a few levels deeper) and in every offline verifier.
 */
export const MAX_CLIENT_JSON_DEPTH = 128;
const ARTIFACT_WRAPPING_DEPTH = 8;
if (MAX_CLIENT_JSON_DEPTH + ARTIFACT_WRAPPING_DEPTH >= MAX_DEPTH)
  throw new Error('client JSON limit leaves no room for the artifact');

/** Nesting depth of a parsed JSON value (a scalar is 0, `[]` and `{}` are 1), without recursion. */
export function jsonDepth(value: unknown): number {
  let deepest = 0;
  const stack: Array<[unknown, number]> = [[value, 0]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (typeof v !== 'object' || v === null) continue;
    const level = depth + 1;
    if (level > deepest) deepest = level;
    for (const child of Array.isArray(v) ? v : Object.values(v)) stack.push([child, level]);
  }
  return deepest;
}

/** The JSON's stored form: its canonical text. Throws CanonicalJsonError for a value JSON cannot carry. */
export function toStoredJson(value: unknown): string {
  return canonicalize(value);
}

export function fromStoredJson<T = unknown>(text: string): T {
  return JSON.parse(text) as T;
}

/** Refuses (400 VALIDATION_FAILED, naming `path`) client JSON nested deeper than the limit. */
export function assertClientJsonDepth(value: unknown, path: string): void {
  if (jsonDepth(value) > MAX_CLIENT_JSON_DEPTH) {
    throw errors.validation(`${path} is nested deeper than ${MAX_CLIENT_JSON_DEPTH} levels`, {
      errors: [{ path, message: `nesting deeper than ${MAX_CLIENT_JSON_DEPTH}` }],
    });
  }
}
