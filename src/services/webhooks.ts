import { randomUUID } from 'node:crypto';
import { isIP } from 'node:net';
import type { Config } from '../config.ts';
import { errors } from '../domain/errors.ts';
import { EVENT_TYPES, type EventType } from '../domain/events.ts';
import { isAddressAllowed } from '../domain/webhook-signing.ts';
import type { Runtime } from '../runtime.ts';
import { decodeCursor, encodeCursor } from '../store/paging.ts';
import {
  deliveryIdFor,
  type DeliveryStatus,
  type WebhookAttemptDoc,
  type WebhookDeliveryDoc,
  type WebhookRecoveryDoc,
} from '../store/webhook-deliveries.ts';
import type { EndpointDelivery, WebhookEndpoint, WebhookEndpointDoc } from '../store/webhook-endpoints.ts';
import type { Resolver } from '../webhooks/send.ts';
import { checkListQuery, invalid } from './lists.ts';
import { assertSendable, retryNow, scheduleAttempt, scheduleRecovery, type RetryOutcome } from './webhook-delivery.ts';

// The webhook registry's use cases. Endpoints and deliveries are read by id and checked against the tenant here
// (another tenant's endpoint is simply not found); every change of an endpoint is a new revision decided on the
// one just read, retried when a concurrent change got there first.

export const DEFAULT_GRACE_SECONDS = 86_400;
export const MAX_GRACE_SECONDS = 604_800;
/** Replayed deliveries enqueued right away by an enable call; any beyond are picked up by the sweeper. */
const REPLAY_ENQUEUE_LIMIT = 1_000;
/** A page of deliveries examines at most this many index positions (a status filter may skip most of them). */
const MAX_POSITIONS_PER_PAGE = 500;
const CHANGE_ATTEMPTS = 5;

export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export interface DeliveryWithAttempts {
  delivery: WebhookDeliveryDoc;
  attempts: WebhookAttemptDoc[];
}

function fieldError(path: string, message: string, extra: Record<string, unknown> = {}) {
  return errors.unprocessable(message, { errors: [{ path, message }], ...extra });
}

/** An absolute https URL (http too when insecure webhooks are allowed), no credentials, no refused address literal. */
export function checkEndpointUrl(config: Config, raw: string): string {
  const url = raw.trim();
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw fieldError('body.url', 'url must be an absolute URL');
  }
  const insecureOk = config.webhooks.allowInsecureUrls;
  if (parsed.protocol !== 'https:' && !(parsed.protocol === 'http:' && insecureOk)) {
    throw fieldError(
      'body.url',
      insecureOk
        ? 'url must use http or https'
        : 'url must use https (a deployment that must call http:// endpoints sets WEBHOOK_ALLOW_INSECURE_URLS=true)',
    );
  }
  if (parsed.username || parsed.password) throw fieldError('body.url', 'url must not carry credentials');
  // Names are checked when delivering (their addresses can change); an address literal can be refused now.
  const host = parsed.hostname.replace(/^\[|\]$/g, '');
  if (isIP(host)) {
    const verdict = isAddressAllowed(host, config.webhooks.allowPrivateAddresses);
    if (!verdict.allowed) {
      throw fieldError(
        'body.url',
        `url points at a ${verdict.class} address, which deliveries may not reach (a deployment that must reach one, say a local receiver in development, sets WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true)`,
      );
    }
  }
  return url;
}

export function checkEventTypes(events: string[]): EventType[] {
  const known = new Set<string>(EVENT_TYPES);
  const unknown = [...new Set(events.filter((e) => !known.has(e)))];
  if (unknown.length > 0) {
    throw errors.unprocessable(`unknown event types: ${unknown.join(', ')}`, {
      errors: events.flatMap((e, i) =>
        known.has(e) ? [] : [{ path: `body.events.${i}`, message: `unknown event type "${e}"` }],
      ),
      unknownEventTypes: unknown,
      allowedEventTypes: [...EVENT_TYPES],
    });
  }
  return [...new Set(events)] as EventType[];
}

/** A cursor names an index position; anything else is the caller's mistake. */
function positionOf(cursor: string | undefined): number | null {
  if (cursor === undefined) return null;
  const decoded = decodeCursor(cursor);
  const position = decoded && /^\d{1,15}$/.test(decoded.id) ? Number(decoded.id) : 0;
  if (position < 1) throw fieldError('querystring.cursor', 'is not a cursor this API returned');
  return position;
}

function cursorAt(position: number, at: Date): string {
  return encodeCursor({ at, id: String(position) });
}

export async function registerEndpoint(
  runtime: Runtime,
  tenantId: string,
  input: {
    url?: string;
    delivery?: EndpointDelivery;
    events: string[];
    description?: string;
    includeTestEvents?: boolean;
  },
) {
  const delivery = input.delivery ?? 'push';
  // A push endpoint needs somewhere to send; a pull endpoint (a receiver that cannot host webhooks) has nowhere.
  if (delivery === 'push' && input.url === undefined)
    throw fieldError(
      'body.url',
      'url is required (or register with delivery "pull" and read GET /v1/webhooks/{id}/events)',
    );
  if (delivery === 'pull' && input.url !== undefined)
    throw fieldError(
      'body.url',
      'a pull endpoint has no url: its events are read through GET /v1/webhooks/{id}/events',
    );
  const url = input.url === undefined ? null : checkEndpointUrl(runtime.config, input.url);
  const events = checkEventTypes(input.events);
  return runtime.stores.webhookEndpoints.create(tenantId, {
    url,
    delivery,
    events,
    description: input.description ?? null,
    includeTestEvents: input.includeTestEvents ?? false,
  });
}

/** A live endpoint of this tenant, or 404 (another tenant's and deleted ones alike). */
export async function getEndpoint(runtime: Runtime, tenantId: string, endpointId: string): Promise<WebhookEndpoint> {
  const endpoint = await runtime.stores.webhookEndpoints.get(endpointId);
  if (!endpoint || endpoint.tenantId !== tenantId || endpoint.status === 'revoked')
    throw errors.notFound('webhook endpoint');
  return endpoint;
}

/** The tenant's live endpoints, newest first. */
export async function listEndpoints(
  runtime: Runtime,
  tenantId: string,
  page: { limit: number; cursor?: string },
): Promise<Page<WebhookEndpoint>> {
  const before = positionOf(page.cursor) ?? Number.MAX_SAFE_INTEGER;
  const live = (await runtime.stores.webhookEndpoints.allOfTenant(tenantId))
    .filter((e) => e.status !== 'revoked' && e.seq < before)
    .sort((a, b) => b.seq - a.seq);
  const items = live.slice(0, page.limit);
  const last = items.at(-1);
  return { items, nextCursor: last && live.length > items.length ? cursorAt(last.seq, last.createdAt) : null };
}

/** Decides a change on the endpoint as just read and commits it as its next revision; null from `decide` is no change. */
async function changeEndpoint(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  decide: (current: WebhookEndpoint) => Partial<WebhookEndpointDoc> | null,
): Promise<WebhookEndpoint> {
  for (let attempt = 0; attempt < CHANGE_ATTEMPTS; attempt++) {
    const current = await getEndpoint(runtime, tenantId, endpointId);
    const changes = decide(current);
    if (!changes) return current;
    const next = await runtime.stores.webhookEndpoints.change(current, changes);
    if (next) return { ...current, ...next };
  }
  throw new Error(`webhook endpoint ${endpointId}: too many concurrent changes`);
}

export interface EndpointUpdate {
  url?: string;
  events?: string[];
  description?: string | null;
  includeTestEvents?: boolean;
}

/**
 * Changes an endpoint's URL, events, description or test-traffic setting as its next revision: the same checks as
 * registering it (a URL the SSRF rules refuse is refused here too, and nothing changes); its id, secrets, status and
 * deliveries stay. Every attempt reads the endpoint when it starts, so attempts after the change go to the new URL;
 * one already in flight finishes against the old one and is recorded with the URL it went to. Pending deliveries
 * keep their schedule (retry now, or recover with `includePending`, to send them at once); events follow the new
 * list from the next one on. A new URL also stops the old one's failure clock (the 5-day disabling).
 */
export async function updateEndpoint(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  input: EndpointUpdate,
): Promise<WebhookEndpoint> {
  const url = input.url === undefined ? undefined : checkEndpointUrl(runtime.config, input.url);
  const events = input.events === undefined ? undefined : checkEventTypes(input.events);
  let urlChanged = false;
  const endpoint = await changeEndpoint(runtime, tenantId, endpointId, (current) => {
    if (url !== undefined && current.url === null)
      throw fieldError(
        'body.url',
        'a pull endpoint has no url: its events are read through GET /v1/webhooks/{id}/events',
      );
    const changes: Partial<WebhookEndpointDoc> = {};
    if (url !== undefined && url !== current.url) changes.url = url;
    if (events !== undefined && !sameMembers(events, current.events)) changes.events = events;
    if (input.description !== undefined && input.description !== current.description)
      changes.description = input.description;
    if (input.includeTestEvents !== undefined && input.includeTestEvents !== (current.includeTestEvents === true))
      changes.includeTestEvents = input.includeTestEvents;
    urlChanged = changes.url !== undefined;
    return Object.keys(changes).length > 0 ? changes : null;
  });
  if (!urlChanged || !endpoint.failingSince) return endpoint;
  await runtime.stores.webhookEndpoints.clearFailing(endpointId);
  return { ...endpoint, failingSince: null };
}

function sameMembers(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x) => b.includes(x));
}

/** Deletes (revokes) an endpoint. Its pending deliveries are cancelled as their attempts come due, never sent. */
export async function deleteEndpoint(runtime: Runtime, tenantId: string, endpointId: string): Promise<void> {
  await changeEndpoint(runtime, tenantId, endpointId, () => ({ status: 'revoked', revokedAt: new Date() }));
}

/** New current secret; the old current one keeps signing for `graceSeconds` (the secret is returned once). */
export async function rotateSecret(runtime: Runtime, tenantId: string, endpointId: string, graceSeconds: number) {
  let secret = '';
  const endpoint = await changeEndpoint(runtime, tenantId, endpointId, (current) => {
    const rotated = runtime.stores.webhookEndpoints.rotatedSecrets(current, graceSeconds, new Date());
    secret = rotated.secret;
    return { secrets: rotated.secrets };
  });
  return { endpoint, secret };
}

/** Makes the endpoint active again (harmless on an active one) and replays its failed and abandoned deliveries. */
export async function enableEndpoint(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
): Promise<{ endpoint: WebhookEndpoint; replayed: number }> {
  const enabled = await changeEndpoint(runtime, tenantId, endpointId, (current) =>
    current.status === 'disabled' ? { status: 'active', disabledReason: null, disabledAt: null } : null,
  );
  await runtime.stores.webhookEndpoints.clearFailing(endpointId);
  const endpoint = { ...enabled, failingSince: null };
  return { endpoint, replayed: await replayParked(runtime, endpoint) };
}

/**
 * Makes every parked (failed or abandoned) delivery of the endpoint due now with a fresh retry schedule. Reads the
 * endpoint's parked index from where the last replay stopped, so the cost follows what is replayed; an entry read
 * twice (that mark is a cache) finds its delivery no longer parked and is skipped.
 */
async function replayParked(runtime: Runtime, endpoint: WebhookEndpoint): Promise<number> {
  const deliveries = runtime.stores.webhookDeliveries;
  const last = await deliveries.lastParked(endpoint._id);
  let replayed = 0;
  for (let n = endpoint.replayedThrough + 1; n <= last; n++) {
    const parked = await deliveries.parkedAt(endpoint._id, n);
    if (parked && (parked.status === 'failed' || parked.status === 'abandoned')) {
      const due = await deliveries.transition(parked, {
        status: 'pending',
        nextAttemptAt: new Date(),
        lastError: parked.lastError,
        roundAttempts: 0,
      });
      if (due && replayed++ < REPLAY_ENQUEUE_LIMIT) {
        // If Redis refuses, the sweeper finds the delivery through its due entry.
        await scheduleAttempt(runtime, due, 0).catch((err: Error) =>
          runtime.logger.warn({ deliveryId: due._id, err: err.message }, 'replayed delivery left to the sweeper'),
        );
      }
    }
  }
  await runtime.stores.webhookEndpoints.markReplayedThrough(endpoint._id, last);
  return replayed;
}

/** A delivery created this long before `createdAfter` ends the walk (positions follow creation only roughly). */
const CREATION_ORDER_SLACK_MS = 60_000;

export interface DeliveryListQuery {
  limit?: number;
  cursor?: string;
  status?: DeliveryStatus;
  createdAfter?: string;
  createdBefore?: string;
}

/**
 * The endpoint's deliveries, newest first, each with its attempts: the lists' query and page shape and rules
 * (services/lists.ts). It walks the endpoint's delivery index down from the cursor by `_id`, reading at most
 * MAX_POSITIONS_PER_PAGE positions; a filtered page that ran out of them holds fewer items and a cursor to go on.
 */
export async function listDeliveries(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  q: DeliveryListQuery,
): Promise<Page<DeliveryWithAttempts>> {
  const { limit, createdAfter, createdBefore, before } = checkListQuery(q);
  const endpoint = await getEndpoint(runtime, tenantId, endpointId);
  const deliveries = runtime.stores.webhookDeliveries;
  let position: number;
  if (before) {
    if (!/^\d{1,15}$/.test(before.id) || Number(before.id) < 1)
      throw invalid('querystring.cursor', 'is not a cursor this API returned');
    position = Number(before.id);
  } else {
    position = (await deliveries.lastPosition(endpoint._id)) + 1;
  }
  const floor = Math.max(1, position - MAX_POSITIONS_PER_PAGE);
  const items: WebhookDeliveryDoc[] = [];
  let lastAt = new Date(0);
  let reachedAfter = false;
  while (position > floor && items.length < limit && !reachedAfter) {
    // A batch of positions read at once; those beyond the page's limit are read again by the next page.
    const positions = Array.from(
      { length: Math.min(Math.max(limit - items.length, 10), position - floor) },
      (_, i) => position - 1 - i,
    );
    const batch = await Promise.all(positions.map((n) => deliveries.atPosition(endpoint._id, n)));
    for (const d of batch) {
      if (d && createdAfter && d.createdAt.getTime() < createdAfter.getTime() - CREATION_ORDER_SLACK_MS) {
        reachedAfter = true;
        break;
      }
      position--;
      if (!d || (q.status && d.status !== q.status)) continue;
      if (createdAfter && d.createdAt.getTime() <= createdAfter.getTime()) continue;
      if (createdBefore && d.createdAt.getTime() >= createdBefore.getTime()) continue;
      items.push(d);
      lastAt = d.createdAt;
      if (items.length === limit) break;
    }
  }
  return {
    items: await withAttempts(runtime, items),
    nextCursor: position > 1 && !reachedAfter ? cursorAt(position, lastAt) : null,
  };
}

// ---- Replay: a test event, resending one delivery, recovering the failed ones since a time. Each refuses what the
// dispatcher would refuse (a disabled endpoint, an address the SSRF guard refuses), before anything is recorded.

/** Positions one progress read looks at, at most (a recovery reaching further reports on its newest ones). */
const RECOVERY_READ_LIMIT = 10_000;

/**
 * Sends a `webhook.test` event to this endpoint alone (whatever it subscribes to), signed and retried like any
 * delivery; the delivery is listed with the others. A pull endpoint gets it stored, next in its feed.
 */
export async function sendTestEvent(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  options: { resolver?: Resolver } = {},
) {
  const endpoint = await getEndpoint(runtime, tenantId, endpointId);
  if (endpoint.url !== null) await assertSendable(runtime, endpoint, options);
  const now = new Date();
  const data = { endpointId, message: 'a test event sent on request; it changes nothing' };
  const event = await runtime.stores.outbox.recordForOneEndpoint(
    tenantId,
    'webhook.test',
    data,
    `webhook.test:${endpointId}:${randomUUID()}`,
  );
  const delivery = await runtime.stores.webhookDeliveries.ensure({
    eventId: event._id,
    eventType: 'webhook.test',
    endpoint,
    now,
  });
  if (delivery.status !== 'pending') return { event, delivery }; // stored for a pull endpoint's feed
  // If Redis refuses, the sweeper finds the pending delivery through its due entry.
  await scheduleAttempt(runtime, delivery, 0).catch((err: Error) =>
    runtime.logger.warn({ deliveryId: delivery._id, err: err.message }, 'test delivery left to the sweeper'),
  );
  return { event, delivery };
}

/**
 * Retry now: one delivery of this endpoint, pending or finished, gets an attempt now with the same event id and body,
 * and its retry schedule restarts from that attempt (see retryNow: idempotent by delivery). `retried: false` when
 * an attempt was already due now or running, or a retry was asked for moments ago.
 */
export async function resendDelivery(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  deliveryId: string,
  options: { resolver?: Resolver } = {},
): Promise<RetryOutcome> {
  const endpoint = await getEndpoint(runtime, tenantId, endpointId);
  const delivery = await runtime.stores.webhookDeliveries.get(deliveryId);
  if (!delivery || delivery.endpointId !== endpoint._id || delivery.tenantId !== tenantId)
    throw errors.notFound('webhook delivery');
  await assertSendable(runtime, endpoint, options);
  return retryNow(runtime, delivery);
}

/**
 * Asks for every failed (or abandoned) delivery of the endpoint created since `since` to be sent again, by a job;
 * with `includePending`, pending ones get their attempt now as well.
 */
export async function recoverFailed(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  input: { since: Date; includePending?: boolean },
  options: { resolver?: Resolver } = {},
): Promise<WebhookRecoveryDoc> {
  const { since } = input;
  const endpoint = await getEndpoint(runtime, tenantId, endpointId);
  if (since.getTime() > Date.now()) throw fieldError('body.since', 'since must not be in the future');
  await assertSendable(runtime, endpoint, options);
  const deliveries = runtime.stores.webhookDeliveries;
  const fromPosition = await deliveries.lastPosition(endpoint._id);
  const recovery = await deliveries.recordRecovery({
    _id: `whr_${randomUUID().replace(/-/g, '')}`,
    tenantId,
    endpointId: endpoint._id,
    since,
    createdAt: new Date(),
    fromPosition,
    scannedDownTo: fromPosition + 1,
    finishedAt: null,
    includePending: input.includePending === true,
  });
  await scheduleRecovery(runtime, recovery);
  return recovery;
}

export interface RecoveryProgress {
  recovery: WebhookRecoveryDoc;
  status: 'running' | 'finished';
  /** Deliveries this recovery sent again; of those, delivered since, failed again, and still on their way. */
  counts: { queued: number; sent: number; failed: number; pending: number };
}

/** A recovery's progress, read back from its claims and their deliveries (by `_id`). */
export async function getRecovery(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  recoveryId: string,
): Promise<RecoveryProgress> {
  const endpoint = await getEndpoint(runtime, tenantId, endpointId);
  const deliveries = runtime.stores.webhookDeliveries;
  const recovery = await deliveries.recoveryOf(recoveryId);
  if (!recovery || recovery.tenantId !== tenantId || recovery.endpointId !== endpoint._id)
    throw errors.notFound('webhook recovery');
  const low = Math.max(1, recovery.scannedDownTo, recovery.fromPosition - RECOVERY_READ_LIMIT + 1);
  const positions = Array.from(
    { length: Math.max(0, recovery.fromPosition - low + 1) },
    (_, i) => recovery.fromPosition - i,
  );
  const counts = { queued: 0, sent: 0, failed: 0, pending: 0 };
  for (let i = 0; i < positions.length; i += 200) {
    const items = (
      await Promise.all(positions.slice(i, i + 200).map((n) => deliveries.recoveryItemAt(recoveryId, n)))
    ).filter((x) => x !== null);
    const now = await Promise.all(items.map((item) => deliveries.get(item!.deliveryId)));
    for (const [j, item] of items.entries()) {
      const d = now[j];
      if (!d || d.rev <= item!.fromRev) continue; // claimed, but its resend has not been recorded (yet)
      counts.queued++;
      if (d.status === 'succeeded') counts.sent++;
      else if (d.status === 'pending') counts.pending++;
      else counts.failed++;
    }
  }
  return { recovery, status: recovery.finishedAt ? 'finished' : 'running', counts };
}

/** Webhook events of one run at most (its finalization, settlement, disputes and holdback: a handful in practice). */
const RUN_EVENTS_LIMIT = 200;

/**
 * Every delivery of the run's events to the tenant's endpoints, oldest first, each with its attempts. Delivery ids
 * derive from the event and the endpoint, so each is one `_id` read: the cost follows the run's events and the
 * tenant's few endpoints, never what is stored.
 */
export async function deliveriesOfRun(
  runtime: Runtime,
  tenantId: string,
  runId: string,
): Promise<DeliveryWithAttempts[]> {
  if (!(await runtime.stores.runs.get(tenantId, runId))) throw errors.notFound('run'); // another tenant's run alike
  const [eventIds, endpoints] = await Promise.all([
    runtime.stores.outbox.eventIdsOfRun(runId, RUN_EVENTS_LIMIT),
    runtime.stores.webhookEndpoints.allOfTenant(tenantId),
  ]);
  const found = await Promise.all(
    eventIds.flatMap((eventId) =>
      endpoints.map((endpoint) => runtime.stores.webhookDeliveries.get(deliveryIdFor(eventId, endpoint._id))),
    ),
  );
  return withAttempts(
    runtime,
    found.filter((d): d is WebhookDeliveryDoc => d !== null && d.tenantId === tenantId),
  );
}

/** Each delivery with its attempts, read side by side. */
async function withAttempts(runtime: Runtime, items: WebhookDeliveryDoc[]): Promise<DeliveryWithAttempts[]> {
  const attempts = await Promise.all(items.map((d) => runtime.stores.webhookDeliveries.attemptsOf(d)));
  return items.map((delivery, i) => ({ delivery, attempts: attempts[i]! }));
}
