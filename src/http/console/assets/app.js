// The console's screens, drawn from the path (/console/<screen>/<id>); every read and write goes through api.js.
import * as api from './api.js';
import { duration, el, money, time, zone } from './format.js';

const screen = document.getElementById('screen');
const isOperator = api.session.signer === 'admin';
const tenant = api.currentTenant();

/** A console link that keeps the operator's tenant. */
function href(path, params = {}) {
  const search = new URLSearchParams(params);
  if (isOperator && tenant) search.set('tenant', tenant);
  const s = search.toString();
  return `/console${path}${s ? `?${s}` : ''}`;
}
const link = (path, text, params) => el('a', { href: href(path, params) }, text);

function show(...nodes) {
  screen.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined));
}

/** What went wrong and what to do about it, in words. */
function errorBox(err, context) {
  const advice = {
    404: 'Check the id; an id of another tenant is not found either.',
    403: 'The key you signed in with lacks the scope this needs; sign in with a key that has it.',
    409: 'It changed meanwhile (already decided or finished); reload to see where it stands.',
    422: 'The service refused the request as it stands; the message says why.',
    429: 'Too many requests; wait a minute and reload.',
    503: 'The service cannot reach its database or Redis right now; reload in a few seconds.',
  }[err.status] ?? 'Reload the page; if it keeps failing, the request id in the service log tells what happened.';
  return el('div', { class: 'error', role: 'alert' }, el('strong', {}, `${context}: `), `${err.message} `, el('span', { class: 'code' }, err.code ?? ''), el('p', {}, advice),
    err.requestId ? el('p', { class: 'quiet' }, `request id ${err.requestId}`) : null);
}

function table(headers, rows, empty) {
  if (rows.length === 0) return el('p', { class: 'empty' }, empty);
  return el('table', {}, el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))), el('tbody', {}, rows));
}

function fields(pairs) {
  return el('dl', { class: 'fields' }, pairs.filter(Boolean).flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v ?? '—')]));
}

function lookup(label, placeholder, go) {
  const input = el('input', { name: 'id', placeholder, required: true, size: 40 });
  return el('form', { class: 'lookup', onsubmit: (e) => { e.preventDefault(); go(input.value.trim()); } }, el('label', {}, label, ' ', input), el('button', { type: 'submit' }, 'Open'));
}

function shortJson(value) {
  if (!value || typeof value !== 'object') return String(value ?? '');
  return Object.entries(value).map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`).join(', ');
}

/** The operator picks a tenant before any tenant screen; a tenant key has its own. */
async function needTenant() {
  if (!isOperator || tenant) return true;
  const heading = el('h1', {}, 'Choose a tenant');
  try {
    const { items } = await api.tenants();
    const here = location.pathname;
    show(heading, el('p', {}, 'You signed in as the operator. Tenant data is shown one tenant at a time; pick one:'),
      table(['Tenant', 'Name', 'Created'], items.map((t) => el('tr', {}, el('td', {}, el('a', { href: `${here}?tenant=${encodeURIComponent(t.tenantId)}` }, t.tenantId)), el('td', {}, t.name), el('td', {}, time(t.createdAt)))),
        'No tenants yet. Create one with POST /ops/tenants (see the API reference).'));
  } catch (err) {
    show(heading, errorBox(err, 'Could not list tenants'));
  }
  return false;
}

// ---- Escalation inbox -------------------------------------------------------------------------------------------

async function escalationsScreen() {
  const params = new URLSearchParams(location.search);
  const status = params.get('status') ?? 'pending';
  const cursor = params.get('cursor') ?? undefined;
  const heading = el('h1', {}, 'Escalations');
  const filter = el('nav', { class: 'filters' }, ['pending', 'approved', 'denied', 'all'].map((s) =>
    el('a', { href: href('/escalations', s === 'pending' ? {} : { status: s }), class: s === status ? 'current' : null }, s)));
  let page;
  try {
    page = await api.escalations({ status: status === 'all' ? undefined : status, cursor, limit: 50 });
  } catch (err) {
    return show(heading, filter, errorBox(err, 'Could not load escalations'));
  }
  const now = Date.now();
  const boxes = [];
  const rows = page.items.map((e) => {
    const pending = e.status === 'pending';
    const box = el('input', { type: 'checkbox', value: e.escalationId, 'aria-label': `select ${e.escalationId}`, disabled: !pending });
    if (pending) boxes.push(box);
    const waited = pending ? duration(now - Date.parse(e.createdAt)) : `${e.status}${e.resolution ? ` ${time(e.resolution.at)}` : ''}`;
    const left = e.deadlineAt ? (pending ? duration(Date.parse(e.deadlineAt) - now) : '—') : 'no deadline';
    return el('tr', { dataset: { escalationId: e.escalationId, status: e.status } },
      el('td', {}, box),
      el('td', {}, el('span', { class: 'mono' }, e.escalationId), el('div', { class: 'quiet' }, time(e.createdAt))),
      el('td', {}, waited),
      el('td', {}, left),
      el('td', { class: 'id' }, e.payerAgentId, el('div', { class: 'quiet' }, link(`/wallets/${encodeURIComponent(e.walletId)}`, `wallet ${e.walletId}`))),
      el('td', { class: 'id' }, e.payeeAgentId),
      el('td', { class: 'num' }, money(e.amount, e.currency)),
      el('td', {}, el('strong', {}, e.rule), el('div', { class: 'quiet' }, shortJson(e.details))),
      el('td', {}, link(`/gates/${encodeURIComponent(e.gateId)}`, 'gate'), e.resolution?.reason ? el('div', { class: 'quiet' }, `reason: ${e.resolution.reason}`) : null));
  });
  const all = el('input', { type: 'checkbox', 'aria-label': 'select all', onchange: (ev) => boxes.forEach((b) => { b.checked = ev.target.checked; }) });
  const reason = el('input', { name: 'reason', placeholder: 'Reason (recorded with the decision)', size: 50, maxlength: 2000 });
  const results = el('section', { id: 'results', 'aria-live': 'polite' });
  const decide = async (action) => {
    const ids = boxes.filter((b) => b.checked).map((b) => b.value);
    if (ids.length === 0) {
      results.replaceChildren(el('p', { class: 'notice' }, 'Select the escalations to decide first (the boxes on the left).'));
      return;
    }
    results.replaceChildren(el('p', { class: 'quiet' }, `${action === 'approve' ? 'Approving' : 'Denying'} ${ids.length}…`));
    let outcomes;
    try {
      outcomes = await api.resolveEscalations(ids, action, reason.value.trim());
    } catch (err) {
      return results.replaceChildren(errorBox(err, 'Could not decide'));
    }
    results.replaceChildren(el('h2', {}, 'Decisions'), el('ul', { class: 'outcomes' }, outcomes.map((o) => o.ok
      ? el('li', { dataset: { outcome: o.result.status, escalationId: o.escalationId } }, `${o.escalationId}: ${o.result.status}. `,
        o.result.escalationOverrideToken ? [
          'Give the payer this single-use override token (send it as escalationOverrideToken to authorize-payment',
          o.result.overrideExpiresAt ? `, before ${time(o.result.overrideExpiresAt)}` : '', '):',
          el('code', { class: 'token', 'data-override-token': o.escalationId }, o.result.escalationOverrideToken)] : null)
      : el('li', { class: 'error', dataset: { outcome: 'refused', escalationId: o.escalationId } }, `${o.escalationId}: refused — ${o.error.message}`))),
    el('p', {}, el('a', { href: location.pathname + location.search }, 'Reload the inbox')));
  };
  const actions = el('div', { class: 'actions' }, reason,
    el('button', { type: 'button', id: 'approve', onclick: () => decide('approve') }, 'Approve selected'),
    el('button', { type: 'button', id: 'deny', class: 'danger', onclick: () => decide('deny') }, 'Deny selected'));
  const empty = status === 'pending'
    ? 'Nothing is waiting. A payment that breaks a wallet policy (PUT /x402/wallets/{walletId}/policy) waits here for a person.'
    : `No ${status === 'all' ? '' : `${status} `}escalations.`;
  show(heading, filter,
    page.items.some((e) => e.status === 'pending') ? actions : null,
    table([all, 'Escalation', status === 'pending' ? 'Waiting' : 'Status', 'Time left', 'Payer', 'Payee', 'Amount', 'Policy', ''], rows, empty),
    page.nextCursor ? el('p', {}, link('/escalations', 'Next page →', { ...(status !== 'pending' ? { status } : {}), cursor: page.nextCursor })) : null,
    results);
}

// ---- Lists that wait for their routes, and lookups --------------------------------------------------------------

function lookupScreen(kind, title, noun, open) {
  const heading = el('h1', {}, title);
  const note = api.listRoutes[kind] ? null : el('p', { class: 'quiet' }, `This service version has no list of ${noun} yet; open one by its id.`);
  show(heading, note, lookup(`${noun[0].toUpperCase()}${noun.slice(1, -1)} id`, '…', (id) => location.assign(href(open(id)))));
}

// ---- Runs -------------------------------------------------------------------------------------------------------

async function runScreen(runId) {
  const heading = el('h1', {}, 'Run ', el('span', { class: 'mono' }, runId));
  let r;
  try {
    r = await api.run(runId);
  } catch (err) {
    return show(heading, errorBox(err, 'Could not load the run'));
  }
  const [settlement, verification, artifact] = await Promise.all([
    api.runSettlement(runId).catch((err) => (err.status === 404 ? null : err)),
    r.artifactId ? api.runVerification(runId).catch((err) => err) : null,
    r.artifactId ? api.artifact(r.artifactId).catch((err) => err) : null,
  ]);
  const sections = [heading, fields([
    ['Status', r.status], ['Verdict', r.verdict], ['Agent', r.agentId], ['Events', String(r.eventCount)],
    ['Created', time(r.createdAt)], ['Finalized', time(r.finalizedAt)], r.finalizeError && ['Finalize error', shortJson(r.finalizeError)],
    ['Terms', shortJson(r.terms)],
  ])];
  sections.push(el('h2', {}, 'Events'));
  if (artifact instanceof Error) sections.push(errorBox(artifact, 'Could not load the artifact'));
  else if (!artifact) sections.push(el('p', { class: 'empty' }, `The run has ${r.eventCount} events; they are shown here from its artifact once it is finalized (POST /v1/runs/${runId}/finalize).`));
  else sections.push(table(['Seq', 'Type', 'At', 'Chain hash', 'Signed by'], artifact.events.items.map((e) =>
    el('tr', {}, el('td', {}, String(e.seq)), el('td', {}, e.type), el('td', {}, time(e.at)), el('td', { class: 'mono' }, `${e.chainHash.slice(0, 16)}…`), el('td', { class: 'mono' }, e.signerKeyId))), 'No events.'));
  sections.push(el('h2', {}, 'Artifact and verification'));
  if (!r.artifactId) sections.push(el('p', { class: 'empty' }, 'No artifact until the run is finalized.'));
  else if (verification instanceof Error) sections.push(errorBox(verification, 'Could not verify'));
  else sections.push(fields([
    ['Artifact', el('a', { href: `/v1/verify/${encodeURIComponent(r.artifactId)}`, target: '_blank' }, r.artifactId)],
    ['Verified', el('span', { class: verification.verified ? 'ok' : 'bad' }, verification.verified ? 'yes: every check passed' : `no: ${verification.failures.join('; ')}`)],
    ['Checks', shortJson(verification.checks)], ['Hash', el('span', { class: 'mono' }, verification.artifactHash)], ['Signing key', verification.keyId],
  ]));
  sections.push(el('h2', {}, 'Settlement'));
  if (settlement instanceof Error) sections.push(errorBox(settlement, 'Could not load the settlement'));
  else if (!settlement) sections.push(el('p', { class: 'empty' }, 'Not settled. A finalized run with settlement terms is settled with POST /v1/runs/{runId}/settle.'));
  else {
    sections.push(settlementFields(settlement));
    sections.push(el('h2', {}, 'Ledger entries'));
    sections.push(await entriesOfSettlement(settlement));
  }
  sections.push(el('h2', {}, 'Webhook deliveries'));
  sections.push(el('p', {}, 'Deliveries are listed per endpoint: ', link('/webhooks', 'webhook endpoints'), '.'));
  show(...sections);
}

function settlementFields(s) {
  return fields([
    ['Settlement', el('span', { class: 'mono' }, s.settlementId)], ['Status', s.status], ['Amount', money(s.amount, s.currency)],
    ['Released', money(s.releasedAmount, s.currency)], ['Refunded', money(s.refundedAmount, s.currency)],
    ['Holdback', `${money(s.holdback, s.currency)} (${s.holdbackState})`],
    ['Payer wallet', link(`/wallets/${encodeURIComponent(s.payerWalletId)}`, s.payerWalletId)],
    ['Payee wallet', link(`/wallets/${encodeURIComponent(s.payeeWalletId)}`, s.payeeWalletId)],
    ['Dispute window ends', time(s.disputeWindowEndsAt)], ['Dispute', s.dispute ? `${s.dispute.status}: ${s.dispute.reason}` : 'none'],
    ['Decision', s.decision ? `${s.decision.verdict}${s.decision.reason ? ` (${s.decision.reason})` : ''}, ${time(s.decision.decidedAt)}` : '—'],
  ]);
}

/** The payer's and payee's postings whose entry names this settlement or its run (the latest page of each wallet). */
async function entriesOfSettlement(s) {
  try {
    const pages = await Promise.all([s.payerWalletId, s.payeeWalletId].map((w) => api.walletEntries(w).then((p) => p.items.map((i) => ({ ...i, walletId: w })))));
    const mine = pages.flat().filter((i) => i.entryId.includes(s.settlementId) || i.entryId.includes(s.runId)).sort((x, y) => Date.parse(y.at) - Date.parse(x.at));
    return entriesTable(mine, 'No postings of this settlement in the latest entries of its wallets; open the wallets for older ones.');
  } catch (err) {
    return errorBox(err, 'Could not load ledger entries');
  }
}

function entriesTable(items, empty) {
  return table(['At', 'Wallet', 'Kind', 'Bucket', 'Change', 'Balance after', 'Entry'], items.map((i) => el('tr', {},
    el('td', {}, time(i.at)), el('td', {}, i.walletId ? link(`/wallets/${encodeURIComponent(i.walletId)}`, i.walletId) : '—'), el('td', {}, i.kind), el('td', {}, i.bucket),
    el('td', { class: `num ${i.delta < 0 ? 'bad' : 'ok'}` }, money(i.delta, i.currency)), el('td', { class: 'num' }, money(i.balanceAfter, i.currency)), el('td', { class: 'mono' }, i.entryId))), empty);
}

async function settlementLookupScreen() {
  const heading = el('h1', {}, 'Settlements');
  const runId = new URLSearchParams(location.search).get('run');
  const form = lookup('Run id', 'run_…', (id) => location.assign(href('/settlements', { run: id })));
  if (!runId) return show(heading, el('p', { class: 'quiet' }, 'This service version has no list of settlements yet; a settlement is found by its run.'), form);
  try {
    const s = await api.runSettlement(runId);
    show(heading, form, el('p', {}, 'Run ', link(`/runs/${encodeURIComponent(runId)}`, runId)), settlementFields(s));
  } catch (err) {
    show(heading, form, err.status === 404 ? el('p', { class: 'empty' }, `Run ${runId} has no settlement (or no such run in this tenant).`) : errorBox(err, 'Could not load the settlement'));
  }
}

// ---- Gates ------------------------------------------------------------------------------------------------------

async function gateScreen(gateId) {
  const heading = el('h1', {}, 'Gate ', el('span', { class: 'mono' }, gateId));
  let g;
  try {
    g = await api.gate(gateId);
  } catch (err) {
    return show(heading, errorBox(err, 'Could not load the gate'));
  }
  show(heading, fields([
    ['Status', el('strong', { 'data-gate-status': g.status }, g.status)], ['Payer', g.payerAgentId], ['Payee', g.payeeAgentId],
    ['Amount', money(g.amount, g.currency)], ['Holdback', `${g.holdbackBps / 100}%`], ['Tool', g.toolId],
    ['Escrow wallet', link(`/wallets/${encodeURIComponent(g.escrowWalletId)}`, g.escrowWalletId)], ['Created', time(g.createdAt)],
    ['Quote', g.quote ? `${g.quote.quoteId} (${g.quote.status}, expires ${time(g.quote.expiresAt)})` : 'none'],
    ['Authorization', g.authorization ? `${g.authorization.authorizationRef}, expires ${time(g.authorization.expiresAt)}` : 'none'],
    ['Verification', g.verification ? shortJson(g.verification) : 'none'],
    ['Settlement', g.settlement ? shortJson(g.settlement) : 'none'], ['Decision', g.decision ? shortJson(g.decision) : 'none'],
  ]), el('p', {}, link('/escalations', 'Escalations of this tenant', { status: 'all' })));
}

// ---- Wallets ----------------------------------------------------------------------------------------------------

async function walletScreen(walletId) {
  const heading = el('h1', {}, 'Wallet ', el('span', { class: 'mono' }, walletId));
  const cursor = new URLSearchParams(location.search).get('cursor') ?? undefined;
  let w;
  let entries;
  try {
    [w, entries] = await Promise.all([api.wallet(walletId), api.walletEntries(walletId, cursor)]);
  } catch (err) {
    return show(heading, errorBox(err, 'Could not load the wallet'));
  }
  const policy = await api.walletPolicy(walletId).catch(() => null);
  const balances = Object.entries(w.balances);
  show(heading, fields([['Kind', w.kind], ['Created', time(w.createdAt)], ['Policy', policy ? shortJson({ currency: policy.currency, perCallLimit: policy.perCallLimit, dailyLimit: policy.dailyLimit }) : 'none']]),
    el('h2', {}, 'Balances'),
    table(['Currency', 'Available', 'Held in reserves (escrow)'], balances.map(([cur, b]) => el('tr', {}, el('td', {}, cur), el('td', { class: 'num', 'data-available': cur }, money(b.available, cur)), el('td', { class: 'num' }, money(b.escrow, cur)))),
      'No money yet. An operator credits a wallet with POST /ops/wallets/{walletId}/credit.'),
    el('h2', {}, 'Entries'),
    entriesTable(entries.items, 'No entries yet.'),
    entries.nextCursor ? el('p', {}, link(`/wallets/${encodeURIComponent(walletId)}`, 'Older entries →', { cursor: entries.nextCursor })) : null);
}

// ---- Webhooks ---------------------------------------------------------------------------------------------------

async function webhooksScreen() {
  const heading = el('h1', {}, 'Webhook endpoints');
  const cursor = new URLSearchParams(location.search).get('cursor') ?? undefined;
  let page;
  try {
    page = await api.list('webhooks', { cursor });
  } catch (err) {
    return show(heading, errorBox(err, 'Could not list webhook endpoints'));
  }
  show(heading, table(['Endpoint', 'URL', 'Status', 'Events', 'Last success', 'Failing since'], page.items.map((e) => el('tr', {},
    el('td', {}, link(`/webhooks/${encodeURIComponent(e.id)}`, e.id)), el('td', { class: 'mono' }, e.url), el('td', {}, e.status, e.disabledReason ? el('div', { class: 'quiet' }, e.disabledReason) : null),
    el('td', {}, e.events.join(', ')), el('td', {}, time(e.lastSuccessAt)), el('td', { class: e.failingSince ? 'bad' : null }, time(e.failingSince)))),
  'No endpoints. Register one with POST /v1/webhooks (scope webhooks:write) to receive events.'),
  page.nextCursor ? el('p', {}, link('/webhooks', 'Next page →', { cursor: page.nextCursor })) : null);
}

async function endpointScreen(endpointId) {
  const heading = el('h1', {}, 'Endpoint ', el('span', { class: 'mono' }, endpointId));
  const params = new URLSearchParams(location.search);
  const status = params.get('status') ?? undefined;
  let endpoint;
  let page;
  try {
    [endpoint, page] = await Promise.all([api.webhookEndpoint(endpointId), api.deliveries(endpointId, { status, cursor: params.get('cursor') ?? undefined })]);
  } catch (err) {
    return show(heading, errorBox(err, 'Could not load the endpoint'));
  }
  const results = el('section', { 'aria-live': 'polite' });
  const resend = async (delivery) => {
    try {
      await api.resendDelivery(endpointId, delivery.id);
      results.replaceChildren(el('p', { class: 'ok' }, `Delivery ${delivery.id} is being sent again.`));
    } catch (err) {
      results.replaceChildren(errorBox(err, `Could not resend ${delivery.id}`));
    }
  };
  show(heading, fields([['URL', el('span', { class: 'mono' }, endpoint.url)], ['Status', endpoint.status], ['Events', endpoint.events.join(', ')], ['Last success', time(endpoint.lastSuccessAt)], ['Failing since', time(endpoint.failingSince)]]),
    el('nav', { class: 'filters' }, ['all', 'pending', 'succeeded', 'failed', 'abandoned'].map((s) => el('a', { href: href(`/webhooks/${encodeURIComponent(endpointId)}`, s === 'all' ? {} : { status: s }), class: (status ?? 'all') === s ? 'current' : null }, s))),
    api.resendDelivery ? null : el('p', { class: 'quiet' }, 'Resending one delivery arrives with the delivery-replay API; until then a disabled endpoint replays what it missed when enabled (POST /v1/webhooks/{endpointId}/enable).'),
    table(['Delivery', 'Event', 'Status', 'Attempts', 'Last error', 'Next attempt', 'Created', ''], page.items.map((d) => el('tr', { dataset: { deliveryId: d.id, status: d.status } },
      el('td', { class: 'mono' }, d.id), el('td', {}, d.eventType, el('div', { class: 'quiet mono' }, d.eventId)), el('td', { class: d.status === 'failed' ? 'bad' : d.status === 'succeeded' ? 'ok' : null }, d.status),
      el('td', { class: 'num' }, String(d.attemptCount)), el('td', {}, d.lastError ?? '—'), el('td', {}, time(d.nextAttemptAt)), el('td', {}, time(d.createdAt)),
      el('td', {}, api.resendDelivery && d.status !== 'pending' ? el('button', { type: 'button', class: 'resend', onclick: () => resend(d) }, 'Resend') : null))),
    'No deliveries yet. Deliveries appear when an event this endpoint subscribes to happens.'),
    page.nextCursor ? el('p', {}, link(`/webhooks/${encodeURIComponent(endpointId)}`, 'Older deliveries →', { ...(status ? { status } : {}), cursor: page.nextCursor })) : null,
    results);
}

// ---- Operator: tenants ------------------------------------------------------------------------------------------

async function tenantsScreen() {
  const heading = el('h1', {}, 'Tenants');
  try {
    const { items } = await api.tenants();
    show(heading, el('p', {}, 'Open a tenant to see its escalations, runs, gates, wallets and webhooks.'),
      table(['Tenant', 'Name', 'Rate limit', 'Created'], items.map((t) => el('tr', {},
        el('td', {}, el('a', { href: `/console/escalations?tenant=${encodeURIComponent(t.tenantId)}` }, t.tenantId)), el('td', {}, t.name),
        el('td', {}, t.rateLimit ? `${t.rateLimit.limit} / ${t.rateLimit.windowSeconds}s` : 'default'), el('td', {}, time(t.createdAt)))),
      'No tenants yet. Create one with POST /ops/tenants.'));
  } catch (err) {
    show(heading, errorBox(err, 'Could not list tenants'));
  }
}

// ---- Routing ----------------------------------------------------------------------------------------------------

async function route() {
  const [, , screenName = 'escalations', rawId] = location.pathname.split('/');
  const id = rawId ? decodeURIComponent(rawId) : null;
  document.querySelectorAll('[data-nav]').forEach((a) => {
    if (a.getAttribute('href') !== '/console/tenants') a.href = href(a.getAttribute('href').replace(/^\/console/, ''));
    if (a.pathname === `/console/${screenName}`) a.classList.add('current');
  });
  if (screenName === 'tenants') return isOperator ? tenantsScreen() : show(el('p', { class: 'error' }, 'Only the operator (the admin key) sees the tenants.'));
  if (!(await needTenant())) return;
  switch (screenName) {
    case 'escalations': return escalationsScreen();
    case 'runs': return id ? runScreen(id) : lookupScreen('runs', 'Runs', 'runs', (v) => `/runs/${encodeURIComponent(v)}`);
    case 'gates': return id ? gateScreen(id) : lookupScreen('gates', 'Gates', 'gates', (v) => `/gates/${encodeURIComponent(v)}`);
    case 'settlements': return settlementLookupScreen();
    case 'wallets': return id ? walletScreen(id) : lookupScreen('wallets', 'Wallets', 'wallets', (v) => `/wallets/${encodeURIComponent(v)}`);
    case 'webhooks': return id ? endpointScreen(id) : webhooksScreen();
    default: return show(el('p', { class: 'error' }, 'No such screen. '), link('/escalations', 'Go to the escalation inbox'));
  }
}

document.getElementById('who').textContent = isOperator
  ? `operator${tenant ? ` · tenant ${tenant}` : ''} · times in ${zone}`
  : `tenant ${api.session.tenantId} · key ${api.session.keyId} · times in ${zone}`;
document.getElementById('sign-out').addEventListener('click', async () => {
  await api.signOut().catch(() => undefined);
  location.assign('/console');
});
route().catch((err) => show(errorBox(err, 'Something failed')));
