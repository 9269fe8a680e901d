import { isIP } from 'node:net';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { Type, type Static } from 'typebox';
import { errors } from '../../domain/errors.ts';
import { EVENT_TYPES, type EventType } from '../../domain/events.ts';
import { isAddressAllowed } from '../../domain/webhook-signing.ts';
import type { Runtime } from '../../runtime.ts';
import {
  decodeCursor,
  encodeCursor,
  WebhookDeliveryStore,
  WebhookEndpointStore,
  type DeliveryStatus,
  type PageCursor,
  type WebhookAttemptDoc,
  type WebhookDeliveryDoc,
  type WebhookEndpointDoc,
} from '../../store/webhooks.ts';
import { scheduleDelivery } from '../../webhooks/jobs.ts';
import { tenantOf } from '../plugins/auth.ts';
import { emptyBodyIsObject, errorResponses, Timestamp } from '../schemas/common.ts';

const DEFAULT_GRACE_SECONDS = 86_400;
const MAX_GRACE_SECONDS = 604_800;
/** Replayed deliveries enqueued right away by an enable call; any beyond are picked up by the sweeper. */
const REPLAY_ENQUEUE_LIMIT = 1_000;

const CreateEndpoint = Type.Object(
  {
    url: Type.String({ minLength: 1, maxLength: 2048, description: 'https URL that receives POSTed events' }),
    events: Type.Array(Type.String({ minLength: 1, maxLength: 100 }), {
      minItems: 1,
      maxItems: 50,
      description: `Event types to receive: ${EVENT_TYPES.join(', ')}. Unknown types are refused with 400.`,
    }),
    description: Type.Optional(Type.String({ maxLength: 500 })),
  },
  { additionalProperties: false },
);

const Endpoint = Type.Object({
  id: Type.String({ description: '`whe_…`' }),
  url: Type.String(),
  events: Type.Array(Type.String()),
  description: Type.Union([Type.String(), Type.Null()]),
  status: Type.Union([Type.Literal('active'), Type.Literal('disabled')]),
  disabledReason: Type.Union([Type.String(), Type.Null()], { description: 'Why deliveries stopped (410 from the receiver, or failing for 5 days)' }),
  disabledAt: Type.Union([Timestamp, Type.Null()]),
  previousSecretExpiresAt: Type.Union([Timestamp, Type.Null()], { description: 'Until then, deliveries also carry a signature with the previous secret' }),
  lastSuccessAt: Type.Union([Timestamp, Type.Null()]),
  failingSince: Type.Union([Timestamp, Type.Null()]),
  createdAt: Timestamp,
  updatedAt: Timestamp,
});
const EndpointWithSecret = Type.Intersect([
  Endpoint,
  Type.Object({ secret: Type.String({ description: 'Shown once: `whsec_` + base64 of 32 random bytes (Standard Webhooks)' }) }),
]);
const EnabledEndpoint = Type.Intersect([
  Endpoint,
  Type.Object({ replayed: Type.Integer({ description: 'Failed or abandoned deliveries scheduled again' }) }),
]);

const Rotate = Type.Object(
  {
    gracePeriodSeconds: Type.Optional(
      Type.Integer({ minimum: 0, maximum: MAX_GRACE_SECONDS, description: `How long the previous secret keeps signing deliveries (default ${DEFAULT_GRACE_SECONDS})` }),
    ),
  },
  { additionalProperties: false },
);

const ListQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 50 })),
  cursor: Type.Optional(Type.String({ maxLength: 200, description: '`nextCursor` of the previous page' })),
});
const EndpointList = Type.Object({ items: Type.Array(Endpoint), nextCursor: Type.Union([Type.String(), Type.Null()]) });

const DeliveryStatusSchema = Type.Union(
  [Type.Literal('pending'), Type.Literal('succeeded'), Type.Literal('failed'), Type.Literal('abandoned'), Type.Literal('cancelled')],
  { description: 'pending (an attempt is due or running), succeeded, failed (every attempt failed), abandoned (endpoint disabled; replayed on enable), cancelled (endpoint deleted)' },
);
const DeliveriesQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 50 })),
  cursor: Type.Optional(Type.String({ maxLength: 200 })),
  status: Type.Optional(DeliveryStatusSchema),
});
const Attempt = Type.Object({
  attempt: Type.Integer({ description: '1-based, over the delivery\'s whole life' }),
  startedAt: Timestamp,
  durationMs: Type.Integer(),
  statusCode: Type.Union([Type.Integer(), Type.Null()], { description: 'null when no HTTP answer came (timeout, network error, refused address)' }),
  error: Type.Union([Type.String(), Type.Null()]),
  succeeded: Type.Boolean(),
});
const Delivery = Type.Object({
  id: Type.String({ description: '`whd_…`, one per event and endpoint' }),
  eventId: Type.String(),
  eventType: Type.String(),
  status: DeliveryStatusSchema,
  attemptCount: Type.Integer(),
  nextAttemptAt: Type.Union([Timestamp, Type.Null()]),
  lastError: Type.Union([Type.String(), Type.Null()]),
  attempts: Type.Array(Attempt),
  createdAt: Timestamp,
  updatedAt: Timestamp,
  succeededAt: Type.Union([Timestamp, Type.Null()]),
});
const DeliveryList = Type.Object({ items: Type.Array(Delivery), nextCursor: Type.Union([Type.String(), Type.Null()]) });

const IdParams = Type.Object({ id: Type.String({ maxLength: 100 }) });
const EndpointIdParams = Type.Object({ endpointId: Type.String({ maxLength: 100 }) });

type CreateBody = Static<typeof CreateEndpoint>;

const iso = (d: Date | null) => d?.toISOString() ?? null;

function endpointView(e: WebhookEndpointDoc, now = new Date()): Static<typeof Endpoint> {
  const previous = e.secrets
    .slice(1)
    .map((s) => s.expiresAt)
    .filter((d): d is Date => d !== null && d.getTime() > now.getTime())
    .sort((a, b) => b.getTime() - a.getTime());
  return {
    id: e._id,
    url: e.url,
    events: e.events,
    description: e.description,
    status: e.status === 'disabled' ? 'disabled' : 'active',
    disabledReason: e.disabledReason,
    disabledAt: iso(e.disabledAt),
    previousSecretExpiresAt: iso(previous[0] ?? null),
    lastSuccessAt: iso(e.lastSuccessAt),
    failingSince: iso(e.failingSince),
    createdAt: e.createdAt.toISOString(),
    updatedAt: e.updatedAt.toISOString(),
  };
}

function deliveryView(d: WebhookDeliveryDoc, attempts: WebhookAttemptDoc[]): Static<typeof Delivery> {
  return {
    id: d._id,
    eventId: d.eventId,
    eventType: d.eventType,
    status: d.status,
    attemptCount: attempts.length,
    nextAttemptAt: d.status === 'pending' ? iso(d.nextAttemptAt) : null,
    lastError: d.lastError,
    attempts: attempts.map((a) => ({
      attempt: a.attempt,
      startedAt: a.startedAt.toISOString(),
      durationMs: a.durationMs,
      statusCode: a.statusCode,
      error: a.error,
      succeeded: a.succeeded,
    })),
    createdAt: d.createdAt.toISOString(),
    updatedAt: d.updatedAt.toISOString(),
    succeededAt: iso(d.succeededAt),
  };
}

function fieldError(path: string, message: string, extra: Record<string, unknown> = {}) {
  return errors.validation(message, { errors: [{ path, message }], ...extra });
}

function parseCursor(cursor: string | undefined): PageCursor | null {
  if (cursor === undefined) return null;
  const decoded = decodeCursor(cursor);
  if (!decoded) throw fieldError('querystring.cursor', 'is not a cursor this API returned');
  return decoded;
}

export async function webhookRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { runtime } = opts;
  const { config } = runtime;
  const { webhookEndpoints: endpoints, webhookDeliveries: deliveries } = runtime.stores;
  const access = { access: 'webhooks:write' } as const;
  const tags = ['webhooks'];

  function checkUrl(raw: string): string {
    const url = raw.trim();
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw fieldError('body.url', 'url must be an absolute URL');
    }
    const insecureOk = config.webhooks.allowInsecureUrls;
    if (parsed.protocol !== 'https:' && !(parsed.protocol === 'http:' && insecureOk)) {
      throw fieldError('body.url', insecureOk ? 'url must use http or https' : 'url must use https');
    }
    if (parsed.username || parsed.password) throw fieldError('body.url', 'url must not carry credentials');
    // Names are checked when delivering (their addresses can change); an address literal can be refused now.
    const host = parsed.hostname.replace(/^\[|\]$/g, '');
    if (isIP(host)) {
      const verdict = isAddressAllowed(host, config.webhooks.allowPrivateAddresses);
      if (!verdict.allowed) throw fieldError('body.url', `url points at a ${verdict.class} address, which deliveries may not reach`);
    }
    return url;
  }

  function checkEvents(events: string[]): EventType[] {
    const known = new Set<string>(EVENT_TYPES);
    const unknown = [...new Set(events.filter((e) => !known.has(e)))];
    if (unknown.length > 0) {
      throw errors.validation(`unknown event types: ${unknown.join(', ')}`, {
        errors: events.flatMap((e, i) => (known.has(e) ? [] : [{ path: `body.events.${i}`, message: `unknown event type "${e}"` }])),
        unknownEventTypes: unknown,
        allowedEventTypes: [...EVENT_TYPES],
      });
    }
    return [...new Set(events)] as EventType[];
  }

  const create = async (request: FastifyRequest<{ Body: CreateBody }>) => {
    const tenantId = tenantOf(request);
    const url = checkUrl(request.body.url);
    const events = checkEvents(request.body.events);
    const { endpoint, secret } = await endpoints.create(tenantId, { url, events, description: request.body.description ?? null });
    request.log.info({ endpointId: endpoint._id, events }, 'webhook endpoint created');
    return { ...endpointView(endpoint), secret };
  };

  const list = async (request: FastifyRequest<{ Querystring: Static<typeof ListQuery> }>) => {
    const limit = request.query.limit ?? 50;
    const items = await endpoints.list(tenantOf(request), limit, parseCursor(request.query.cursor));
    const last = items.length === limit ? items[items.length - 1] : undefined;
    return { items: items.map((e) => endpointView(e)), nextCursor: last ? encodeCursor({ createdAt: last.createdAt, id: last._id }) : null };
  };

  const rotate = async (request: FastifyRequest, id: string, body: Static<typeof Rotate> | undefined) => {
    const grace = body?.gracePeriodSeconds ?? DEFAULT_GRACE_SECONDS;
    const rotated = await endpoints.rotate(tenantOf(request), id, grace);
    if (!rotated) throw errors.notFound('webhook endpoint');
    request.log.info({ endpointId: id, gracePeriodSeconds: grace }, 'webhook secret rotated');
    return { ...endpointView(rotated.endpoint), secret: rotated.secret };
  };

  const createSchema = {
    tags,
    body: CreateEndpoint,
    response: { 201: EndpointWithSecret, ...errorResponses(400, 401, 403) },
  };
  const listSchema = { tags, querystring: ListQuery, response: { 200: EndpointList, ...errorResponses(400, 401, 403) } };
  const rotateResponse = { 200: EndpointWithSecret, ...errorResponses(400, 401, 403, 404) };
  // The rotate body is optional: a POST without one is validated as {} (all defaults).
  // ---- /v1/webhooks

  app.post<{ Body: CreateBody }>('/v1/webhooks', {
    config: access,
    schema: { ...createSchema, summary: 'Register a webhook endpoint (its signing secret is shown once)' },
  }, async (request, reply) => reply.status(201).send(await create(request)));

  app.get<{ Querystring: Static<typeof ListQuery> }>('/v1/webhooks', {
    config: access,
    schema: { ...listSchema, summary: 'List webhook endpoints, newest first (never their secrets)' },
  }, list);

  app.get<{ Params: Static<typeof IdParams> }>('/v1/webhooks/:id', {
    config: access,
    schema: { tags, summary: 'Get a webhook endpoint', params: IdParams, response: { 200: Endpoint, ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const endpoint = await endpoints.get(tenantOf(request), request.params.id);
    if (!endpoint) throw errors.notFound('webhook endpoint');
    return endpointView(endpoint);
  });

  app.delete<{ Params: Static<typeof IdParams> }>('/v1/webhooks/:id', {
    config: access,
    schema: {
      tags,
      summary: 'Delete (revoke) a webhook endpoint; its pending deliveries are cancelled',
      params: IdParams,
      response: { 204: Type.Null({ description: 'Deleted' }), ...errorResponses(401, 403, 404) },
    },
  }, async (request, reply) => {
    const revoked = await endpoints.revoke(tenantOf(request), request.params.id);
    if (!revoked) throw errors.notFound('webhook endpoint');
    const cancelled = await deliveries.cancelPending(revoked.tenantId, revoked._id);
    request.log.info({ endpointId: revoked._id, cancelled }, 'webhook endpoint deleted');
    return reply.status(204).send();
  });

  app.post<{ Params: Static<typeof IdParams>; Body: Static<typeof Rotate> | undefined }>('/v1/webhooks/:id/rotate-secret', {
    config: access,
    schema: {
      tags,
      summary: 'Issue a new signing secret; the previous one keeps signing deliveries for gracePeriodSeconds',
      params: IdParams,
      body: Rotate,
      response: rotateResponse,
    },
    preValidation: emptyBodyIsObject,
  }, async (request) => rotate(request, request.params.id, request.body));

  app.post<{ Params: Static<typeof IdParams> }>('/v1/webhooks/:id/enable', {
    config: access,
    schema: {
      tags,
      summary: 'Re-enable a disabled endpoint and replay its failed and abandoned deliveries (harmless on an active one)',
      params: IdParams,
      response: { 200: EnabledEndpoint, ...errorResponses(401, 403, 404) },
    },
  }, async (request) => {
    const tenantId = tenantOf(request);
    const endpoint = await endpoints.enable(tenantId, request.params.id);
    if (!endpoint) throw errors.notFound('webhook endpoint');
    const replayed = await deliveries.replay(tenantId, endpoint._id);
    // Enqueue what is due now; if Redis refuses, the sweeper finds these deliveries (pending, due, no live job).
    try {
      const due = await deliveries.due(new Date(), REPLAY_ENQUEUE_LIMIT, { tenantId, endpointId: endpoint._id });
      for (const d of due) await scheduleDelivery(runtime.producers, { tenantId, deliveryId: d._id, rev: d.rev }, 0);
    } catch (err) {
      request.log.warn({ endpointId: endpoint._id, err: (err as Error).message }, 'replayed deliveries left to the sweeper');
    }
    request.log.info({ endpointId: endpoint._id, replayed }, 'webhook endpoint enabled');
    return { ...endpointView(endpoint), replayed };
  });

  app.get<{ Params: Static<typeof IdParams>; Querystring: Static<typeof DeliveriesQuery> }>('/v1/webhooks/:id/deliveries', {
    config: access,
    schema: {
      tags,
      summary: 'Deliveries to this endpoint, newest first, each with every attempt (status code, duration, error) and the next one',
      params: IdParams,
      querystring: DeliveriesQuery,
      response: { 200: DeliveryList, ...errorResponses(400, 401, 403, 404) },
    },
  }, async (request) => {
    const tenantId = tenantOf(request);
    const endpoint = await endpoints.get(tenantId, request.params.id);
    if (!endpoint) throw errors.notFound('webhook endpoint');
    const limit = request.query.limit ?? 50;
    const items = await deliveries.listForEndpoint(tenantId, endpoint._id, {
      limit,
      cursor: parseCursor(request.query.cursor),
      status: request.query.status as DeliveryStatus | undefined,
    });
    const last = items.length === limit ? items[items.length - 1] : undefined;
    const attempts = await deliveries.attemptsOf(tenantId, items.map((d) => d._id));
    return { items: items.map((d) => deliveryView(d, attempts.get(d._id) ?? [])), nextCursor: last ? encodeCursor({ createdAt: last.createdAt, id: last._id }) : null };
  });

  // ---- /x402/webhooks/endpoints: the same registry, for x402 integrations

  app.post<{ Body: CreateBody }>('/x402/webhooks/endpoints', {
    config: access,
    schema: { ...createSchema, summary: 'Register a webhook endpoint (same registry as /v1/webhooks)' },
  }, async (request, reply) => reply.status(201).send(await create(request)));

  app.get<{ Querystring: Static<typeof ListQuery> }>('/x402/webhooks/endpoints', {
    config: access,
    schema: { ...listSchema, summary: 'List webhook endpoints (same registry as /v1/webhooks)' },
  }, list);

  app.post<{ Params: Static<typeof EndpointIdParams>; Body: Static<typeof Rotate> | undefined }>('/x402/webhooks/endpoints/:endpointId/rotate-secret', {
    config: access,
    schema: {
      tags,
      summary: 'Issue a new signing secret (same as /v1/webhooks/{id}/rotate-secret)',
      params: EndpointIdParams,
      body: Rotate,
      response: rotateResponse,
    },
    preValidation: emptyBodyIsObject,
  }, async (request) => rotate(request, request.params.endpointId, request.body));
}
