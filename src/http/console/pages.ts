// The console's two HTML pages: the sign-in form and the shell every screen renders into. Both are static apart
// from what the session says about the signer (escaped); the screens are drawn in the browser by the ES modules in
// ./assets/, which read the API with the session cookie, so the pages never carry data a session could not read.
import { BULL_BOARD_PATH } from '../plugins/bull-board.ts';

export const CONSOLE_PATH = '/console';
export const CONSOLE_ASSETS_PATH = `${CONSOLE_PATH}/assets`;

/** No inline script or style, nothing from another origin, never inside a frame. */
export const CONSOLE_CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

function escapeHtml(value: string): string {
  return value.replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!,
  );
}

function head(title: string): string {
  return `<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>${escapeHtml(title)} · Agent Run Settlement console</title>
  <link rel="stylesheet" href="${CONSOLE_ASSETS_PATH}/console.css">`;
}

/**
 * The sign-in form; `notice` says why it is shown (a session that ended, a key refused). Its button is enabled by
 * sign-in.js once it handles the submit: before that, a submit would be the browser's own, and a GET form puts the
 * key in the URL (and so in the access log). It posts, so even then the key travels in a body.
 */
export function signInPage(notice: string | null): string {
  return `${head('Sign in')}
  <script type="module" src="${CONSOLE_ASSETS_PATH}/sign-in.js"></script>
</head>
<body class="sign-in">
  <main>
    <h1>Agent Run Settlement console</h1>
    <p>Sign in with the admin key (the operator: every tenant) or a tenant's API key with a read scope
      (<code>runs:read</code>, <code>x402:read</code> or <code>wallets:read</code>; that tenant only).
      The key is sent once; the browser keeps only a session cookie.</p>
    <p id="notice" class="notice" role="alert"${notice ? '' : ' hidden'}>${notice ? escapeHtml(notice) : ''}</p>
    <form id="sign-in" method="post">
      <label for="key">Key</label>
      <input id="key" name="key" type="password" autocomplete="off" required placeholder="sk_… or the admin key">
      <button type="submit" disabled>Sign in</button>
    </form>
    <p class="quiet">No key? An operator issues one with <code>POST /ops/api-keys</code>; see <a href="/docs">the API reference</a>.</p>
  </main>
</body>
</html>
`;
}

export interface ShellContext {
  signer: 'admin' | 'key';
  tenantId: string | null;
  keyId: string | null;
  scopes: string[];
  csrfToken: string;
  expiresAt: string;
}

/**
 * The shell of every screen: navigation, and what the modules need to know about the session, in meta tags. Sign out
 * is enabled by app.js once it handles the click (a click before would do nothing).
 */
export function shellPage(ctx: ShellContext): string {
  const meta = (name: string, value: string) => `  <meta name="console-${name}" content="${escapeHtml(value)}">`;
  return `${head('Console')}
${meta('csrf', ctx.csrfToken)}
${meta('signer', ctx.signer)}
${meta('tenant', ctx.tenantId ?? '')}
${meta('key', ctx.keyId ?? '')}
${meta('scopes', ctx.scopes.join(' '))}
${meta('expires', ctx.expiresAt)}
  <script type="module" src="${CONSOLE_ASSETS_PATH}/app.js"></script>
</head>
<body>
  <header>
    <a class="brand" href="${CONSOLE_PATH}">Settlement console</a>
    <nav id="nav">
      <a href="${CONSOLE_PATH}/escalations" data-nav>Escalations</a>
      <a href="${CONSOLE_PATH}/runs" data-nav>Runs</a>
      <a href="${CONSOLE_PATH}/agents" data-nav>Agents</a>
      <a href="${CONSOLE_PATH}/gates" data-nav>Gates</a>
      <a href="${CONSOLE_PATH}/sessions" data-nav>Sessions</a>
      <a href="${CONSOLE_PATH}/settlements" data-nav>Settlements</a>
      <a href="${CONSOLE_PATH}/disputes" data-nav>Disputes</a>
      <a href="${CONSOLE_PATH}/wallets" data-nav>Wallets</a>
      <a href="${CONSOLE_PATH}/webhooks" data-nav>Webhooks</a>
      ${ctx.signer === 'admin' ? `<a href="${CONSOLE_PATH}/tenants" data-nav>Tenants</a>\n      <a href="${BULL_BOARD_PATH}" target="_blank" rel="noopener" title="Bull Board: the job queues">Queues</a>` : ''}
      <a href="/docs" target="_blank" rel="noopener">API reference</a>
    </nav>
    <span id="who" class="who"></span>
    <button id="sign-out" type="button" disabled>Sign out</button>
  </header>
  <main id="screen" aria-live="polite"><p class="quiet">Loading…</p></main>
</body>
</html>
`;
}
