import { readdirSync, readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Type, type Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { cookieValue } from '../../domain/buyer-session.ts';
import { errors } from '../../domain/errors.ts';
import {
  consoleSession,
  csrfTokenMatches,
  signInToConsole,
  signOutOfConsole,
  type ConsoleSession,
} from '../../services/console-sessions.ts';
import { CONSOLE_ASSETS_PATH, CONSOLE_CSP, CONSOLE_PATH, shellPage, signInPage } from '../console/pages.ts';
import { CONSOLE_SESSION_COOKIE, CSRF_HEADER } from '../plugins/auth.ts';

// Resolved from the package root, so the compiled service (dist/, which the image runs beside src/) finds them too.
const ASSETS_DIR = new URL('../../../src/http/console/assets/', import.meta.url);
const ASSET_TYPES: Record<string, string> = { js: 'text/javascript; charset=utf-8', css: 'text/css; charset=utf-8' };

const SignIn = Type.Object({ key: Type.String({ minLength: 1, maxLength: 512 }) }, { additionalProperties: false });

/**
 * The web console (README "The console"): HTML pages and their ES modules, and the sign-in and sign-out that turn a
 * key into a session cookie. The pages hold no data: their modules read the API routes with the cookie, and the auth
 * plugin checks those reads exactly as for the key that signed in. Not API operations, so kept out of the document.
 */
export async function consoleRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const open = { access: 'public' } as const;
  // Read once at start-up: a missing file fails the start, not a visit.
  const assets = new Map(
    readdirSync(ASSETS_DIR)
      .filter((name) => /^[a-z-]+\.(js|css)$/.test(name))
      .map((name) => [name, readFileSync(new URL(name, ASSETS_DIR))]),
  );

  const cookie = (value: string, maxAgeSeconds: number) =>
    `${CONSOLE_SESSION_COOKIE}=${value}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${maxAgeSeconds}${runtime.config.console.secureCookie ? '; Secure' : ''}`;

  const html = (reply: FastifyReply, body: string) =>
    reply
      .type('text/html; charset=utf-8')
      .header('cache-control', 'no-store')
      .header('content-security-policy', CONSOLE_CSP)
      .header('x-frame-options', 'DENY')
      .header('referrer-policy', 'same-origin')
      .send(body);

  const sessionOf = async (
    request: FastifyRequest,
  ): Promise<{ token: string; session: ConsoleSession } | { token: string | null; session: null }> => {
    const token = cookieValue(request.headers.cookie, CONSOLE_SESSION_COOKIE);
    const session = token ? await consoleSession(runtime, token) : null;
    return session ? { token: token!, session } : { token, session: null };
  };

  // Every screen is the same shell (the modules draw the screen the path names); without a live session, the form.
  const page = async (request: FastifyRequest, reply: FastifyReply) => {
    const { token, session } = await sessionOf(request);
    if (!session) {
      if (token) reply.header('set-cookie', cookie('', 0));
      return html(
        reply,
        signInPage(
          token ? 'Your session ended (it expired, you signed out, or its key was revoked). Sign in again.' : null,
        ),
      );
    }
    const { signer } = session;
    return html(
      reply,
      shellPage({
        signer: signer.kind,
        tenantId: signer.kind === 'key' ? signer.tenantId : null,
        keyId: signer.kind === 'key' ? signer.keyId : null,
        scopes: session.scopes,
        csrfToken: session.csrfToken,
        expiresAt: session.expiresAt.toISOString(),
      }),
    );
  };
  app.get(CONSOLE_PATH, { config: open, schema: { hide: true } }, page);
  app.get(`${CONSOLE_PATH}/*`, { config: open, schema: { hide: true } }, page);

  app.get<{ Params: { name: string } }>(
    `${CONSOLE_ASSETS_PATH}/:name`,
    { config: open, schema: { hide: true } },
    async (request, reply) => {
      const body = assets.get(request.params.name);
      if (!body) throw errors.notFound('console asset');
      return reply
        .type(ASSET_TYPES[request.params.name.split('.').pop()!]!)
        .header('cache-control', 'no-cache')
        .header('x-content-type-options', 'nosniff')
        .send(body);
    },
  );

  app.post<{ Body: Static<typeof SignIn> }>(
    `${CONSOLE_PATH}/session`,
    { config: open, schema: { hide: true, body: SignIn } },
    async (request, reply) => {
      // Login CSRF: another site must not sign this browser in with its own key. Browsers send these headers.
      const site = request.headers['sec-fetch-site'];
      if (site !== undefined && site !== 'same-origin' && site !== 'none')
        throw errors.forbidden('a same-origin sign-in');
      const { sessionToken, session } = await signInToConsole(runtime, request.body.key);
      reply.header('set-cookie', cookie(sessionToken, runtime.config.console.sessionTtlSeconds));
      return {
        signer: session.signer.kind,
        tenantId: session.signer.kind === 'key' ? session.signer.tenantId : null,
        expiresAt: session.expiresAt.toISOString(),
      };
    },
  );

  app.post(`${CONSOLE_PATH}/session/end`, { config: open, schema: { hide: true } }, async (request, reply) => {
    const { token, session } = await sessionOf(request);
    if (session) {
      const presented = request.headers[CSRF_HEADER];
      if (!csrfTokenMatches(session, typeof presented === 'string' ? presented : undefined))
        throw errors.forbidden(`the session's CSRF token in ${CSRF_HEADER}`);
      await signOutOfConsole(runtime, token);
    }
    return reply.header('set-cookie', cookie('', 0)).status(204).send();
  });
}
