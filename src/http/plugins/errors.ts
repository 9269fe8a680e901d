import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { CanonicalJsonError } from '../../domain/canonical-json.ts';
import { ServiceError } from '../../domain/errors.ts';
import { unreachableDependency, type DependencyOutages } from '../../outages.ts';

declare module 'fastify' {
  interface FastifyInstance {
    /** Where a 503 for a lost Redis or MongoDB is counted instead of logged (see outages.ts); null without one. */
    outages: DependencyOutages | null;
  }
}

export interface ErrorBody {
  code: string;
  message: string;
  details?: Record<string, unknown>;
  requestId: string;
}

/** Redis or MongoDB could not be reached: the caller should retry, so this is a 503, never a 500. */
export function isBackendUnavailable(err: unknown): boolean {
  return unreachableDependency(err) !== null;
}

/**
 * `details.errors`: one `{path, message}` per offending path (`body.settlement.amount`, `querystring.limit`), as the
 * validator compiler explains them (src/http/validation-errors.ts).
 */
function validationErrors(err: FastifyError): Array<{ path: string; message: string }> {
  return (err.validation ?? []).map((v) => {
    const segments = v.instancePath
      .split('/')
      .slice(1)
      .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
    return { path: [err.validationContext ?? 'body', ...segments].join('.'), message: v.message ?? 'is invalid' };
  });
}

/** The first problem in words, so a person reading only `message` knows what to fix. */
function validationMessage(errors: Array<{ path: string; message: string }>): string {
  const [first] = errors;
  if (!first) return 'the request does not match the schema';
  const more = errors.length > 1 ? ` (and ${errors.length - 1} more in details.errors)` : '';
  return `${first.path} ${first.message}${more}`;
}

export function toErrorBody(err: unknown, requestId: string): { status: number; body: ErrorBody } {
  if (err instanceof ServiceError) {
    return {
      status: err.status,
      body: { code: err.code, message: err.message, ...(err.details ? { details: err.details } : {}), requestId },
    };
  }
  if (err instanceof CanonicalJsonError) {
    // Client JSON that has no canonical form (a lone surrogate, say): the request's fault, never a server error.
    return {
      status: 400,
      body: {
        code: 'VALIDATION_FAILED',
        message: err.message,
        details: { errors: [{ path: err.path, message: err.reason }] },
        requestId,
      },
    };
  }
  if (isBackendUnavailable(err)) {
    return {
      status: 503,
      body: { code: 'UNAVAILABLE', message: 'a backing service is unavailable; retry shortly', requestId },
    };
  }
  const fe = err as FastifyError;
  if (fe.validation) {
    const errors = validationErrors(fe);
    return {
      status: 400,
      body: { code: 'VALIDATION_FAILED', message: validationMessage(errors), details: { errors }, requestId },
    };
  }
  switch (fe.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { status: 413, body: { code: 'BODY_TOO_LARGE', message: 'the body exceeds 1 MiB', requestId } };
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return {
        status: 415,
        body: { code: 'UNSUPPORTED_MEDIA_TYPE', message: 'bodies must be application/json', requestId },
      };
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return { status: 400, body: { code: 'VALIDATION_FAILED', message: 'the body is not valid JSON', requestId } };
  }
  if (err instanceof SyntaxError && (fe.statusCode === 400 || /JSON/.test(err.message))) {
    return { status: 400, body: { code: 'VALIDATION_FAILED', message: 'the body is not valid JSON', requestId } };
  }
  if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
    return {
      status: fe.statusCode,
      body: { code: 'BAD_REQUEST', message: 'the request could not be processed', requestId },
    };
  }
  return { status: 500, body: { code: 'INTERNAL', message: 'internal error; it has been logged', requestId } };
}

/** Sends an error in the contract's shape; hooks use it directly so a plugin's own error handler cannot reshape it. */
export function sendError(request: FastifyRequest, reply: FastifyReply, err: unknown) {
  // Already answered (the request deadline sent 503 while the handler was still waiting): nothing more to send.
  if (reply.sent) return reply;
  const { status, body } = toErrorBody(err, request.id);
  if (status === 503 && body.code === 'UNAVAILABLE') {
    // A lost dependency: counted into its outage (one line when it goes, one when it is back), not a stack per request.
    // A refused enqueue was counted where it was refused (Producers' onUnavailable).
    const counted = err instanceof ServiceError || request.server.outages?.absorb(err) === true;
    if (!counted) request.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'answered 503');
  } else if (status >= 500) {
    request.log.error({ err }, 'request failed');
  } else {
    request.log.info({ code: body.code, status }, 'request refused');
  }
  // A retry helps after a moment: the backend is back, or the first request with this key has finished (or its
  // claim, left by a process that died, has expired).
  if (status === 503 || body.code === 'IDEMPOTENCY_IN_PROGRESS') reply.header('retry-after', '1');
  // A 429 a service passes on from a step it drove (the first paid call's) names its wait in details.
  const waitSeconds = body.details?.retryAfterSeconds;
  if (status === 429 && !reply.hasHeader('retry-after') && typeof waitSeconds === 'number')
    reply.header('retry-after', String(waitSeconds));
  return reply.status(status).send(body);
}

/**
 * The raw HTTP answer to a request Node's parser refused before Fastify saw it (see app.ts clientErrorHandler):
 * 414 when the request line alone is too long, 431 when the headers are, 408 on a client timeout, else 400; always
 * the contract's body with a fresh request id, and the connection closed.
 */
export function clientErrorAnswer(
  err: Error & { code?: string; rawPacket?: Buffer },
  requestId: string,
  maxUrlLength: number,
): string {
  let status: number;
  let body: ErrorBody;
  if (err.code === 'HPE_HEADER_OVERFLOW') {
    const packet = err.rawPacket?.toString('latin1') ?? '';
    const lineEnd = packet.indexOf('\r\n');
    const requestLineTooLong = lineEnd === -1 ? packet.length > maxUrlLength : lineEnd > maxUrlLength;
    status = requestLineTooLong ? 414 : 431;
    body = requestLineTooLong
      ? { code: 'URI_TOO_LONG', message: `the URL exceeds ${maxUrlLength} bytes`, requestId }
      : { code: 'HEADERS_TOO_LARGE', message: 'the request headers exceed 16 KiB', requestId };
  } else if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    status = 408;
    body = { code: 'REQUEST_TIMEOUT', message: 'the request was not received in time', requestId };
  } else {
    status = 400;
    body = { code: 'BAD_REQUEST', message: 'the request is not valid HTTP', requestId };
  }
  const json = JSON.stringify(body);
  const reason = {
    400: 'Bad Request',
    408: 'Request Timeout',
    414: 'URI Too Long',
    431: 'Request Header Fields Too Large',
  }[status];
  return `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(json)}\r\nx-request-id: ${requestId}\r\nConnection: close\r\n\r\n${json}`;
}

/** One error handler for the whole app: every error leaves in the contract's body, without internals. */
export default fp(async function errorsPlugin(app: FastifyInstance, opts: { outages?: DependencyOutages }) {
  app.decorate('outages', opts.outages ?? null);
  app.setErrorHandler((err, request, reply) => sendError(request, reply, err));
  app.setNotFoundHandler((request, reply) =>
    reply.status(404).send({
      code: 'NOT_FOUND',
      message: `no route ${request.method} ${request.url.split('?')[0]}`,
      requestId: request.id,
    }),
  );
});
