import { eventBody, signedHeaders, type SignedHeaders } from '../domain/webhook-signing.ts';
import type { Runtime } from '../runtime.ts';
import { decodeCursor, encodeCursor } from '../store/paging.ts';
import type { WebhookDeliveryDoc } from '../store/webhook-deliveries.ts';
import { checkListQuery, invalid } from './lists.ts';
import { getEndpoint } from './webhooks.ts';

// The pull feed: for a receiver that cannot host webhooks, the events an endpoint subscribes to, oldest first after
// a cursor, each as the exact body a delivery carries with the headers a delivery carries (Standard Webhooks,
// signed now with the endpoint's current secrets), so a stock verifier accepts each item.
//
// It walks the endpoint's delivery index (one position per delivery, in creation order; store/webhook-deliveries.ts)
// by `_id`, so a page costs what it reads, never what is stored. A position can be missing for a moment: its writer
// took the number and has not inserted the entry yet, or has inserted the entry and not the delivery. The feed pauses
// there (the cursor stops before it) until the gap is older than FEED_GAP_GRACE_MS: then the writer is dead, and the
// fan-out's retry puts the lost delivery at a later position, so nothing is lost for good. An entry-less position
// is dated by the first entry after it (numbers are taken in order, so it is older than that entry).

/** A position without its delivery younger than this may still get it; the feed waits before passing it. */
export const FEED_GAP_GRACE_MS = 60_000;
/** Positions one page reads at most (missing and passed-over ones included). */
export const FEED_SCAN_LIMIT = 1_000;

export interface FeedItem {
  position: number;
  delivery: WebhookDeliveryDoc;
  body: string;
  headers: SignedHeaders;
}

export interface FeedPage {
  items: FeedItem[];
  /** Where the next read starts; always given (a feed is read again later from where it stopped). */
  nextCursor: string;
  /** More is ready now (the page was cut by its limit); otherwise poll again later. */
  hasMore: boolean;
}

/** The position a cursor stands after (0: from the start), and its time; 422 for anything this API did not issue. */
function afterPosition(cursor: string | undefined): { position: number; at: Date } {
  if (cursor === undefined) return { position: 0, at: new Date(0) };
  const decoded = decodeCursor(cursor);
  if (!decoded || !/^\d{1,15}$/.test(decoded.id))
    throw invalid('querystring.after', 'is not a cursor this API returned');
  return { position: Number(decoded.id), at: decoded.at };
}

export async function readFeed(
  runtime: Runtime,
  tenantId: string,
  endpointId: string,
  q: { after?: string; limit?: number },
  now: Date = new Date(),
): Promise<FeedPage> {
  const { limit } = checkListQuery({ limit: q.limit }); // the lists' default, bounds and 422
  const { position: after, at: afterAt } = afterPosition(q.after);
  const endpoint = await getEndpoint(runtime, tenantId, endpointId);
  const deliveries = runtime.stores.webhookDeliveries;
  const [head, expiredThrough] = await Promise.all([
    deliveries.lastPosition(endpoint._id),
    deliveries.retention.expiredThrough(endpoint._id),
  ]);
  // Positions up to the retention's mark are gone: a cursor from before it goes on after it.
  let consumed = Math.max(after, Math.min(expiredThrough, head));
  const end = Math.min(head, consumed + FEED_SCAN_LIMIT);
  const settledBefore = now.getTime() - FEED_GAP_GRACE_MS;
  const found: Array<{ position: number; delivery: WebhookDeliveryDoc }> = [];
  let gaps = 0; // entry-less positions right after `consumed`, not yet known to be dead
  let stopped = false;
  let next = consumed + 1;
  while (!stopped && next <= end && found.length < limit) {
    const positions = Array.from(
      { length: Math.min(end - next + 1, Math.max(limit - found.length, 20)) },
      (_, i) => next + i,
    );
    next += positions.length;
    const slots = await Promise.all(positions.map((n) => deliveries.slotAt(endpoint._id, n)));
    for (const [i, { entry, delivery }] of slots.entries()) {
      const n = positions[i]!;
      if (!entry) {
        gaps++;
        continue;
      }
      const entryAt = entry.indexedAt?.getTime() ?? 0;
      if (gaps > 0) {
        // The gaps' numbers were taken before this entry's: once it is old enough, their writers are dead.
        if (entryAt >= settledBefore) {
          stopped = true;
          break;
        }
        gaps = 0;
      }
      if (delivery && delivery.endpointId === endpoint._id && delivery.seq === n) {
        found.push({ position: n, delivery });
        consumed = n;
        if (found.length === limit) {
          stopped = true;
          break;
        }
      } else if ((delivery && delivery.seq !== n) || entryAt < settledBefore) {
        consumed = n; // a duplicate position (its delivery lives at its own), or a writer that died before the delivery
      } else {
        stopped = true; // the delivery may still be on its way
        break;
      }
    }
  }
  if (!stopped && gaps > 0 && end < head) {
    // The scan bound ended inside a run of entry-less positions (say, removed by hand, or expired while the mark was
    // lost with Redis): the newest entry dates them all. Without this a run longer than the bound would hold the feed.
    const newest = (await deliveries.slotAt(endpoint._id, head)).entry;
    if (newest && (newest.indexedAt?.getTime() ?? 0) < settledBefore) consumed = end;
    else stopped = true;
  }
  const events = await Promise.all(found.map(({ delivery }) => runtime.stores.outbox.get(delivery.eventId)));
  const secrets = runtime.stores.webhookEndpoints.signingSecrets(endpoint, now);
  const timestamp = Math.floor(now.getTime() / 1000);
  const items: FeedItem[] = [];
  for (const [i, { position, delivery }] of found.entries()) {
    const event = events[i];
    if (!event || event.tenantId !== tenantId) continue; // an event that no longer exists is not delivered either
    const body = eventBody(event);
    items.push({ position, delivery, body, headers: signedHeaders(secrets, event._id, timestamp, body) });
  }
  // Cut by the limit or by the scan bound (not by a pause at a gap): more can be read at once.
  const hasMore = consumed < head && (found.length === limit || (!stopped && end < head));
  // The time only makes the token readable to people; an idle read hands back the cursor it was given.
  const lastAt = found.at(-1)?.delivery.createdAt ?? afterAt;
  return { items, nextCursor: encodeCursor({ at: lastAt, id: String(consumed) }), hasMore };
}
