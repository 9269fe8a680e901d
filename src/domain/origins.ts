// Which Host and Origin a browser-reachable endpoint answers (MCP's Streamable HTTP transport: servers MUST validate
// Origin, against DNS rebinding). Pure: the policy comes from configuration, the headers from the request.

const LOOPBACK_HOSTNAMES = new Set(['localhost', '127.0.0.1', '[::1]']);

export interface OriginPolicy {
  /** The service's own base URL (PUBLIC_BASE_URL): the only Host allowed besides loopback, and an allowed Origin. */
  publicBaseUrl: string;
  /** Further Origins allowed (MCP_ALLOWED_ORIGINS, serialized origins), e.g. a web client's `https://app.example.com`. */
  allowedOrigins: string[];
  /** Loopback names on any port (MCP_ALLOW_LOOPBACK): a local client of a service on the same machine. */
  allowLoopback: boolean;
}

export type OriginRefusal = { header: 'host' | 'origin'; reason: string };

function parse(url: string): URL | null {
  try {
    return new URL(url);
  } catch {
    return null;
  }
}

/**
 * Null when the request may go on, else which header is refused and why. A request without Origin (every
 * non-browser client) is judged by its Host alone; a browser always sends Origin on a cross-site POST, so a page
 * of another site, or a name rebound to this machine, is refused by one or the other.
 */
export function refusedOrigin(
  policy: OriginPolicy,
  headers: { host?: string | undefined; origin?: string | undefined },
): OriginRefusal | null {
  const base = new URL(policy.publicBaseUrl);
  const loopback = (u: URL) => policy.allowLoopback && LOOPBACK_HOSTNAMES.has(u.hostname.toLowerCase());

  // Host names this service: PUBLIC_BASE_URL's host, or loopback. Read as the authority of a URL of the base's
  // scheme, so `api.example.com:443` is `api.example.com` behind https.
  const host = headers.host ? parse(`${base.protocol}//${headers.host}`) : null;
  if (!host || host.pathname !== '/' || host.username || host.password || host.search || host.hash)
    return { header: 'host', reason: 'the Host header is missing or not a host' };
  if (!loopback(host) && host.host !== base.host)
    return { header: 'host', reason: `the Host ${host.host} is not this service's` };

  if (headers.origin === undefined) return null;
  const origin = parse(headers.origin);
  // `null` (a sandboxed page, a file) and anything but http(s) is never an allowed origin.
  if (!origin || (origin.protocol !== 'https:' && origin.protocol !== 'http:') || origin.origin === 'null') {
    return { header: 'origin', reason: 'the Origin is not an http(s) origin' };
  }
  if (loopback(origin) || origin.origin === base.origin || policy.allowedOrigins.includes(origin.origin)) return null;
  return { header: 'origin', reason: `the Origin ${origin.origin} is not allowed` };
}
