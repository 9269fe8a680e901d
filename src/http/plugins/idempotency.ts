import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { decryptAtRest, encryptAtRest } from '../../domain/crypto.ts';
import { serviceError } from '../../domain/errors.ts';
import type { Runtime } from '../../runtime.ts';

const KEY_RE = /^[A-Za-z0-9._:-]{1,255}$/;
const QUOTED_KEY_RE = /^"([A-Za-z0-9._:-]{1,255})"$/;
/** How long a claimed key blocks duplicates while its first request runs; a crashed process frees it after this. */
const IN_PROGRESS_TTL_SECONDS = 60;

interface StoredEntry {
  state: 'in_progress' | 'done';
  fingerprint: string;
  status?: number;
  contentType?: string;
  /** The response body, encrypted: responses can carry secrets shown once (API tokens, webhook secrets). */
  sealedBody?: string;
  /** The Set-Cookie header (JSON: a string or an array), encrypted: a session cookie is a credential, and a replay must carry it too. */
  sealedSetCookie?: string;
}

/** Additional data binding a sealed Set-Cookie to its record, apart from the body sealed under the same key. */
const setCookieAad = (redisKey: string) => `${redisKey}\nset-cookie`;

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The route makes a repeat harmless by itself (say, a session charge keyed by its payment id): no replay layer. */
    nativeIdempotency?: boolean;
  }
  interface FastifyRequest {
    idempotencyClaim: { redisKey: string; fingerprint: string } | null;
    /**
     * Who sent which Idempotency-Key to which route, when the request carries one: creates derive the new object's
     * id from it (idFromIdempotency), so a retry after a crash or a released key resumes that object.
     */
    idempotencyScope: string | null;
  }
}

/** The key as sent, or null when absent; accepts the RFC 8941 quoted-string form too. */
export function parseIdempotencyKey(raw: string | string[] | undefined): string | null {
  if (raw === undefined) return null;
  const value = Array.isArray(raw) ? raw.join(',') : raw;
  if (KEY_RE.test(value)) return value;
  const quoted = QUOTED_KEY_RE.exec(value);
  if (quoted) return quoted[1]!;
  throw serviceError('INVALID_IDEMPOTENCY_KEY', 'Idempotency-Key must be 1-255 characters of [A-Za-z0-9._:-]');
}

/** The request's key from `Idempotency-Key`, else `x-idempotency-key` (contract section 4 accepts both), or null. */
export function idempotencyKeyOf(request: FastifyRequest): string | null {
  return parseIdempotencyKey(request.headers['idempotency-key'] ?? request.headers['x-idempotency-key']);
}

/** Object keys sorted at every level, so the same request serialised in another key order has the same print. */
function stableJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableJson).join(',')}]`;
  if (value && typeof value === 'object') {
    const entries = Object.keys(value as object)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${stableJson((value as Record<string, unknown>)[k])}`);
    return `{${entries.join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

function fingerprint(request: FastifyRequest): string {
  return createHash('sha256')
    .update(`${request.method}\n${request.url}\n${stableJson(request.body ?? null)}`)
    .digest('hex');
}

/**
 * Idempotency-Key for every POST and PUT (contract section 4), kept in Redis so every API process sees it. The key is
 * claimed after schema validation, so a request that fails validation stores nothing; 5xx and 429 answers release
 * the claim so the caller's retry can run, except a 503 the request deadline gave while the handler still runs.
 */
export default fp(async function idempotencyPlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { config, redis } = opts.runtime;
  const atRestKey = config.atRestKey;
  app.decorateRequest('idempotencyClaim', null);
  app.decorateRequest('idempotencyScope', null);

  app.addHook('preHandler', async (request, reply) => {
    if (request.method !== 'POST' && request.method !== 'PUT') return;
    if (request.routeOptions.config.nativeIdempotency) return;
    const key = idempotencyKeyOf(request);
    if (key === null) return;
    const principal = request.principal;
    // Scoped to tenant + credential: an onboarding principal (admin key, tenant key or session) acts for its tenant.
    const owner =
      principal && principal.kind !== 'admin'
        ? `${principal.tenantId}:${principal.credentialId}`
        : (principal?.credentialId ?? `ip:${request.ip}`);
    const scope = `${owner}:${request.method}:${request.routeOptions.url}:${key}`;
    const redisKey = `${config.redisPrefix}:idem:${scope}`;
    const print = fingerprint(request);

    const claimed = await redis.set(
      redisKey,
      JSON.stringify({ state: 'in_progress', fingerprint: print } satisfies StoredEntry),
      'EX',
      IN_PROGRESS_TTL_SECONDS,
      'NX',
    );
    if (claimed === 'OK') {
      request.idempotencyClaim = { redisKey, fingerprint: print };
      request.idempotencyScope = scope;
      return;
    }
    const raw = await redis.get(redisKey);
    if (raw === null) {
      throw serviceError('IDEMPOTENCY_IN_PROGRESS', 'a request with this Idempotency-Key just finished; retry');
    }
    const entry = JSON.parse(raw) as StoredEntry;
    if (entry.fingerprint !== print) {
      throw serviceError('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was used for a different request');
    }
    if (entry.state === 'in_progress') {
      throw serviceError('IDEMPOTENCY_IN_PROGRESS', 'a request with this Idempotency-Key is still being processed');
    }
    reply.header('idempotent-replayed', 'true');
    if (entry.contentType) reply.type(entry.contentType);
    if (entry.sealedSetCookie)
      reply.header(
        'set-cookie',
        JSON.parse(decryptAtRest(atRestKey, entry.sealedSetCookie, setCookieAad(redisKey))) as string | string[],
      );
    return reply.status(entry.status!).send(decryptAtRest(atRestKey, entry.sealedBody!, redisKey));
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const claim = request.idempotencyClaim;
    if (!claim) return payload;
    request.idempotencyClaim = null;
    const { redisKey } = claim;
    const status = reply.statusCode;
    try {
      if (request.answeredByDeadline) {
        // The handler may still be running and may yet succeed: the key stays in progress (a retry gets 409) until
        // the claim expires, rather than letting a retry run the same request a second time beside it.
      } else if (
        status >= 500 ||
        status === 429 ||
        (status === 422 && typeof payload === 'string' && payload.includes('"code":"IDEMPOTENCY_KEY_REUSED"'))
      ) {
        // Released, so the caller's retry runs: after a 5xx or 429, and after a create refused for asking other terms
        // than the object this key already made (the key stays that object's: its own request resumes it).
        await redis.del(redisKey);
      } else {
        const setCookie = reply.getHeader('set-cookie');
        const entry: StoredEntry = {
          state: 'done',
          fingerprint: claim.fingerprint,
          status,
          contentType: String(reply.getHeader('content-type') ?? 'application/json; charset=utf-8'),
          sealedBody: encryptAtRest(
            atRestKey,
            typeof payload === 'string' ? payload : payload == null ? '' : String(payload),
            redisKey,
          ),
          ...(setCookie === undefined
            ? {}
            : {
                sealedSetCookie: encryptAtRest(
                  atRestKey,
                  JSON.stringify(Array.isArray(setCookie) ? setCookie.map(String) : String(setCookie)),
                  setCookieAad(redisKey),
                ),
              }),
        };
        await redis.set(redisKey, JSON.stringify(entry), 'EX', config.idempotencyTtlSeconds);
      }
    } catch (err) {
      // The response is already decided; losing the record only means a retry runs again (and our writes are
      // idempotent by id), so log instead of failing the caller.
      request.log.warn({ err: (err as Error).message }, 'could not record idempotent response');
    }
    return payload;
  });
});
