/**
 * The one cursor codec for every paged list: an opaque base64url token of the last item's sort key (a time and an
 * id). A token that does not decode is the caller's mistake (400), never a server error.
 */
export interface PageCursor {
  at: Date;
  id: string;
}

export function encodeCursor(c: PageCursor): string {
  return Buffer.from(`${c.at.getTime()} ${c.id}`, 'utf8').toString('base64url');
}

/** The cursor, or null when the token is not one this API issued. */
export function decodeCursor(token: string): PageCursor | null {
  const text = Buffer.from(token, 'base64url').toString('utf8');
  const space = text.indexOf(' ');
  if (space <= 0) return null;
  const ms = Number(text.slice(0, space));
  const id = text.slice(space + 1);
  if (!/^\d+$/.test(text.slice(0, space)) || !Number.isSafeInteger(ms) || !/^[A-Za-z0-9_.:#|-]{1,300}$/.test(id))
    return null;
  return { at: new Date(ms), id };
}
