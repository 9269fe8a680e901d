import swagger from '@fastify/swagger';
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { BULL_BOARD_PATH } from './bull-board.ts';

/** OpenAPI 3.1 generated from the route schemas; `npm run openapi` writes it to openapi/openapi.json. */
export default fp(async function swaggerPlugin(app: FastifyInstance) {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Agent Run Settlement Service',
        version: '1.0.0',
        description:
          'Registers agents, takes agent-signed hash-chained run events, finalizes runs into content-addressed ' +
          'artifacts anyone can verify offline, and settles escrowed money. Errors: {code, message, details?, requestId}.',
      },
      // Fixed, so the document does not depend on who generates it: '/' is wherever the document was fetched from.
      servers: [
        { url: '/', description: 'This service: the origin this document was fetched from' },
        { url: 'http://127.0.0.1:3000', description: 'Local development (`npm start`, default PORT)' },
      ],
      tags: [
        { name: 'agents', description: 'Agent identities and their Ed25519 signing keys' },
        { name: 'runs', description: 'Runs: agent-signed, hash-chained events, finalized into an artifact' },
        {
          name: 'verification',
          description: 'Artifacts, their verification (public by id) and the service signing keys',
        },
        { name: 'settlement', description: "Settling a run from escrow, disputes and the operator's rulings" },
        { name: 'wallets', description: 'Balances, their history, and funding by the operator' },
        { name: 'webhooks', description: 'Webhook endpoints, their signing secrets and deliveries' },
        {
          name: 'x402',
          description:
            'Payment gates for x402 paid calls: quotes, authorizations, verification, wallet policies, escalations',
        },
        { name: 'x402 facilitator', description: 'The x402 v2 facilitator API, for stock x402 clients' },
        {
          name: 'x402 sessions',
          description:
            'Payment sessions: a budget reserved once, one request per paid call, settled and refunded at close',
        },
        {
          name: 'lists',
          description:
            'Runs, agents, settlements, disputes, gates, escalations and sessions of the tenant, newest first, paged with an opaque cursor',
        },
        {
          name: 'onboarding',
          description: "A tenant's first steps: runtime bootstrap, MCP smoke test, first paid call, conformance matrix",
        },
        { name: 'identity', description: 'Who the calling API key is' },
        {
          name: 'mcp',
          description:
            'The MCP server of this service (Streamable HTTP): the same tools as `agent-settlement mcp`, with the API key as bearer',
        },
        {
          name: 'ops',
          description: 'Operator routes under the admin key: tenants, API keys, ledger audit, buyer sessions',
        },
        { name: 'health', description: 'Liveness, readiness and Prometheus metrics' },
        { name: 'docs', description: 'The service index and this API reference' },
      ],
      components: {
        securitySchemes: {
          bearer: {
            type: 'http',
            scheme: 'bearer',
            description: 'Tenant API key `sk_<keyId>.<secret>`, or the admin key on /ops',
          },
          adminBasic: {
            type: 'http',
            scheme: 'basic',
            description: 'Admin key as the Basic password (Bull Board in a browser)',
          },
          apiKeyHeader: {
            type: 'apiKey',
            in: 'header',
            name: 'x-api-key',
            description: 'Onboarding routes: the admin key, or a tenant key with scope `onboarding`',
          },
          buyerSession: {
            type: 'apiKey',
            in: 'cookie',
            name: 'ml_buyer_session',
            description: 'Onboarding routes: the buyer session cookie from POST /ops/tenants/{tenantId}/buyer-sessions',
          },
        },
      },
    },
    hideUntagged: false,
    // @fastify/swagger marks every request body required; a body whose fields are all optional may be left out
    // (the route reads no body as `{}`), and the document says so.
    transformObject: (document) => {
      if (!('openapiObject' in document)) return document.swaggerObject;
      const { openapiObject } = document;
      for (const operations of Object.values(openapiObject.paths ?? {})) {
        for (const operation of Object.values(
          operations as Record<
            string,
            {
              requestBody?: {
                required?: boolean;
                content?: Record<string, { schema?: { type?: unknown; required?: string[]; minProperties?: number } }>;
              };
            }
          >,
        )) {
          const body = operation?.requestBody;
          const schema = body?.content?.['application/json']?.schema;
          // A body that must name at least one field (a partial update) is required all the same.
          if (body && schema?.type === 'object' && !schema.required?.length && (schema.minProperties ?? 0) === 0)
            body.required = false;
        }
      }
      return openapiObject;
    },
    // Shared schemas appear under their $id (ErrorBody), not def-N.
    refResolver: {
      buildLocalReference: (json, _baseUri, _fragment, i) => (typeof json.$id === 'string' ? json.$id : `def-${i}`),
    },
    // Each route's access rule shows up in its operation, so readers see the needed scope.
    transform: ({ schema, url, route }) => {
      const access = route.config?.access;
      const transformed = { ...(schema ?? {}) } as Record<string, unknown>;
      if (url.startsWith(BULL_BOARD_PATH)) transformed.hide = true;
      // Public routes say so (`security: []`), so linters and clients do not take a missing rule for an oversight.
      if (access === 'public') transformed.security = [];
      if (access && access !== 'public') {
        transformed.security =
          access === 'admin' || access === 'admin-key'
            ? [{ bearer: [] }, { adminBasic: [] }]
            : access === 'onboarding'
              ? [{ apiKeyHeader: [] }, { buyerSession: [] }]
              : [{ bearer: [] }];
        transformed['x-required-scope'] = access === 'admin' ? 'ops' : access === 'admin-key' ? 'admin' : access;
        const deprecated = route.config?.deprecatedAccess;
        if (deprecated)
          transformed['x-deprecated-scope'] = {
            scope: deprecated.scope,
            since: deprecated.since,
            until: deprecated.until,
          };
      }
      return { schema: transformed, url };
    },
  });
});
