import { errors } from '../../domain/errors.ts';
import { statementLastSeq } from '../../domain/x402-sessions.ts';
import type { Runtime } from '../../runtime.ts';
import { decodeCursor, encodeCursor } from '../../store/paging.ts';
import type { ChargeDoc } from '../../store/x402-sessions.ts';
import type { X402Sessions } from './sessions.ts';

// Reading a session's charges while it runs (the statement lists them only once it is closed): the console's session
// page and any payer that wants to see what it was charged. Charges are `<sessionId>#<seq>`, so a page is a run of
// `_id` lookups downwards from the highest seq handed out: the cost follows the page, never the collection.

export interface SessionChargesPage {
  /** The session's currency, which every charge is in. */
  currency: string;
  items: ChargeDoc[];
  nextCursor: string | null;
}

/**
 * One page of a session's charges, newest first: each seq the budget handed out, as charged or void (a debit whose
 * call never answered, or that a close got to first). Up to the seq the budget holds for an open session, up to
 * the statement's last seq for a closed one.
 */
export async function sessionCharges(
  runtime: Runtime,
  sessions: X402Sessions,
  tenantId: string,
  sessionId: string,
  page: { limit: number; cursor?: string },
): Promise<SessionChargesPage> {
  const session = await sessions.requireSession(tenantId, sessionId);
  const state = await sessions.state(session);
  const highest = state.close ? statementLastSeq(state.close.statement.body) : state.charges;
  const below = page.cursor === undefined ? highest + 1 : seqOfCursor(session._id, page.cursor);
  const top = Math.min(below - 1, highest);
  const seqs = Array.from({ length: Math.max(0, Math.min(page.limit, top)) }, (_, i) => top - i);
  const store = runtime.stores.x402Sessions;
  // A seq handed out but not yet recorded (its call is in flight) is left out: it appears once recorded.
  const found = await Promise.all(seqs.map((seq) => store.getCharge(session._id, seq)));
  const items = found.filter((c): c is ChargeDoc => c !== null);
  const last = seqs[seqs.length - 1];
  const nextCursor =
    last !== undefined && last > 1
      ? encodeCursor({ at: found[found.length - 1]?.at ?? session.createdAt, id: `${session._id}#${last}` })
      : null;
  return { currency: session.currency, items, nextCursor };
}

function seqOfCursor(sessionId: string, cursor: string): number {
  const decoded = decodeCursor(cursor);
  const prefix = `${sessionId}#`;
  const seq = decoded?.id.startsWith(prefix) ? Number(decoded.id.slice(prefix.length)) : NaN;
  if (!Number.isSafeInteger(seq) || seq < 1) {
    const message = 'is not a cursor this API returned for this session';
    throw errors.unprocessable(message, { errors: [{ path: 'querystring.cursor', message }] });
  }
  return seq;
}
