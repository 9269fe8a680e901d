// The console's only door to data: every screen reads and writes through these functions, which call the service's
// own API routes with the session cookie (the auth plugin checks them as for the key that signed in). When a route
// lands (cursor lists, bulk decisions, resend), it is added here and the screens pick it up.

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
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: 'same-origin' });
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

/**
 * Lists by their route, `{items, nextCursor}` each; null where the service has no list route yet (the screen then
 * offers a lookup by id instead).
 */
export const listRoutes = {
  escalations: '/x402/gate/escalations',
  webhooks: '/v1/webhooks',
  runs: null,
  gates: null,
  settlements: null,
  agents: null,
  disputes: null,
  sessions: null,
};

export function list(kind, params = {}) {
  const route = listRoutes[kind];
  if (!route) throw new Error(`no list route for ${kind}`);
  return call('GET', route + q(params));
}

export const tenants = () => call('GET', '/ops/tenants?limit=200');

export const escalations = (params) => list('escalations', params);

/**
 * Approves or denies each escalation with one reason; one call per escalation until a bulk route exists. Every
 * outcome is reported, refusals included (an escalation already decided says so and changes nothing).
 */
export async function resolveEscalations(ids, action, reason) {
  const outcomes = [];
  for (const escalationId of ids) {
    try {
      const r = await call('POST', `/x402/gate/escalations/${id(escalationId)}/resolve`, { action, ...(reason ? { reason } : {}) });
      outcomes.push({ escalationId, ok: true, result: r });
    } catch (err) {
      if (err.status === 401) throw err;
      outcomes.push({ escalationId, ok: false, error: err });
    }
  }
  return outcomes;
}

export const run = (runId) => call('GET', `/v1/runs/${id(runId)}`);
export const artifact = (artifactId) => call('GET', `/v1/artifacts/${id(artifactId)}`);
export const runVerification = (runId) => call('GET', `/runs/${id(runId)}/verification`);
export const runSettlement = (runId) => call('GET', `/runs/${id(runId)}/settlement`);
export const gate = (gateId) => call('GET', `/x402/gate/${id(gateId)}`);
export const wallet = (walletId) => call('GET', `/v1/wallets/${id(walletId)}`);
export const walletEntries = (walletId, cursor) => call('GET', `/v1/wallets/${id(walletId)}/entries${q({ limit: 50, cursor })}`);
export const walletPolicy = (walletId) => call('GET', `/x402/wallets/${id(walletId)}/policy`);
export const webhookEndpoint = (endpointId) => call('GET', `/v1/webhooks/${id(endpointId)}`);
export const deliveries = (endpointId, params = {}) => call('GET', `/v1/webhooks/${id(endpointId)}/deliveries${q({ limit: 50, ...params })}`);

/** Sends one delivery again (202; scope webhooks:write). */
export const resendDelivery = (endpointId, deliveryId) => call('POST', `/v1/webhooks/${id(endpointId)}/deliveries/${id(deliveryId)}/resend`);

export const signOut = () => call('POST', '/console/session/end');
