// Outbound delivery: one POST to a receiver, with the SSRF guard. The host is resolved here, every address it
// resolves to is checked, and the connection is pinned to the checked address (the socket's lookup answers with it,
// TLS still verifies the certificate for the host name), so a DNS answer that changes between check and connect
// (rebinding) cannot reach a refused address. Redirects are never followed: a 3xx is just a failed attempt.
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { isIP, type LookupFunction } from 'node:net';
import { isAddressAllowed } from '../domain/webhook-signing.ts';

export type Resolver = (host: string) => Promise<LookupAddress[]>;

export const systemResolver: Resolver = (host) =>
  new Promise((resolve, reject) => {
    dnsLookup(host, { all: true, verbatim: true }, (err, addresses) => (err ? reject(err) : resolve(addresses)));
  });

export interface SendOptions {
  timeoutMs: number;
  allowPrivateAddresses: boolean;
  resolver?: Resolver;
}

export type SendResult =
  | { ok: true; statusCode: number; durationMs: number; retryAfter: string | null; address: string }
  | {
      ok: false;
      statusCode: number | null;
      durationMs: number;
      retryAfter: string | null;
      error: string;
      refused: boolean;
    };

const USER_AGENT = 'agent-settlement-webhooks/1.0';

class RefusedError extends Error {}

async function resolveChecked(host: string, options: SendOptions): Promise<LookupAddress> {
  const literal = host.startsWith('[') ? host.slice(1, -1) : host;
  const family = isIP(literal);
  const addresses = family ? [{ address: literal, family }] : await (options.resolver ?? systemResolver)(literal);
  if (addresses.length === 0) throw new Error(`${host} resolves to no address`);
  // Refuse when ANY answer is refused: a name that mixes public and private answers is not trusted with either.
  for (const a of addresses) {
    const verdict = isAddressAllowed(a.address, options.allowPrivateAddresses);
    if (!verdict.allowed) {
      const rule =
        verdict.class === 'metadata' || verdict.class === 'invalid'
          ? 'never allowed'
          : 'private destinations are not allowed';
      throw new RefusedError(
        `refused: ${family ? host : `${host} resolves to ${a.address}, which`} is a ${verdict.class} address (${rule})`,
      );
    }
  }
  return addresses[0]!;
}

/**
 * Why a delivery to `url` would be refused by the SSRF guard right now (the same check every attempt makes), or null
 * when it may go out. A name that does not resolve is not a refusal here: the attempt records it as a failure.
 */
export async function destinationRefusal(url: string, options: Omit<SendOptions, 'timeoutMs'>): Promise<string | null> {
  try {
    const target = new URL(url);
    if (target.protocol !== 'https:' && target.protocol !== 'http:')
      return `refused: unsupported scheme ${target.protocol}`;
    await resolveChecked(target.hostname, { ...options, timeoutMs: 0 });
    return null;
  } catch (err) {
    return err instanceof RefusedError ? err.message : null;
  }
}

/** POSTs `body` to `url` with `headers`; never throws, every failure is a result with a readable error. */
export async function sendWebhook(
  url: string,
  body: string,
  headers: Record<string, string>,
  options: SendOptions,
): Promise<SendResult> {
  const started = performance.now();
  const elapsed = () => Math.round(performance.now() - started);
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), options.timeoutMs);
  try {
    const target = new URL(url);
    if (target.protocol !== 'https:' && target.protocol !== 'http:')
      throw new RefusedError(`refused: unsupported scheme ${target.protocol}`);
    const pinned = await Promise.race([
      resolveChecked(target.hostname, options),
      new Promise<never>((_, reject) =>
        controller.signal.addEventListener('abort', () => reject(new Error('timed out resolving the host'))),
      ),
    ]);
    const lookup: LookupFunction = (_hostname, opts, callback) => {
      // Whatever the socket asks for, it gets the address that was checked.
      if ((opts as { all?: boolean }).all) (callback as (e: null, a: LookupAddress[]) => void)(null, [pinned]);
      else callback(null, pinned.address, pinned.family);
    };
    const client = target.protocol === 'https:' ? https : http;
    const outcome = await new Promise<{ statusCode: number; retryAfter: string | null }>((resolve, reject) => {
      const req = client.request(
        target,
        {
          method: 'POST',
          agent: false,
          lookup,
          signal: controller.signal,
          headers: {
            ...headers,
            'content-type': 'application/json',
            'content-length': String(Buffer.byteLength(body)),
            'user-agent': USER_AGENT,
          },
        },
        (res) => {
          // The status is the answer; the body is not needed, so the connection (never reused: agent false) is
          // dropped at once rather than letting a slow body hold the attempt open.
          resolve({
            statusCode: res.statusCode ?? 0,
            retryAfter: typeof res.headers['retry-after'] === 'string' ? res.headers['retry-after'] : null,
          });
          res.destroy();
        },
      );
      req.on('error', reject);
      req.end(body);
    });
    const durationMs = elapsed();
    if (outcome.statusCode >= 200 && outcome.statusCode < 300) {
      return {
        ok: true,
        statusCode: outcome.statusCode,
        durationMs,
        retryAfter: outcome.retryAfter,
        address: pinned.address,
      };
    }
    const redirect = outcome.statusCode >= 300 && outcome.statusCode < 400 ? ' (redirects are not followed)' : '';
    return {
      ok: false,
      statusCode: outcome.statusCode,
      durationMs,
      retryAfter: outcome.retryAfter,
      error: `receiver answered HTTP ${outcome.statusCode}${redirect}`,
      refused: false,
    };
  } catch (err) {
    const durationMs = elapsed();
    if (err instanceof RefusedError)
      return { ok: false, statusCode: null, durationMs, retryAfter: null, error: err.message, refused: true };
    if (controller.signal.aborted) {
      return {
        ok: false,
        statusCode: null,
        durationMs,
        retryAfter: null,
        error: `timed out after ${options.timeoutMs} ms`,
        refused: false,
      };
    }
    const e = err as NodeJS.ErrnoException;
    return {
      ok: false,
      statusCode: null,
      durationMs,
      retryAfter: null,
      error: `network error: ${e.message || e.code || 'unknown'}`,
      refused: false,
    };
  } finally {
    clearTimeout(timer);
  }
}
