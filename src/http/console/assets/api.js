// The console's only door to data: every screen reads and writes through these functions, which call the service's
// own API routes with the session cookie (the auth plugin checks them as for the key that signed in).

const meta = (name) => document.querySelector(`meta[name="console-${name}"]`)?.content ?? '';

export const session = {
  signer: meta('signer'),
  tenantId: meta('tenant') || null,
  keyId: meta('key') || null,
  scopes: meta('scopes').split(' ').filter(Boolean),
  expiresAt: meta('expires'),
};

/** The tenant a console URL names (`?tenant=`, how the operator picks one); else a tenant key's own tenant. */
const namedTenant = new URLSearchParams(location.search).get('tenant');
export function currentTenant() {
  return namedTenant ?? (session.signer === 'admin' ? null : session.tenantId);
}

export class ApiError extends Error {
  constructor(status, body) {
    // The contract's error body: {code, message, requestId, details}.
    super(body?.message ?? `the service answered ${status}`);
    this.status = status;
    this.code = body?.code ?? `HTTP_${status}`;
    this.requestId = body?.requestId ?? null;
    this.details = body?.details ?? null;
  }
}

async function call(method, path, body) {
  const headers = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET') headers['x-csrf-token'] = meta('csrf');
  // The service checks the tenant a URL names: the operator's choice, or for a tenant key its own (another: 404).
  if (namedTenant && !path.startsWith('/ops/')) headers['x-console-tenant'] = namedTenant;
  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
  });
  if (res.status === 401) {
    // The session ended: the page itself answers with the sign-in form.
    location.assign(location.pathname + location.search);
    throw new ApiError(401, { code: 'UNAUTHENTICATED', message: 'your session ended; sign in again' });
  }
  const text = await res.text();
  const json = text ? JSON.parse(text) : null;
  if (!res.ok) throw new ApiError(res.status, json);
  return json;
}

const q = (params) => {
  const s = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ''));
  return s.size ? `?${s}` : '';
};
const id = encodeURIComponent;

/** The kinds the service lists with cursors (GET /v1/<kind> for a tenant key, GET /ops/<kind>?tenantId= for the operator). */
export const LIST_KINDS = ['runs', 'agents', 'settlements', 'disputes', 'gates', 'escalations', 'sessions'];

/** Lists by their route, `{items, nextCursor}` each; the operator reads a tenant's through /ops with `tenantId`. */
export const listRoutes = {
  ...Object.fromEntries(LIST_KINDS.map((kind) => [kind, session.signer === 'admin' ? `/ops/${kind}` : `/v1/${kind}`])),
  webhooks: '/v1/webhooks',
};

/** One page of a list: filters `status`, `agentId`, `createdAfter`, `createdBefore`, `limit`, and the `cursor`. */
export function list(kind, params = {}) {
  const route = listRoutes[kind];
  if (!route) throw new Error(`no list route for ${kind}`);
  const tenantId = route.startsWith('/ops/') ? currentTenant() : undefined;
  return call('GET', route + q({ ...params, tenantId }));
}

export const tenants = () => call('GET', '/ops/tenants?limit=200');

export const escalations = (params) => list('escalations', params);

/**
 * Approves or denies the escalations with one reason, in one call of the bulk route (the operator's under /ops).
 * The answer says per id what happened: approved, denied, already_decided, deadline_passed or not_found; a stale
 * decision changes nothing.
 */
export async function resolveEscalations(ids, action, reason) {
  const path = session.signer === 'admin' ? '/ops/x402/escalations/resolve' : '/x402/gate/escalations/resolve';
  const { results } = await call('POST', path, { action, reason, escalationIds: ids });
  return results;
}

export const run = (runId) => call('GET', `/v1/runs/${id(runId)}`);
export const artifact = (artifactId) => call('GET', `/v1/artifacts/${id(artifactId)}`);
export const runVerification = (runId) => call('GET', `/runs/${id(runId)}/verification`);
export const runSettlement = (runId) => call('GET', `/runs/${id(runId)}/settlement`);
export const runDeliveries = (runId) => call('GET', `/v1/runs/${id(runId)}/deliveries`);
export const gate = (gateId) => call('GET', `/x402/gate/${id(gateId)}`);
export const wallet = (walletId) => call('GET', `/v1/wallets/${id(walletId)}`);
export const walletEntries = (walletId, cursor) =>
  call('GET', `/v1/wallets/${id(walletId)}/entries${q({ limit: 50, cursor })}`);
export const walletPolicy = (walletId) => call('GET', `/x402/wallets/${id(walletId)}/policy`);
export const webhookEndpoint = (endpointId) => call('GET', `/v1/webhooks/${id(endpointId)}`);
export const deliveries = (endpointId, params = {}) =>
  call('GET', `/v1/webhooks/${id(endpointId)}/deliveries${q({ limit: 50, ...params })}`);

/** Sends one delivery again: the same event id and body, a new attempt (202; scope webhooks:write). */
export const resendDelivery = (endpointId, deliveryId) =>
  call('POST', `/v1/webhooks/${id(endpointId)}/deliveries/${id(deliveryId)}/resend`);
/** Sends a webhook.test event to this endpoint alone (202 `{eventId, deliveryId, status}`). */
export const sendTestEvent = (endpointId) => call('POST', `/v1/webhooks/${id(endpointId)}/test`);
/** Starts sending every failed or abandoned delivery since `since` again (202, a recovery with its progress). */
export const recoverDeliveries = (endpointId, since) =>
  call('POST', `/v1/webhooks/${id(endpointId)}/recoveries`, { since });
export const recovery = (endpointId, recoveryId) =>
  call('GET', `/v1/webhooks/${id(endpointId)}/recoveries/${id(recoveryId)}`);
export const paymentSession = (sessionId) => call('GET', `/x402/sessions/${id(sessionId)}`);
/** A session's charges, newest first, a page at a time (open or closed; voided debits included). */
export const sessionCharges = (sessionId, cursor) =>
  call('GET', `/x402/sessions/${id(sessionId)}/charges${q({ limit: 50, cursor })}`);
/** A closed session's signed statement (409 while it is open). */
export const sessionStatement = (sessionId) => call('GET', `/x402/sessions/${id(sessionId)}/statement`);

export const signOut = () => call('POST', '/console/session/end');
