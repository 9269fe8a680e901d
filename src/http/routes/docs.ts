import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { BULL_BOARD_PATH } from '../plugins/bull-board.ts';

export const DOCS_PATH = '/docs';
/** Redoc's standalone bundle, served from node_modules: the page needs no CDN, so it works offline. */
const REDOC_BUNDLE_PATH = `${DOCS_PATH}/redoc.standalone.js`;
const OPENAPI_PATH = '/openapi.json';

const ServiceIndex = Type.Object({
  name: Type.String(),
  links: Type.Object({
    docs: Type.String({ description: 'API reference (HTML)' }),
    openapi: Type.String({ description: 'OpenAPI 3.1 document' }),
    health: Type.String({ description: 'Liveness probe' }),
    console: Type.String({
      description: 'The web console: escalations, runs, gates, wallets, webhooks (sign in with a key)',
    }),
    queues: Type.Optional(Type.String({ description: "Bull Board, the operators' queue console (admin key)" })),
  }),
});

// Absolute paths: /docs has no trailing slash, and relative ones would break under /docs/.
const page = `<!doctype html>
<html lang="en">
  <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>Agent Run Settlement Service: API reference</title>
  </head>
  <body>
    <redoc spec-url="${OPENAPI_PATH}"></redoc>
    <script src="${REDOC_BUNDLE_PATH}"></script>
  </body>
</html>
`;

/** `GET /` points newcomers at the reference, the document, the probe and (when mounted) Bull Board. */
export async function docsRoutes(app: FastifyInstance, opts: { bullBoard: boolean }) {
  const tags = ['docs'];
  // Read once at start-up: a missing bundle fails the start, not the first visit.
  const redocBundle = readFileSync(createRequire(import.meta.url).resolve('redoc/bundles/redoc.standalone.js'));

  app.get(
    '/',
    {
      config: { access: 'public' },
      schema: {
        tags,
        operationId: 'getServiceIndex',
        summary:
          'Where to start: the API reference, this document, the liveness probe, the web console and the queue console',
        response: { 200: ServiceIndex },
      },
    },
    async () => ({
      name: 'Agent Run Settlement Service',
      links: {
        docs: DOCS_PATH,
        openapi: OPENAPI_PATH,
        health: '/healthz',
        console: '/console',
        ...(opts.bullBoard ? { queues: BULL_BOARD_PATH } : {}),
      },
    }),
  );

  app.get(
    DOCS_PATH,
    {
      config: { access: 'public' },
      schema: {
        tags,
        operationId: 'getApiReference',
        summary: 'This API reference, rendered by Redoc from /openapi.json',
        response: { 200: { description: 'HTML page', content: { 'text/html': { schema: Type.String() } } } },
      },
    },
    async (_request, reply) => reply.type('text/html; charset=utf-8').header('cache-control', 'no-cache').send(page),
  );

  // An asset of the page, not an operation: hidden from the document.
  app.get(
    REDOC_BUNDLE_PATH,
    {
      config: { access: 'public' },
      schema: { hide: true },
    },
    async (_request, reply) =>
      reply
        .type('application/javascript; charset=utf-8')
        .header('cache-control', 'public, max-age=3600')
        .send(redocBundle),
  );
}
