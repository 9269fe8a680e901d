import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Type, type Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { readFeed } from '../../services/webhook-feed.ts';
import * as webhooks from '../../services/webhooks.ts';
import { tenantOf } from '../plugins/auth.ts';
import { emptyBodyIsObject, errorResponses } from '../schemas/common.ts';
import {
  CreateEndpoint,
  Delivery,
  DeliveryList,
  DeliveryParams,
  DeliveryListQuery,
  deliveryView,
  EnabledEndpoint,
  Endpoint,
  EndpointList,
  EndpointListQuery,
  EndpointParams,
  endpointView,
  EndpointWithSecret,
  FeedPage,
  feedItemView,
  FeedQuery,
  RecoverBody,
  Recovery,
  RecoveryParams,
  recoveryView,
  RetriedDelivery,
  RotateSecret,
  UpdateEndpoint,
  TestEventSent,
  RunDeliveries,
  RunDeliveriesParams,
} from '../schemas/webhooks.ts';

type Params = { Params: Static<typeof EndpointParams> };
type Create = { Body: Static<typeof CreateEndpoint> };
type List = { Querystring: Static<typeof EndpointListQuery> };
type Rotate = Params & { Body: Static<typeof RotateSecret> | undefined };

export async function webhookRoutes(app: FastifyInstance, { runtime }: { runtime: Runtime }) {
  const config = { access: 'webhooks:write' } as const;
  const readConfig = { access: 'webhooks:read' } as const;
  const tags = ['webhooks'];

  // Shared by /v1/webhooks and /x402/webhooks/endpoints (one registry).
  const create = async (request: FastifyRequest<Create>, reply: FastifyReply) => {
    const { endpoint, secret } = await webhooks.registerEndpoint(runtime, tenantOf(request), request.body);
    request.log.info({ endpointId: endpoint._id, events: endpoint.events }, 'webhook endpoint created');
    return reply.status(201).send({ ...endpointView(endpoint), secret });
  };
  const createSchema = {
    tags,
    body: CreateEndpoint,
    response: { 201: EndpointWithSecret, ...errorResponses(400, 401, 403) },
  };

  const list = async (request: FastifyRequest<List>) => {
    const page = await webhooks.listEndpoints(runtime, tenantOf(request), {
      limit: request.query.limit ?? 50,
      cursor: request.query.cursor,
    });
    return { items: page.items.map((e) => endpointView(e)), nextCursor: page.nextCursor };
  };
  const listSchema = {
    tags,
    querystring: EndpointListQuery,
    response: { 200: EndpointList, ...errorResponses(400, 401, 403) },
  };

  const rotate = async (request: FastifyRequest<Rotate>) => {
    const grace = request.body?.gracePeriodSeconds ?? webhooks.DEFAULT_GRACE_SECONDS;
    const { endpoint, secret } = await webhooks.rotateSecret(
      runtime,
      tenantOf(request),
      request.params.endpointId,
      grace,
    );
    request.log.info({ endpointId: endpoint._id, gracePeriodSeconds: grace }, 'webhook secret rotated');
    return { ...endpointView(endpoint), secret };
  };
  // The rotate body is optional: a POST without one is validated as {} (all defaults).
  const rotateSchema = {
    tags,
    params: EndpointParams,
    body: RotateSecret,
    response: { 200: EndpointWithSecret, ...errorResponses(400, 401, 403, 404) },
  };

  // ---- /v1/webhooks

  app.post<Create>(
    '/v1/webhooks',
    {
      config,
      schema: {
        ...createSchema,
        operationId: 'createWebhookEndpoint',
        summary: 'Register a webhook endpoint (its signing secret is shown once)',
      },
    },
    create,
  );

  app.get<List>(
    '/v1/webhooks',
    {
      config: readConfig,
      schema: {
        ...listSchema,
        operationId: 'listWebhookEndpoints',
        summary: 'List webhook endpoints, newest first (never their secrets)',
      },
    },
    list,
  );

  app.get<Params>(
    '/v1/webhooks/:endpointId',
    {
      config: readConfig,
      schema: {
        tags,
        operationId: 'getWebhookEndpoint',
        summary: 'Get a webhook endpoint',
        params: EndpointParams,
        response: { 200: Endpoint, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => endpointView(await webhooks.getEndpoint(runtime, tenantOf(request), request.params.endpointId)),
  );

  // Svix's endpoint update (PATCH, partial): the contract names none, so its shape is followed.
  app.patch<Params & { Body: Static<typeof UpdateEndpoint> }>(
    '/v1/webhooks/:endpointId',
    {
      config,
      schema: {
        tags,
        operationId: 'updateWebhookEndpoint',
        summary:
          "Change an endpoint's URL, events, description or test-traffic setting; it keeps its id, secret, status and delivery history (a URL is checked as on registration)",
        params: EndpointParams,
        body: UpdateEndpoint,
        response: { 200: Endpoint, ...errorResponses(400, 401, 403, 404, { 422: ['VALIDATION_FAILED'] }) },
      },
    },
    async (request) => {
      const endpoint = await webhooks.updateEndpoint(
        runtime,
        tenantOf(request),
        request.params.endpointId,
        request.body,
      );
      request.log.info(
        { endpointId: endpoint._id, changed: Object.keys(request.body), events: endpoint.events },
        'webhook endpoint updated',
      );
      return endpointView(endpoint);
    },
  );

  app.delete<Params>(
    '/v1/webhooks/:endpointId',
    {
      config,
      schema: {
        tags,
        operationId: 'deleteWebhookEndpoint',
        summary: 'Delete (revoke) a webhook endpoint; its pending deliveries are cancelled',
        params: EndpointParams,
        response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(401, 403, 404) },
      },
    },
    async (request, reply) => {
      await webhooks.deleteEndpoint(runtime, tenantOf(request), request.params.endpointId);
      request.log.info({ endpointId: request.params.endpointId }, 'webhook endpoint deleted');
      return reply.status(204).send();
    },
  );

  app.post<Rotate>(
    '/v1/webhooks/:endpointId/rotate-secret',
    {
      config,
      schema: {
        ...rotateSchema,
        operationId: 'rotateWebhookEndpointSecret',
        summary: 'Issue a new signing secret; the previous one keeps signing deliveries for gracePeriodSeconds',
      },
      preValidation: emptyBodyIsObject,
    },
    rotate,
  );

  app.post<Params>(
    '/v1/webhooks/:endpointId/enable',
    {
      config,
      schema: {
        tags,
        operationId: 'enableWebhookEndpoint',
        summary:
          'Re-enable a disabled endpoint and replay its failed and abandoned deliveries (harmless on an active one)',
        params: EndpointParams,
        response: { 200: EnabledEndpoint, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) => {
      const { endpoint, replayed } = await webhooks.enableEndpoint(
        runtime,
        tenantOf(request),
        request.params.endpointId,
      );
      request.log.info({ endpointId: endpoint._id, replayed }, 'webhook endpoint enabled');
      return { ...endpointView(endpoint), replayed };
    },
  );

  app.get<{ Params: Static<typeof RunDeliveriesParams> }>(
    '/v1/runs/:runId/deliveries',
    {
      config: readConfig,
      schema: {
        tags,
        operationId: 'listRunDeliveries',
        summary:
          "Deliveries of the run's webhook events (finalized, settled, disputed, holdback released…) to every endpoint of the tenant, oldest first, each with its attempts",
        params: RunDeliveriesParams,
        response: { 200: RunDeliveries, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => ({
      items: (await webhooks.deliveriesOfRun(runtime, tenantOf(request), request.params.runId)).map(deliveryView),
    }),
  );

  app.get<Params & { Querystring: Static<typeof DeliveryListQuery> }>(
    '/v1/webhooks/:endpointId/deliveries',
    {
      config: readConfig,
      schema: {
        tags,
        operationId: 'listWebhookDeliveries',
        summary:
          'Deliveries to this endpoint, newest first, each with every attempt (status code, duration, error) and the next one (paged like every list; filters by status and creation time)',
        params: EndpointParams,
        querystring: DeliveryListQuery,
        response: { 200: DeliveryList, ...errorResponses(400, 401, 403, 404, { 422: ['VALIDATION_FAILED'] }) },
      },
    },
    async (request) => {
      const page = await webhooks.listDeliveries(runtime, tenantOf(request), request.params.endpointId, request.query);
      return { items: page.items.map(deliveryView), nextCursor: page.nextCursor };
    },
  );

  app.get<Params & { Querystring: Static<typeof FeedQuery> }>(
    '/v1/webhooks/:endpointId/events',
    {
      config: readConfig,
      schema: {
        tags,
        operationId: 'readWebhookEventFeed',
        summary:
          'Pull feed for receivers that cannot host webhooks: the events this endpoint subscribes to, oldest first after a cursor, each with the exact body and signed headers of a delivery',
        params: EndpointParams,
        querystring: FeedQuery,
        response: { 200: FeedPage, ...errorResponses(400, 401, 403, 404, { 422: ['VALIDATION_FAILED'] }) },
      },
    },
    async (request) => {
      const page = await readFeed(runtime, tenantOf(request), request.params.endpointId, request.query);
      return { items: page.items.map(feedItemView), nextCursor: page.nextCursor, hasMore: page.hasMore };
    },
  );

  // ---- Replay: a test event, one delivery again, every failed one since a time (a job with readable progress)

  app.post<Params>(
    '/v1/webhooks/:endpointId/test',
    {
      config,
      schema: {
        tags,
        operationId: 'sendWebhookTestEvent',
        summary:
          'Send a webhook.test event to this endpoint alone (signed and retried like any delivery; refused for a disabled endpoint or a refused address)',
        params: EndpointParams,
        response: {
          202: TestEventSent,
          ...errorResponses(401, 403, 404, {
            409: ['WEBHOOK_ENDPOINT_DISABLED'],
            422: ['WEBHOOK_DESTINATION_REFUSED'],
          }),
        },
      },
    },
    async (request, reply) => {
      const { event, delivery } = await webhooks.sendTestEvent(runtime, tenantOf(request), request.params.endpointId);
      return reply.status(202).send({
        eventId: event._id,
        deliveryId: delivery._id,
        eventType: 'webhook.test' as const,
        status: delivery.status,
      });
    },
  );

  app.post<{ Params: Static<typeof DeliveryParams> }>(
    '/v1/webhooks/:endpointId/deliveries/:deliveryId/resend',
    {
      config,
      schema: {
        tags,
        operationId: 'resendWebhookDelivery',
        summary:
          'Retry now: one delivery, pending or finished, gets an attempt now (same event id and body) and its retry schedule starts again from it; asking again while that attempt is due or running changes nothing (refused for a disabled endpoint or a refused address)',
        params: DeliveryParams,
        response: {
          202: RetriedDelivery,
          ...errorResponses(401, 403, 404, {
            409: ['WEBHOOK_ENDPOINT_DISABLED', 'WEBHOOK_ENDPOINT_PULL'],
            422: ['WEBHOOK_DESTINATION_REFUSED'],
          }),
        },
      },
    },
    async (request, reply) => {
      const { delivery, retried } = await webhooks.resendDelivery(
        runtime,
        tenantOf(request),
        request.params.endpointId,
        request.params.deliveryId,
      );
      const attempts = await runtime.stores.webhookDeliveries.attemptsOf(delivery);
      request.log.info({ endpointId: delivery.endpointId, deliveryId: delivery._id, retried }, 'webhook retry now');
      return reply.status(202).send({ ...deliveryView({ delivery, attempts }), retried });
    },
  );

  app.post<Params & { Body: Static<typeof RecoverBody> }>(
    '/v1/webhooks/:endpointId/recoveries',
    {
      config,
      schema: {
        tags,
        operationId: 'recoverWebhookDeliveries',
        summary:
          'Send every failed or abandoned delivery of this endpoint since a time again (and with includePending, every pending one now), as a background job; read its progress at the recovery',
        params: EndpointParams,
        body: RecoverBody,
        response: {
          202: Recovery,
          ...errorResponses(400, 401, 403, 404, {
            409: ['WEBHOOK_ENDPOINT_DISABLED', 'WEBHOOK_ENDPOINT_PULL'],
            422: ['VALIDATION_FAILED', 'WEBHOOK_DESTINATION_REFUSED'],
          }),
        },
      },
    },
    async (request, reply) => {
      const tenantId = tenantOf(request);
      const recovery = await webhooks.recoverFailed(runtime, tenantId, request.params.endpointId, {
        since: new Date(request.body.since),
        includePending: request.body.includePending,
      });
      return reply
        .status(202)
        .header('location', `/v1/webhooks/${recovery.endpointId}/recoveries/${recovery._id}`)
        .send(recoveryView(await webhooks.getRecovery(runtime, tenantId, recovery.endpointId, recovery._id)));
    },
  );

  app.get<{ Params: Static<typeof RecoveryParams> }>(
    '/v1/webhooks/:endpointId/recoveries/:recoveryId',
    {
      config: readConfig,
      schema: {
        tags,
        operationId: 'getWebhookRecovery',
        summary: "A recovery's progress: deliveries sent again (queued) and, of those, sent, failed again and pending",
        params: RecoveryParams,
        response: { 200: Recovery, ...errorResponses(401, 403, 404) },
      },
    },
    async (request) =>
      recoveryView(
        await webhooks.getRecovery(runtime, tenantOf(request), request.params.endpointId, request.params.recoveryId),
      ),
  );

  // ---- /x402/webhooks/endpoints: the same registry, for x402 integrations

  app.post<Create>(
    '/x402/webhooks/endpoints',
    {
      config,
      schema: {
        ...createSchema,
        operationId: 'createX402WebhookEndpoint',
        summary: 'Register a webhook endpoint (same registry as /v1/webhooks)',
      },
    },
    create,
  );

  app.get<List>(
    '/x402/webhooks/endpoints',
    {
      config: readConfig,
      schema: {
        ...listSchema,
        operationId: 'listX402WebhookEndpoints',
        summary: 'List webhook endpoints (same registry as /v1/webhooks)',
      },
    },
    list,
  );

  app.post<Rotate>(
    '/x402/webhooks/endpoints/:endpointId/rotate-secret',
    {
      config,
      schema: {
        ...rotateSchema,
        operationId: 'rotateX402WebhookEndpointSecret',
        summary: 'Issue a new signing secret (same as /v1/webhooks/{endpointId}/rotate-secret)',
      },
      preValidation: emptyBodyIsObject,
    },
    rotate,
  );
}
