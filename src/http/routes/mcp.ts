import type { FastifyInstance, FastifyRequest } from 'fastify';
import { errors, type ServiceError } from '../../domain/errors.ts';
import type { FetchLike } from '../../mcp/api-client.ts';
import type { Runtime } from '../../runtime.ts';
import { presentedCredential } from '../plugins/auth.ts';
import { errorResponses } from '../schemas/common.ts';
import { McpRequestBody, McpResponseBody } from '../schemas/mcp.ts';

export const MCP_PATH = '/mcp';

/**
 * How /mcp's tools reach the API: `app.inject`, in this process. The call goes through every hook of the HTTP route
 * (authentication with the caller's key, its scope, the tenant check, rate limit, idempotency, validation), needs
 * no route to PUBLIC_BASE_URL from inside the deployment, and adds no socket or TLS hop. The base URL's path prefix
 * (a service mounted under /settlement) is dropped: in process, routes start at `/`.
 */
function inProcessFetch(app: FastifyInstance, baseUrl: string, requestId: string): FetchLike {
  const prefix = new URL(baseUrl).pathname.replace(/\/$/, '');
  return async (url, init) => {
    const path = prefix && url.pathname.startsWith(`${prefix}/`) ? url.pathname.slice(prefix.length) : url.pathname;
    const res = await app.inject({
      method: init.method as 'GET' | 'POST',
      url: `${path}${url.search}`,
      headers: { ...(init.headers as Record<string, string>), 'x-request-id': requestId },
      ...(typeof init.body === 'string' ? { payload: init.body } : {}),
    });
    const headers = new Headers();
    const contentType = res.headers['content-type'];
    if (typeof contentType === 'string') headers.set('content-type', contentType);
    return new Response(res.statusCode === 204 || res.statusCode === 304 ? null : res.body, {
      status: res.statusCode,
      headers,
    });
  };
}

/**
 * The Fastify request as the web Request the MCP transport reads (the body is handed over already parsed). The
 * answer is always JSON, so the transport's demand that clients also accept an event stream is met for them.
 */
function webRequest(request: FastifyRequest, baseUrl: string): Request {
  const headers = new Headers();
  for (const [name, value] of Object.entries(request.headers)) {
    if (typeof value === 'string') headers.set(name, value);
    else if (Array.isArray(value)) for (const v of value) headers.append(name, v);
  }
  headers.set('accept', 'application/json, text/event-stream');
  return new Request(new URL(request.url, baseUrl), { method: request.method, headers });
}

/** The transport's own refusal (a message that is no JSON-RPC it takes, an unknown protocol version), as a contract error. */
async function transportRefusal(answer: Response): Promise<ServiceError> {
  let reason = `the MCP transport answered HTTP ${answer.status}`;
  try {
    const body = (await answer.json()) as { error?: { message?: unknown } };
    if (typeof body.error?.message === 'string') reason = body.error.message;
  } catch {
    // no JSON-RPC error body: keep the status as the reason
  }
  return errors.unprocessable('the request is not an MCP message this endpoint takes', {
    errors: [{ path: 'body', message: reason }],
  });
}

export async function mcpRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  // The MCP SDK with its schemas is loaded on the first /mcp request, not by every API process at start.
  let mcpHttp: Promise<typeof import('../../mcp/http.ts')> | null = null;

  app.post(
    MCP_PATH,
    {
      // Any live tenant key: each tool then needs the scope of the route it calls, checked there. Host and Origin are
      // checked first (plugins/origin.ts), as the MCP transport requires of servers.
      config: { access: 'tenant', nativeIdempotency: true, checkOrigin: true },
      schema: {
        tags: ['mcp'],
        operationId: 'callMcp',
        summary: 'MCP over Streamable HTTP (stateless): the tools of `agent-settlement mcp`, acting with this API key',
        description:
          "Point an MCP client at this URL with `Authorization: Bearer sk_…` (the runtime bootstrap's `mcpHttp`). Send " +
          'JSON-RPC messages; answers are JSON (never an event stream), and a message the MCP transport refuses is 422. Every tool call passes the scope and tenant ' +
          'checks of the route it calls. Agents registered here keep their signing key in the service, sealed. ' +
          "Host must be PUBLIC_BASE_URL's host or a loopback name, and Origin (when sent) PUBLIC_BASE_URL's origin, a " +
          'loopback origin or one of MCP_ALLOWED_ORIGINS; anything else is 403 before the key is looked at (DNS rebinding).',
        body: McpRequestBody,
        response: {
          200: McpResponseBody,
          202: { description: 'Notifications or responses only: accepted, no body', type: 'null' },
          ...errorResponses(401, 403, 422),
        },
      },
    },
    async (request, reply) => {
      const principal = request.principal;
      const apiKey = presentedCredential(request);
      if (principal?.kind !== 'key' || !apiKey) throw errors.unauthenticated();
      mcpHttp ??= import('../../mcp/http.ts');
      const { answerMcpRequest } = await mcpHttp;
      const base = runtime.config.publicBaseUrl;
      const answer = await answerMcpRequest(
        runtime,
        { tenantId: principal.tenantId, apiKey },
        webRequest(request, base),
        request.body,
        inProcessFetch(app, base, request.id),
      );
      if (answer.status >= 400) throw await transportRefusal(answer);
      reply.code(answer.status as 200);
      const contentType = answer.headers.get('content-type');
      if (contentType) reply.type(contentType);
      const body = await answer.text();
      return reply.send(body === '' ? undefined : body);
    },
  );
}
