import { Type, type Static } from 'typebox';
import { EVENT_TYPES } from '../../domain/events.ts';
import {
  DEFAULT_GRACE_SECONDS,
  MAX_GRACE_SECONDS,
  type DeliveryWithAttempts,
  type RecoveryProgress,
} from '../../services/webhooks.ts';
import type { WebhookEndpoint } from '../../store/webhook-endpoints.ts';
import { DEFAULT_LIMIT, MAX_LIMIT } from '../../services/lists.ts';
import type { FeedItem as FeedEntry } from '../../services/webhook-feed.ts';
import { Cursor, Timestamp } from './common.ts';

// Request and response shapes of the webhook routes (/v1/webhooks and /x402/webhooks/endpoints), and the views
// that turn stored records into them.

export const CreateEndpoint = Type.Object(
  {
    url: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 2048,
        description: 'https URL that receives POSTed events; required unless `delivery` is `pull`, and absent then',
      }),
    ),
    delivery: Type.Optional(
      Type.Union([Type.Literal('push'), Type.Literal('pull')], {
        default: 'push',
        description:
          '`push` (default): events are POSTed to `url`. `pull`: for a receiver that cannot host webhooks; nothing is sent, and the same signed events are read from `GET /v1/webhooks/{endpointId}/events`.',
      }),
    ),
    events: Type.Array(Type.String({ minLength: 1, maxLength: 100 }), {
      minItems: 1,
      maxItems: 50,
      description: `Event types to receive: ${EVENT_TYPES.join(', ')}. Unknown types are refused with 400.`,
    }),
    description: Type.Optional(Type.String({ maxLength: 500 })),
    includeTestEvents: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'Also deliver test traffic: events marked `"test": true` in their envelope (the onboarding first paid call and conformance matrix). Off by default, so an endpoint only ever sees real money movements.',
      }),
    ),
  },
  {
    additionalProperties: false,
    examples: [
      {
        url: 'https://hooks.acme.example/agent-settlement',
        events: ['run.finalized', 'settlement.completed'],
        description: 'Billing service',
        includeTestEvents: false,
      },
    ],
  },
);

export const UpdateEndpoint = Type.Object(
  {
    url: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 2048,
        description:
          "new https URL, checked like a new endpoint's; attempts from now on go there (one already in flight finishes against the old URL and is listed with it)",
      }),
    ),
    events: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: 100 }), {
        minItems: 1,
        maxItems: 50,
        description: 'the whole new list of event types; later events follow it, deliveries already made stay',
      }),
    ),
    description: Type.Optional(
      Type.Union([Type.String({ maxLength: 500 }), Type.Null()], { description: 'null clears it' }),
    ),
    includeTestEvents: Type.Optional(Type.Boolean()),
  },
  {
    additionalProperties: false,
    minProperties: 1,
    examples: [{ url: 'https://hooks.acme.example/agent-settlement/v2', events: ['run.finalized'] }],
  },
);

export const Endpoint = Type.Object({
  id: Type.String({ description: '`whe_…`' }),
  url: Type.Union([Type.String(), Type.Null()], { description: 'Where events are POSTed; null for a pull endpoint' }),
  delivery: Type.Union([Type.Literal('push'), Type.Literal('pull')]),
  events: Type.Array(Type.String()),
  description: Type.Union([Type.String(), Type.Null()]),
  includeTestEvents: Type.Boolean({
    description: 'Whether test traffic (events marked `"test": true`) is delivered here',
  }),
  status: Type.Union([Type.Literal('active'), Type.Literal('disabled')]),
  disabledReason: Type.Union([Type.String(), Type.Null()], {
    description: 'Why deliveries stopped (410 from the receiver, or failing for 5 days)',
  }),
  disabledAt: Type.Union([Timestamp, Type.Null()]),
  previousSecretExpiresAt: Type.Union([Timestamp, Type.Null()], {
    description: 'Until then, deliveries also carry a signature with the previous secret',
  }),
  lastSuccessAt: Type.Union([Timestamp, Type.Null()]),
  failingSince: Type.Union([Timestamp, Type.Null()]),
  createdAt: Timestamp,
  updatedAt: Timestamp,
});
export const EndpointWithSecret = Type.Intersect([
  Endpoint,
  Type.Object({
    secret: Type.String({ description: 'Shown once: `whsec_` + base64 of 32 random bytes (Standard Webhooks)' }),
  }),
]);
export const EnabledEndpoint = Type.Intersect([
  Endpoint,
  Type.Object({ replayed: Type.Integer({ description: 'Failed or abandoned deliveries scheduled again' }) }),
]);

export const RotateSecret = Type.Object(
  {
    gracePeriodSeconds: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_GRACE_SECONDS,
        description: `How long the previous secret keeps signing deliveries (default ${DEFAULT_GRACE_SECONDS})`,
      }),
    ),
  },
  { additionalProperties: false, examples: [{ gracePeriodSeconds: 3600 }] },
);

export const EndpointListQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 50 })),
  cursor: Type.Optional(Cursor(200)),
});
export const EndpointList = Type.Object({
  items: Type.Array(Endpoint),
  nextCursor: Type.Union([Type.String(), Type.Null()]),
});

const DeliveryStatus = Type.Union(
  [
    Type.Literal('pending'),
    Type.Literal('succeeded'),
    Type.Literal('failed'),
    Type.Literal('abandoned'),
    Type.Literal('cancelled'),
    Type.Literal('stored'),
  ],
  {
    description:
      "pending (an attempt is due or running), succeeded, failed (every attempt failed), abandoned (endpoint disabled; replayed on enable), cancelled (endpoint deleted), stored (a pull endpoint's: never sent, read from its feed)",
  },
);
export const DeliveryListQuery = Type.Object({
  status: Type.Optional(DeliveryStatus),
  createdAfter: Type.Optional(
    Type.String({ format: 'date-time', description: 'only deliveries created after this time (exclusive)' }),
  ),
  createdBefore: Type.Optional(
    Type.String({
      format: 'date-time',
      description: 'only deliveries created before this time (exclusive); must be later than createdAfter',
    }),
  ),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIMIT, default: DEFAULT_LIMIT })),
  cursor: Type.Optional(
    Cursor(400, '`nextCursor` of the previous page (a filtered page may hold fewer than `limit` items)'),
  ),
});
const Attempt = Type.Object({
  attempt: Type.Integer({ description: "1-based, over the delivery's whole life" }),
  startedAt: Timestamp,
  durationMs: Type.Integer(),
  statusCode: Type.Union([Type.Integer(), Type.Null()], {
    description: 'null when no HTTP answer came (timeout, network error, refused address)',
  }),
  error: Type.Union([Type.String(), Type.Null()]),
  succeeded: Type.Boolean(),
  url: Type.Union([Type.String(), Type.Null()], {
    description:
      'where this attempt was sent (the endpoint URL at the time); null on attempts recorded before it was kept',
  }),
});
export const Delivery = Type.Object({
  id: Type.String({ description: '`whd_…`, one per event and endpoint' }),
  endpointId: Type.String({ description: 'the endpoint it goes to' }),
  eventId: Type.String(),
  eventType: Type.String(),
  status: DeliveryStatus,
  attemptCount: Type.Integer(),
  nextAttemptAt: Type.Union([Timestamp, Type.Null()]),
  lastError: Type.Union([Type.String(), Type.Null()]),
  attempts: Type.Array(Attempt),
  createdAt: Timestamp,
  updatedAt: Timestamp,
  succeededAt: Type.Union([Timestamp, Type.Null()]),
  retriedAt: Type.Union([Timestamp, Type.Null()], {
    description: 'when an attempt now was last asked for (retry now)',
  }),
});
export const RetriedDelivery = Type.Intersect([
  Delivery,
  Type.Object({
    retried: Type.Boolean({
      description:
        'true: an attempt is now due and the retry schedule starts again from it. false: an attempt was already due now or running, or a retry was asked for in the last few seconds; that one stands and this request changed nothing',
    }),
  }),
]);
export const DeliveryList = Type.Object({
  items: Type.Array(Delivery),
  nextCursor: Type.Union([Type.String(), Type.Null()]),
});
export const RunDeliveries = Type.Object({
  items: Type.Array(Delivery, { description: 'oldest first; every delivery of every event that names the run' }),
});
export const RunDeliveriesParams = Type.Object({ runId: Type.String({ maxLength: 128 }) });

export const FeedQuery = Type.Object({
  after: Type.Optional(
    Cursor(400, '`nextCursor` of the previous read; without it the feed starts at the oldest event still kept'),
  ),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIMIT, default: DEFAULT_LIMIT })),
});
const FeedItem = Type.Object({
  deliveryId: Type.String({ description: 'the delivery of this event to this endpoint (listed with its deliveries)' }),
  eventId: Type.String(),
  eventType: Type.String(),
  body: Type.String({
    description: 'the exact request body a delivery of this event carries: verify the signature over these bytes',
  }),
  headers: Type.Object(
    {
      'webhook-id': Type.String(),
      'webhook-timestamp': Type.String({ description: 'Unix seconds: when this page was read' }),
      'webhook-signature': Type.String({
        description:
          "Standard Webhooks signatures with the endpoint's current secret (and the previous one during a rotation's grace period)",
      }),
      'service-signature': Type.String({ description: "the same signatures under the service's own header name" }),
    },
    { description: 'the headers a delivery of this event carries, signed now' },
  ),
});
export const FeedPage = Type.Object({
  items: Type.Array(FeedItem, { description: 'oldest first' }),
  nextCursor: Type.String({ description: 'pass as `after` to read on; always given' }),
  hasMore: Type.Boolean({ description: 'true: more is ready now; false: poll again later with `nextCursor`' }),
});

export const DeliveryParams = Type.Object({
  endpointId: Type.String({ maxLength: 100 }),
  deliveryId: Type.String({ maxLength: 100 }),
});
export const RecoveryParams = Type.Object({
  endpointId: Type.String({ maxLength: 100 }),
  recoveryId: Type.String({ maxLength: 100 }),
});

export const TestEventSent = Type.Object({
  eventId: Type.String(),
  deliveryId: Type.String({ description: "listed with the endpoint's deliveries" }),
  eventType: Type.Literal('webhook.test'),
  status: DeliveryStatus,
});

export const RecoverBody = Type.Object(
  {
    since: {
      ...Timestamp,
      description: 'every failed or abandoned delivery created at or after this time is sent again',
    },
    includePending: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'also give every pending delivery since then its attempt now (its retry schedule starts again from it), say after fixing the receiver',
      }),
    ),
  },
  { additionalProperties: false, examples: [{ since: '2025-01-31T09:00:00.000Z', includePending: true }] },
);

export const Recovery = Type.Object({
  id: Type.String({ description: '`whr_…`' }),
  endpointId: Type.String(),
  since: Timestamp,
  includePending: Type.Boolean({ description: 'whether pending deliveries were included' }),
  createdAt: Timestamp,
  status: Type.Union([Type.Literal('running'), Type.Literal('finished')], {
    description: 'finished: the job has looked at every delivery since `since`',
  }),
  counts: Type.Object({
    queued: Type.Integer({ description: 'deliveries this recovery sent again' }),
    sent: Type.Integer({ description: 'of those, delivered since' }),
    failed: Type.Integer({ description: 'of those, failed again (or abandoned, cancelled)' }),
    pending: Type.Integer({ description: 'of those, still on their way' }),
  }),
});

/** One name for an endpoint id on every webhook route. */
export const EndpointParams = Type.Object({ endpointId: Type.String({ maxLength: 100 }) });

const iso = (d: Date | null) => d?.toISOString() ?? null;

export function endpointView(e: WebhookEndpoint, now = new Date()): Static<typeof Endpoint> {
  const previous = e.secrets
    .slice(1)
    .map((s) => s.expiresAt)
    .filter((d): d is Date => d !== null && d.getTime() > now.getTime())
    .sort((a, b) => b.getTime() - a.getTime());
  return {
    id: e._id,
    url: e.url,
    delivery: e.delivery ?? 'push',
    events: e.events,
    description: e.description,
    includeTestEvents: e.includeTestEvents === true,
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

export function recoveryView(p: RecoveryProgress): Static<typeof Recovery> {
  const r = p.recovery;
  return {
    id: r._id,
    endpointId: r.endpointId,
    since: r.since.toISOString(),
    includePending: r.includePending === true,
    createdAt: r.createdAt.toISOString(),
    status: p.status,
    counts: p.counts,
  };
}

export function deliveryView({ delivery: d, attempts }: DeliveryWithAttempts): Static<typeof Delivery> {
  return {
    id: d._id,
    endpointId: d.endpointId,
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
      url: a.url ?? null,
    })),
    createdAt: d.createdAt.toISOString(),
    updatedAt: d.updatedAt.toISOString(),
    succeededAt: iso(d.succeededAt),
    retriedAt: iso(d.retriedAt ?? null),
  };
}

export function feedItemView(item: FeedEntry): Static<typeof FeedItem> {
  return {
    deliveryId: item.delivery._id,
    eventId: item.delivery.eventId,
    eventType: item.delivery.eventType,
    body: item.body,
    headers: item.headers,
  };
}
