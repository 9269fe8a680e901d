import { STATUS_CODES } from 'node:http';
import type { FastifyInstance, RouteOptions } from 'fastify';
import fp from 'fastify-plugin';
import FindMyWay, { type HTTPMethod } from 'find-my-way';
import { Type, type TSchema } from 'typebox';
import { ERROR_CODES_KEY } from '../schemas/common.ts';

/**
 * Keeps what the OpenAPI document promises and what the service does in step:
 * - every route declares the error statuses the platform itself can answer (validation, credentials, rate limit,
 *   idempotency, body limits, backends away), so a client generated from the document knows them all;
 * - every error response names the `code`s it can carry: in its description (what renderers show and generators copy
 *   into doc comments) and in the operation's `x-error-codes` (status -> codes, for tools); a route that declares a
 *   status no code is known for fails at start-up;
 * - a path that exists under other methods answers 405 with `Allow`, not 404. A path that names a fixed resource
 *   (`/x402/gate/create`) is that resource, even where a parametric route would also match it
 *   (`GET /x402/gate/{gateId}`): its methods are the fixed route's, as the document lists them.
 */
const ErrorRef = Type.Ref('ErrorBody');
const BODY_METHODS = new Set(['POST', 'PUT', 'PATCH']);
const METHODS: HTTPMethod[] = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

function platformStatuses(route: RouteOptions, methods: string[]): number[] {
  const schema = (route.schema ?? {}) as Record<string, unknown>;
  const access = route.config?.access;
  const statuses = new Set<number>([414, 503]); // 414: any URL past the limit (only a request the schema forbids)
  const hasBody = methods.some((m) => BODY_METHODS.has(m));
  // 400: the request breaks its schema; 422: it keeps the schema but breaks a rule no schema can state.
  if (schema.params || schema.querystring || schema.headers || hasBody) [400, 422].forEach((s) => statuses.add(s));
  if (access !== 'public' && access !== undefined) [401, 403].forEach((s) => statuses.add(s));
  if (route.config?.rateLimit !== false) statuses.add(429);
  if (hasBody) [413, 415].forEach((s) => statuses.add(s)); // body limit and media type
  if (methods.some((m) => m === 'POST' || m === 'PUT')) statuses.add(409); // idempotency in progress (not on PATCH)
  return [...statuses];
}

/** Codes the platform answers under a status on any route that has it; routes add their own (errorResponses). */
function platformCodes(status: number, methods: string[]): string[] {
  const idempotent = methods.some((m) => m === 'POST' || m === 'PUT'); // plugins/idempotency.ts
  switch (status) {
    case 400:
      return ['VALIDATION_FAILED', ...(idempotent ? ['INVALID_IDEMPOTENCY_KEY'] : [])];
    case 401:
      return ['UNAUTHENTICATED'];
    case 402:
      return ['INSUFFICIENT_FUNDS'];
    case 403:
      return ['FORBIDDEN'];
    case 404:
      return ['NOT_FOUND'];
    case 409:
      return idempotent ? ['IDEMPOTENCY_IN_PROGRESS'] : [];
    case 410:
      return ['X402_AGENT_WOUND_DOWN'];
    case 413:
      return ['BODY_TOO_LARGE'];
    case 414:
      return ['URI_TOO_LONG'];
    case 415:
      return ['UNSUPPORTED_MEDIA_TYPE'];
    case 422:
      return ['VALIDATION_FAILED', ...(idempotent ? ['IDEMPOTENCY_KEY_REUSED'] : [])];
    case 429:
      return ['RATE_LIMITED'];
    case 503:
      return ['UNAVAILABLE'];
    default:
      return [];
  }
}

type ErrorBodyRef = { $ref: 'ErrorBody'; [ERROR_CODES_KEY]?: string[] };

function isErrorBody(schema: TSchema | undefined): schema is TSchema & ErrorBodyRef {
  return (schema as { $ref?: string } | undefined)?.$ref === 'ErrorBody';
}

/**
 * The responses with each ErrorBody one described by its codes, and status -> codes. A new object: routes may share
 * one response map (one schema under two paths), and each must see the codes as its route declared them.
 */
function listErrorCodes(route: RouteOptions, methods: string[], declared: Record<string, TSchema>) {
  const listed: Record<string, string[]> = {};
  const response = { ...declared };
  for (const [status, schema] of Object.entries(declared)) {
    if (!isErrorBody(schema)) continue;
    const codes = [...new Set([...(schema[ERROR_CODES_KEY] ?? []), ...platformCodes(Number(status), methods)])].sort();
    if (codes.length === 0)
      throw new Error(
        `route ${methods.join(',')} ${route.url} answers ${status} without naming its error codes (errorResponses)`,
      );
    listed[status] = codes;
    const description = `${STATUS_CODES[Number(status)] ?? 'Error'}. \`code\`: ${codes.map((c) => `\`${c}\``).join(', ')}.`;
    response[status] = Type.Ref('ErrorBody', { description });
  }
  return { listed, response };
}

export default fp(async function contractPlugin(app: FastifyInstance, opts: { maxParamLength: number }) {
  const router = FindMyWay({ ignoreTrailingSlash: false, maxParamLength: opts.maxParamLength });
  /** Methods of each path without parameters. */
  const fixedPaths = new Map<string, Set<string>>();

  app.addHook('onRoute', (route) => {
    const methods = ([] as string[]).concat(route.method).map((m) => m.toUpperCase());
    for (const method of methods) {
      if (method !== 'HEAD' || !methods.includes('GET'))
        router.on(method.toUpperCase() as HTTPMethod, route.url, () => undefined);
    }
    if (!/[:*]/.test(route.url)) {
      const known = fixedPaths.get(route.url) ?? new Set<string>();
      for (const method of methods) known.add(method);
      if (known.has('GET')) known.add('HEAD');
      fixedPaths.set(route.url, known);
    }
    const schema = route.schema as
      { response?: Record<string, TSchema>; hide?: boolean; [ERROR_CODES_KEY]?: unknown } | undefined;
    if (!schema?.response || schema.hide) return;
    for (const status of platformStatuses(route, methods)) schema.response[status] ??= ErrorRef;
    // HEAD routes Fastify adds for a GET share its schema, already listed.
    if (schema[ERROR_CODES_KEY]) return;
    const { listed, response } = listErrorCodes(route, methods, schema.response);
    schema.response = response;
    schema[ERROR_CODES_KEY] = listed;
  });

  // Before any body handling: a method the path does not have is 405 whatever it carries.
  app.addHook('onRequest', async (request, reply) => {
    const path = request.url.split('?')[0]!;
    const fixed = fixedPaths.get(path);
    if (fixed?.has(request.method) || (!fixed && !request.is404)) return;
    const allowed = fixed ? METHODS.filter((m) => fixed.has(m)) : METHODS.filter((m) => router.find(m, path) !== null);
    if (allowed.length === 0) return;
    reply.header('allow', allowed.join(', '));
    return reply.status(405).send({
      code: 'METHOD_NOT_ALLOWED',
      message: `${request.method} is not allowed here; use ${allowed.join(', ')}`,
      details: { allowed },
      requestId: request.id,
    });
  });
});
