import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Type, type Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import * as webhooks from '../../services/webhooks.ts';
import { tenantOf } from '../plugins/auth.ts';
import { emptyBodyIsObject, errorResponses } from '../schemas/common.ts';
import {
  CreateEndpoint,
  DeliveryList,
  DeliveryListQuery,
  deliveryView,
  EnabledEndpoint,
  Endpoint,
  EndpointList,
  EndpointListQuery,
  EndpointParams,
  endpointView,
  EndpointWithSecret,
  RotateSecret,
} from '../schemas/webhooks.ts';

type Params = { Params: Static<typeof EndpointParams> };
type Create = { Body: Static<typeof CreateEndpoint> };
type List = { Querystring: Static<typeof EndpointListQuery> };
type Rotate = Params & { Body: Static<typeof RotateSecret> | undefined };

export async function webhookRoutes(app: FastifyInstance, { runtime }: { runtime: Runtime }) {
  const config = { access: 'webhooks:write' } as const;
  const tags = ['webhooks'];

  // Shared by /v1/webhooks and /x402/webhooks/endpoints (one registry).
  const create = async (request: FastifyRequest<Create>, reply: FastifyReply) => {
    const { endpoint, secret } = await webhooks.registerEndpoint(runtime, tenantOf(request), request.body);
    request.log.info({ endpointId: endpoint._id, events: endpoint.events }, 'webhook endpoint created');
    return reply.status(201).send({ ...endpointView(endpoint), secret });
  };
  const createSchema = { tags, body: CreateEndpoint, response: { 201: EndpointWithSecret, ...errorResponses(400, 401, 403) } };

  const list = async (request: FastifyRequest<List>) => {
    const page = await webhooks.listEndpoints(runtime, tenantOf(request), { limit: request.query.limit ?? 50, cursor: request.query.cursor });
    return { items: page.items.map((e) => endpointView(e)), nextCursor: page.nextCursor };
  };
  const listSchema = { tags, querystring: EndpointListQuery, response: { 200: EndpointList, ...errorResponses(400, 401, 403) } };

  const rotate = async (request: FastifyRequest<Rotate>) => {
    const grace = request.body?.gracePeriodSeconds ?? webhooks.DEFAULT_GRACE_SECONDS;
    const { endpoint, secret } = await webhooks.rotateSecret(runtime, tenantOf(request), request.params.endpointId, grace);
    request.log.info({ endpointId: endpoint._id, gracePeriodSeconds: grace }, 'webhook secret rotated');
    return { ...endpointView(endpoint), secret };
  };
  // The rotate body is optional: a POST without one is validated as {} (all defaults).
  const rotateSchema = { tags, params: EndpointParams, body: RotateSecret, response: { 200: EndpointWithSecret, ...errorResponses(400, 401, 403, 404) } };

  // ---- /v1/webhooks

  app.post<Create>('/v1/webhooks', {
    config,
    schema: { ...createSchema, operationId: 'createWebhookEndpoint', summary: 'Register a webhook endpoint (its signing secret is shown once)' },
  }, create);

  app.get<List>('/v1/webhooks', {
    config,
    schema: { ...listSchema, operationId: 'listWebhookEndpoints', summary: 'List webhook endpoints, newest first (never their secrets)' },
  }, list);

  app.get<Params>('/v1/webhooks/:endpointId', {
    config,
    schema: { tags, operationId: 'getWebhookEndpoint', summary: 'Get a webhook endpoint', params: EndpointParams, response: { 200: Endpoint, ...errorResponses(401, 403, 404) } },
  }, async (request) => endpointView(await webhooks.getEndpoint(runtime, tenantOf(request), request.params.endpointId)));

  app.delete<Params>('/v1/webhooks/:endpointId', {
    config,
    schema: {
      tags,
      operationId: 'deleteWebhookEndpoint',
      summary: 'Delete (revoke) a webhook endpoint; its pending deliveries are cancelled',
      params: EndpointParams,
      response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(401, 403, 404) },
    },
  }, async (request, reply) => {
    await webhooks.deleteEndpoint(runtime, tenantOf(request), request.params.endpointId);
    request.log.info({ endpointId: request.params.endpointId }, 'webhook endpoint deleted');
    return reply.status(204).send();
  });

  app.post<Rotate>('/v1/webhooks/:endpointId/rotate-secret', {
    config,
    schema: { ...rotateSchema, operationId: 'rotateWebhookEndpointSecret', summary: 'Issue a new signing secret; the previous one keeps signing deliveries for gracePeriodSeconds' },
    preValidation: emptyBodyIsObject,
  }, rotate);

  app.post<Params>('/v1/webhooks/:endpointId/enable', {
    config,
    schema: {
      tags,
      operationId: 'enableWebhookEndpoint',
      summary: 'Re-enable a disabled endpoint and replay its failed and abandoned deliveries (harmless on an active one)',
      params: EndpointParams,
      response: { 200: EnabledEndpoint, ...errorResponses(401, 403, 404) },
    },
  }, async (request) => {
    const { endpoint, replayed } = await webhooks.enableEndpoint(runtime, tenantOf(request), request.params.endpointId);
    request.log.info({ endpointId: endpoint._id, replayed }, 'webhook endpoint enabled');
    return { ...endpointView(endpoint), replayed };
  });

  app.get<Params & { Querystring: Static<typeof DeliveryListQuery> }>('/v1/webhooks/:endpointId/deliveries', {
    config,
    schema: {
      tags,
      operationId: 'listWebhookDeliveries',
      summary: 'Deliveries to this endpoint, newest first, each with every attempt (status code, duration, error) and the next one',
      params: EndpointParams,
      querystring: DeliveryListQuery,
      response: { 200: DeliveryList, ...errorResponses(400, 401, 403, 404) },
    },
  }, async (request) => {
    const { limit = 50, cursor, status } = request.query;
    const page = await webhooks.listDeliveries(runtime, tenantOf(request), request.params.endpointId, { limit, cursor, status });
    return { items: page.items.map(deliveryView), nextCursor: page.nextCursor };
  });

  // ---- /x402/webhooks/endpoints: the same registry, for x402 integrations

  app.post<Create>('/x402/webhooks/endpoints', {
    config,
    schema: { ...createSchema, operationId: 'createX402WebhookEndpoint', summary: 'Register a webhook endpoint (same registry as /v1/webhooks)' },
  }, create);

  app.get<List>('/x402/webhooks/endpoints', {
    config,
    schema: { ...listSchema, operationId: 'listX402WebhookEndpoints', summary: 'List webhook endpoints (same registry as /v1/webhooks)' },
  }, list);

  app.post<Rotate>('/x402/webhooks/endpoints/:endpointId/rotate-secret', {
    config,
    schema: { ...rotateSchema, operationId: 'rotateX402WebhookEndpointSecret', summary: 'Issue a new signing secret (same as /v1/webhooks/{endpointId}/rotate-secret)' },
    preValidation: emptyBodyIsObject,
  }, rotate);
}
