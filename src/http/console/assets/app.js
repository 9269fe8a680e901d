// The console's screens, drawn from the path (/console/<screen>/<id>); every read and write goes through api.js.
import * as api from './api.js';
import {
  breach,
  duration,
  el,
  fromLocalInput,
  localInput,
  money,
  payloadSummary,
  policyRules,
  termsText,
  time,
  zone,
} from './format.js';

const screen = document.getElementById('screen');
// First, so nothing below can leave the button dead (the page serves it disabled until this handles it).
const signOutButton = document.getElementById('sign-out');
signOutButton.addEventListener('click', async () => {
  await api.signOut().catch(() => undefined);
  location.assign('/console');
});
signOutButton.disabled = false;
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

/** Replaces what `node` shows; null and undefined children are left out (replaceChildren would print "null"). */
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((n) => n !== null && n !== undefined && n !== false));
}
const show = (...nodes) => fill(screen, ...nodes);

/** What went wrong and what to do about it, in words. */
function errorBox(err, context) {
  const advice =
    {
      404: 'Check the id; an id of another tenant is not found either.',
      403: 'The key you signed in with lacks the scope this needs; sign in with a key that has it.',
      409: 'It changed meanwhile (already decided or finished); reload to see where it stands.',
      422: 'The service refused the request as it stands; the message says why.',
      429: 'Too many requests; wait a minute and reload.',
      503: 'The service cannot reach its database or Redis right now; reload in a few seconds.',
    }[err.status] ?? 'Reload the page; if it keeps failing, the request id in the service log tells what happened.';
  return el(
    'div',
    { class: 'error', role: 'alert' },
    el('strong', {}, `${context}: `),
    `${err.message} `,
    el('span', { class: 'code' }, err.code ?? ''),
    el('p', {}, advice),
    err.requestId ? el('p', { class: 'quiet' }, `request id ${err.requestId}`) : null,
  );
}

function table(headers, rows, empty) {
  if (rows.length === 0) return el('p', { class: 'empty' }, empty);
  return el(
    'table',
    {},
    el(
      'thead',
      {},
      el(
        'tr',
        {},
        headers.map((h) => el('th', {}, h)),
      ),
    ),
    el('tbody', {}, rows),
  );
}

function fields(pairs) {
  return el(
    'dl',
    { class: 'fields' },
    pairs.filter(Boolean).flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v ?? '—')]),
  );
}

function lookup(label, placeholder, go) {
  const input = el('input', { name: 'id', placeholder, required: true, size: 40 });
  return el(
    'form',
    {
      class: 'lookup',
      onsubmit: (e) => {
        e.preventDefault();
        go(input.value.trim());
      },
    },
    el('label', {}, label, ' ', input),
    el('button', { type: 'submit' }, 'Open'),
  );
}

function shortJson(value) {
  if (!value || typeof value !== 'object') return String(value ?? '');
  return Object.entries(value)
    .map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`)
    .join(', ');
}

/** The operator picks a tenant before any tenant screen; a tenant key has its own. */
async function needTenant() {
  if (!isOperator || tenant) return true;
  const heading = el('h1', {}, 'Choose a tenant');
  try {
    const { items } = await api.tenants();
    const here = location.pathname;
    show(
      heading,
      el('p', {}, 'You signed in as the operator. Tenant data is shown one tenant at a time; pick one:'),
      table(
        ['Tenant', 'Name', 'Created'],
        items.map((t) =>
          el(
            'tr',
            {},
            el('td', {}, el('a', { href: `${here}?tenant=${encodeURIComponent(t.tenantId)}` }, t.tenantId)),
            el('td', {}, t.name),
            el('td', {}, time(t.createdAt)),
          ),
        ),
        'No tenants yet. Create one with POST /ops/tenants (see the API reference).',
      ),
    );
  } catch (err) {
    show(heading, errorBox(err, 'Could not list tenants'));
  }
  return false;
}

// ---- Lists: filters in the URL, a page at a time, "More" appends the next ------------------------------------

const PAGE_SIZE = 25;
const STATUSES = {
  runs: ['in_progress', 'finalizing', 'finalized'],
  agents: ['active', 'wound_down', 'frozen'],
  settlements: ['pending', 'completed', 'held', 'refunded', 'disputed', 'partially_refunded'],
  disputes: ['open', 'resolving', 'resolved'],
  gates: ['unfunded', 'held', 'authorized', 'settling', 'released', 'refunded', 'cancelled', 'expired'],
  escalations: ['pending', 'approved', 'denied'],
  sessions: ['open', 'closing', 'closed', 'expired', 'wound_down', 'unfunded'],
};

/** Where a settlement's or dispute's subject lives in the console: a run, a gate or a payment session. */
function subjectLink(subjectId) {
  // A session's payee is paid through a settlement of its own, `sst_<session id without ses_>_<payee index>`.
  const session = /^sst_(.+)_\d+$/.exec(subjectId);
  if (session) return link(`/sessions/ses_${encodeURIComponent(session[1])}`, `ses_${session[1]}`);
  const target = subjectId.startsWith('run_')
    ? 'runs'
    : subjectId.startsWith('gate_')
      ? 'gates'
      : subjectId.startsWith('ses_')
        ? 'sessions'
        : null;
  return target
    ? link(`/${target}/${encodeURIComponent(subjectId)}`, subjectId)
    : el('span', { class: 'mono' }, subjectId);
}
const walletLink = (walletId) => link(`/wallets/${encodeURIComponent(walletId)}`, walletId);
const agentRunsLink = (agentId) => link('/runs', agentId, { agentId });

/** Each list's columns: a header and a cell of an item (text or nodes); `num` right-aligns. */
const LISTS = {
  runs: {
    title: 'Runs',
    noun: 'runs',
    idOf: (r) => r.runId,
    empty: 'No runs. An agent starts one with POST /v1/runs (see the API reference).',
    columns: [
      ['Run', (r) => link(`/runs/${encodeURIComponent(r.runId)}`, r.runId)],
      ['Status', (r) => r.status],
      ['Verdict', (r) => r.verdict ?? '—'],
      ['Agent', (r) => agentRunsLink(r.agentId)],
      ['Events', (r) => String(r.eventCount), true],
      ['Created', (r) => time(r.createdAt)],
      ['Finalized', (r) => time(r.finalizedAt)],
    ],
  },
  agents: {
    title: 'Agents',
    noun: 'agents',
    idOf: (a) => a.agentId,
    empty: 'No agents. Register one with POST /v1/agents (scope agents:write).',
    columns: [
      ['Agent', (a) => el('span', { class: 'mono' }, a.agentId)],
      ['Name', (a) => a.displayName ?? '—'],
      ['Status', (a) => a.status],
      ['Keys', (a) => `${a.keys.filter((k) => k.status === 'active').length} active of ${a.keys.length}`],
      ['Created', (a) => time(a.createdAt)],
      [
        '',
        (a) => [link('/runs', 'runs', { agentId: a.agentId }), ' · ', link('/gates', 'gates', { agentId: a.agentId })],
      ],
    ],
  },
  settlements: {
    title: 'Settlements',
    noun: 'settlements',
    idOf: (s) => s.settlementId,
    empty:
      'No settlements. A finalized run is settled with POST /v1/runs/{runId}/settle; a verified gate settles by itself.',
    columns: [
      ['Settlement', (s) => el('span', { class: 'mono' }, s.settlementId)],
      ['Of', (s) => subjectLink(s.runId)],
      ['Status', (s) => s.status],
      ['Amount', (s) => money(s.amount, s.currency), true],
      ['Released', (s) => money(s.releasedAmount, s.currency), true],
      ['Refunded', (s) => money(s.refundedAmount, s.currency), true],
      ['Payer', (s) => walletLink(s.payerWalletId)],
      ['Payee', (s) => walletLink(s.payeeWalletId)],
      ['Dispute', (s) => (s.dispute ? `${s.dispute.status}: ${s.dispute.reason}` : '—')],
    ],
  },
  disputes: {
    title: 'Disputes',
    noun: 'disputes',
    idOf: (d) => d.disputeId,
    empty: 'No disputes. A payer opens one within the dispute window of a settlement.',
    columns: [
      ['Dispute', (d) => el('span', { class: 'mono' }, d.disputeId)],
      ['Status', (d) => d.status],
      ['Reason', (d) => d.reason],
      ['Frozen', (d) => money(d.frozenAmount, d.currency), true],
      ['Of', (d) => subjectLink(d.runId)],
      ['Opened', (d) => time(d.openedAt)],
      [
        'Outcome',
        (d) =>
          d.outcome
            ? `${d.outcome} (payer ${money(d.toPayer, d.currency)}, payee ${money(d.toPayee, d.currency)})`
            : '—',
      ],
    ],
  },
  gates: {
    title: 'Gates',
    noun: 'gates',
    idOf: (g) => g.gateId,
    empty: 'No gates. A provider creates one per paid call with POST /x402/gate/create.',
    columns: [
      ['Gate', (g) => link(`/gates/${encodeURIComponent(g.gateId)}`, g.gateId)],
      ['Status', (g) => g.status],
      ['Payer', (g) => g.payerAgentId],
      ['Payee', (g) => g.payeeAgentId],
      ['Amount', (g) => money(g.amount, g.currency), true],
      ['Tool', (g) => g.toolId ?? '—'],
      ['Created', (g) => time(g.createdAt)],
    ],
  },
  sessions: {
    title: 'Payment sessions',
    noun: 'sessions',
    idOf: (s) => s.sessionId,
    empty: 'No payment sessions. A payer opens one with POST /x402/sessions.',
    columns: [
      ['Session', (s) => link(`/sessions/${encodeURIComponent(s.sessionId)}`, s.sessionId)],
      ['Status', (s) => s.status],
      ['Payer', (s) => s.payerAgentId],
      ['Budget', (s) => money(s.budget, s.currency), true],
      ['Spent', (s) => money(s.spent, s.currency), true],
      ['Charges', (s) => String(s.charges), true],
      ['Expires', (s) => time(s.expiresAt)],
      ['Created', (s) => time(s.createdAt)],
    ],
  },
};

/** The filters a list URL carries; `status=all` (or none, for a list without a default) means any. */
function listFilters(defaultStatus) {
  const params = new URLSearchParams(location.search);
  const status = params.get('status') ?? defaultStatus ?? 'all';
  const limit = Number(params.get('limit'));
  return {
    status,
    agentId: params.get('agentId') ?? '',
    createdAfter: params.get('createdAfter') ?? '',
    createdBefore: params.get('createdBefore') ?? '',
    limit: Number.isInteger(limit) && limit > 0 ? limit : PAGE_SIZE,
  };
}

/** The search form of a list: status, agent, created between; submitting puts the filters in the URL. */
function filterForm(kind, filters, defaultStatus) {
  const status = el(
    'select',
    { name: 'status' },
    ['all', ...STATUSES[kind]].map((s) =>
      el('option', { value: s, selected: s === filters.status }, s === 'all' ? 'any status' : s),
    ),
  );
  const agentId = el('input', { name: 'agentId', value: filters.agentId, placeholder: 'agent id', size: 24 });
  const after = el('input', { name: 'createdAfter', type: 'datetime-local', value: localInput(filters.createdAfter) });
  const before = el('input', {
    name: 'createdBefore',
    type: 'datetime-local',
    value: localInput(filters.createdBefore),
  });
  const submit = (event) => {
    event.preventDefault();
    const params = {};
    if (status.value !== (defaultStatus ?? 'all')) params.status = status.value;
    if (agentId.value.trim()) params.agentId = agentId.value.trim();
    if (fromLocalInput(after.value)) params.createdAfter = fromLocalInput(after.value);
    if (fromLocalInput(before.value)) params.createdBefore = fromLocalInput(before.value);
    if (filters.limit !== PAGE_SIZE) params.limit = String(filters.limit);
    location.assign(href(`/${kind}`, params));
  };
  return el(
    'form',
    { class: 'search', id: 'search', onsubmit: submit },
    el('label', {}, 'Status ', status),
    el('label', {}, 'Agent ', agentId),
    el('label', {}, 'Created after ', after),
    el('label', {}, 'before ', before),
    el('button', { type: 'submit' }, 'Search'),
    el('a', { href: href(`/${kind}`) }, 'clear'),
    el('span', { class: 'quiet' }, `times in ${zone}`),
  );
}

/**
 * A list screen: the form, the first page, and "More" that fetches the next page with the cursor and appends its
 * rows. `row(item)` draws one row; `extra(rows)` adds controls above the table (the inbox's decisions).
 */
async function listScreen(kind, { title, columns, row, idOf, empty, defaultStatus, extra }) {
  const filters = listFilters(defaultStatus);
  const heading = el('h1', {}, title);
  const form = filterForm(kind, filters, defaultStatus);
  const query = {
    status: filters.status === 'all' ? undefined : filters.status,
    agentId: filters.agentId,
    createdAfter: filters.createdAfter,
    createdBefore: filters.createdBefore,
    limit: filters.limit,
  };
  let page;
  try {
    page = await api.list(kind, query);
  } catch (err) {
    return show(heading, form, errorBox(err, `Could not list ${title.toLowerCase()}`));
  }
  const drawRow =
    row ??
    ((item) =>
      el(
        'tr',
        { dataset: { rowId: idOf(item) } },
        columns.map(([, cell, num]) => el('td', { class: num ? 'num' : null }, cell(item))),
      ));
  const tbody = el('tbody', {}, page.items.map(drawRow));
  const count = el('p', { class: 'quiet', id: 'shown' });
  const countShown = () => {
    count.textContent = `${tbody.rows.length} shown${page.nextCursor ? '; more below' : ''}`;
  };
  const more = el('button', { type: 'button', id: 'more' }, 'More');
  more.addEventListener('click', async () => {
    more.disabled = true;
    try {
      page = await api.list(kind, { ...query, cursor: page.nextCursor });
      tbody.append(...page.items.map(drawRow));
      more.hidden = !page.nextCursor;
      countShown();
    } catch (err) {
      more.after(errorBox(err, 'Could not load more'));
    } finally {
      more.disabled = false;
    }
  });
  more.hidden = !page.nextCursor;
  countShown();
  const filtered = query.status || filters.agentId || filters.createdAfter || filters.createdBefore;
  const body =
    page.items.length === 0
      ? el(
          'p',
          { class: 'empty' },
          filtered ? `No ${title.toLowerCase()} match these filters; widen them or clear them.` : empty,
        )
      : el(
          'table',
          {},
          el(
            'thead',
            {},
            el(
              'tr',
              {},
              columns.map(([h, , num]) => el('th', { class: num ? 'num' : null }, h)),
            ),
          ),
          tbody,
        );
  show(heading, form, extra ? extra(tbody, page.items) : null, body, count, el('p', {}, more));
}

/** The lists whose rows open a detail screen also open one by its id. */
const OPEN_BY_ID = { runs: 'Run id', gates: 'Gate id', sessions: 'Session id' };

function genericListScreen(kind) {
  const label = OPEN_BY_ID[kind];
  const open = label
    ? () => lookup(label, '…', (v) => location.assign(href(`/${kind}/${encodeURIComponent(v)}`)))
    : null;
  return listScreen(kind, { ...LISTS[kind], extra: open });
}

// ---- Escalation inbox -------------------------------------------------------------------------------------------

/** Who decided, in words: a key id, the operator, the deadline, or a wind-down. */
function deciderText(by) {
  if (by === 'admin') return 'the operator';
  if (by === 'deadline') return 'the deadline (nobody decided in time)';
  if (by === 'tenant') return 'the tenant (before deciders were recorded)';
  if (by.startsWith('wind-down:')) return `the wind-down of ${by.slice('wind-down:'.length)}`;
  return `key ${by}`;
}

function escalationRow(e, now = Date.now()) {
  const pending = e.status === 'pending';
  const box = el('input', {
    type: 'checkbox',
    class: 'pick',
    value: e.escalationId,
    'aria-label': `select ${e.escalationId}`,
    disabled: !pending,
  });
  const leftMs = Date.parse(e.deadlineAt) - now;
  const deadline = pending
    ? [
        el(
          'strong',
          { class: leftMs < 5 * 60_000 ? 'bad' : null },
          leftMs > 0 ? `${duration(leftMs)} left` : 'deadline passed',
        ),
        el('div', { class: 'quiet' }, `denied by itself at ${time(e.deadlineAt)}`),
      ]
    : el('span', { class: 'quiet' }, time(e.deadlineAt));
  const r = e.resolution;
  const decision = r
    ? [
        el('strong', { class: r.action === 'approve' ? 'ok' : 'bad' }, r.action === 'approve' ? 'approved' : 'denied'),
        ` ${time(r.at)}`,
        el('div', {}, `by ${deciderText(r.by)}`),
        r.reason ? el('div', { class: 'quiet' }, `reason: ${r.reason}`) : null,
      ]
    : el('span', { class: 'quiet' }, `waiting ${duration(now - Date.parse(e.createdAt))}`);
  return el(
    'tr',
    { dataset: { escalationId: e.escalationId, status: e.status } },
    el('td', {}, box),
    el('td', {}, el('span', { class: 'mono' }, e.escalationId), el('div', { class: 'quiet' }, time(e.createdAt))),
    el('td', { class: 'deadline' }, deadline),
    // The payer once, linked to the wallet it pays from; a wallet of another name (a sponsor's) is named below it.
    el(
      'td',
      { class: 'id payer' },
      e.walletId === e.payerAgentId
        ? walletLink(e.walletId)
        : [e.payerAgentId, el('div', { class: 'quiet' }, 'paid from ', walletLink(e.walletId))],
    ),
    el('td', { class: 'id' }, e.payeeAgentId),
    el('td', { class: 'num' }, money(e.amount, e.currency)),
    el(
      'td',
      { class: 'rule', title: `policy rule ${e.rule}`, dataset: { rule: e.rule } },
      el('strong', {}, breachOf(e).title),
      el('div', { class: 'quiet' }, breachOf(e).text),
    ),
    el('td', { class: 'decision' }, decision),
    el('td', { class: 'nowrap' }, link(`/gates/${encodeURIComponent(e.gateId)}`, 'gate')),
  );
}

const breachOf = (e) => breach(e.rule, e.details, e.currency);

const OUTCOME_TEXT = {
  approved: 'approved',
  denied: 'denied',
  already_decided: 'not changed: it was already decided (reload to see how)',
  deadline_passed: 'not changed: its deadline passed, so it was denied by itself',
  not_found: 'not found (decided elsewhere and removed, or not of this tenant)',
};

/** The inbox's decisions: approve or deny the selected rows with one reason, one bulk call, an outcome per row. */
function decisionControls(tbody) {
  const reason = el('input', {
    name: 'reason',
    placeholder: 'Reason (required; recorded with the decision)',
    size: 50,
    maxlength: 2000,
  });
  const results = el('section', { id: 'results', 'aria-live': 'polite' });
  const selectAll = el(
    'label',
    {},
    el('input', {
      type: 'checkbox',
      id: 'select-all',
      onchange: (ev) =>
        tbody.querySelectorAll('input.pick:not([disabled])').forEach((b) => {
          b.checked = ev.target.checked;
        }),
    }),
    ' all pending shown',
  );
  const decide = async (action) => {
    const ids = [...tbody.querySelectorAll('input.pick:checked')].map((b) => b.value);
    if (ids.length === 0)
      return results.replaceChildren(
        el('p', { class: 'notice' }, 'Select the escalations to decide first (the boxes on the left).'),
      );
    if (!reason.value.trim())
      return results.replaceChildren(
        el(
          'p',
          { class: 'notice' },
          'Give a reason first: it is recorded with the decision and shown to whoever looks later.',
        ),
      );
    if (ids.length > 100)
      return results.replaceChildren(el('p', { class: 'notice' }, `At most 100 at once; ${ids.length} are selected.`));
    results.replaceChildren(
      el('p', { class: 'quiet' }, `${action === 'approve' ? 'Approving' : 'Denying'} ${ids.length}…`),
    );
    let outcomes;
    try {
      outcomes = await api.resolveEscalations(ids, action, reason.value.trim());
    } catch (err) {
      return results.replaceChildren(errorBox(err, 'Could not decide'));
    }
    for (const o of outcomes) {
      const old = tbody.querySelector(`tr[data-escalation-id="${CSS.escape(o.escalationId)}"]`);
      if (!old) continue;
      if (o.escalation) {
        old.replaceWith(escalationRow(o.escalation));
        continue;
      }
      // Decided elsewhere (or gone): the row no longer says where it stands, so it says that instead.
      old.dataset.status = 'stale';
      old.querySelector('input.pick')?.setAttribute('disabled', '');
      old.querySelector('td.deadline')?.replaceChildren('—');
      old
        .querySelector('td.decision')
        ?.replaceChildren(el('strong', { class: 'bad' }, OUTCOME_TEXT[o.outcome] ?? o.outcome));
    }
    const stale = outcomes.filter((o) => o.outcome !== 'approved' && o.outcome !== 'denied').length;
    fill(
      results,
      el('h2', {}, 'Decisions'),
      stale
        ? el(
            'p',
            { class: 'notice', id: 'stale' },
            `${stale} of ${outcomes.length} could not be ${action === 'approve' ? 'approved' : 'denied'} and were left as they were.`,
          )
        : null,
      el(
        'ul',
        { class: 'outcomes' },
        outcomes.map((o) =>
          el(
            'li',
            { class: o.escalation ? null : 'error', dataset: { outcome: o.outcome, escalationId: o.escalationId } },
            el('span', { class: 'mono' }, o.escalationId),
            `: ${OUTCOME_TEXT[o.outcome] ?? o.outcome}. `,
            o.message ? el('span', { class: 'quiet' }, o.message) : null,
            o.escalationOverrideToken
              ? [
                  'Give the payer this single-use override token (send it as escalationOverrideToken to authorize-payment',
                  o.overrideExpiresAt ? `, before ${time(o.overrideExpiresAt)}` : '',
                  '):',
                  el('code', { class: 'token', 'data-override-token': o.escalationId }, o.escalationOverrideToken),
                ]
              : null,
          ),
        ),
      ),
      el('p', {}, el('a', { href: location.pathname + location.search }, 'Reload the inbox')),
    );
  };
  return el(
    'div',
    {},
    el(
      'div',
      { class: 'actions' },
      selectAll,
      reason,
      el('button', { type: 'button', id: 'approve', onclick: () => decide('approve') }, 'Approve selected'),
      el('button', { type: 'button', id: 'deny', class: 'danger', onclick: () => decide('deny') }, 'Deny selected'),
    ),
    results,
  );
}

function escalationsScreen() {
  const columns = ['', 'Escalation', 'Deadline', 'Payer', 'Payee', 'Amount', 'Policy', 'Decision', ''].map((h) => [h]);
  return listScreen('escalations', {
    title: 'Escalations',
    columns,
    row: (e) => escalationRow(e),
    defaultStatus: 'pending',
    empty:
      'Nothing is waiting. A payment that breaks a wallet policy (PUT /x402/wallets/{walletId}/policy) waits here for a person until its deadline.',
    extra: (tbody, items) => (items.some((e) => e.status === 'pending') ? decisionControls(tbody) : null),
  });
}

// ---- Lookups by id ----------------------------------------------------------------------------------------------

/** Wallets have no list: one is opened by its id (or from a row that names it). */
function lookupScreen(title, label, open) {
  show(
    el('h1', {}, title),
    el('p', { class: 'quiet' }, 'Open one by its id, or follow a wallet link from a settlement, gate or escalation.'),
    lookup(label, '…', (id) => location.assign(href(open(id)))),
  );
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
  const [settlement, verification, artifact, deliveries] = await Promise.all([
    api.runSettlement(runId).catch((err) => (err.status === 404 ? null : err)),
    r.artifactId ? api.runVerification(runId).catch((err) => err) : null,
    r.artifactId ? api.artifact(r.artifactId).catch((err) => err) : null,
    api.runDeliveries(runId).catch((err) => err),
  ]);
  const sections = [
    heading,
    fields([
      ['Status', r.status],
      ['Verdict', r.verdict],
      ['Agent', r.agentId],
      ['Events', String(r.eventCount)],
      ['Created', time(r.createdAt)],
      ['Finalized', time(r.finalizedAt)],
      r.finalizeError && ['Finalize error', shortJson(r.finalizeError)],
      ['Terms', termsText(r.terms)],
    ]),
  ];
  sections.push(el('h2', {}, 'Events'));
  if (artifact instanceof Error) sections.push(errorBox(artifact, 'Could not load the artifact'));
  else if (!artifact)
    sections.push(
      el(
        'p',
        { class: 'empty' },
        `The run has ${r.eventCount} events; they are shown here from its artifact once it is finalized (POST /v1/runs/${runId}/finalize).`,
      ),
    );
  else
    sections.push(
      table(
        ['Seq', 'Type', 'At', 'Payload', 'Chain hash', 'Signed by'],
        artifact.events.items.map((e) =>
          el(
            'tr',
            { dataset: { eventSeq: e.seq } },
            el('td', { class: 'num' }, String(e.seq)),
            el('td', {}, e.type),
            el('td', {}, time(e.at)),
            el('td', { class: 'payload' }, payloadDetails(e.payload)),
            el('td', { class: 'mono', title: e.chainHash }, `${e.chainHash.slice(0, 12)}…`),
            el('td', { class: 'mono' }, e.signerKeyId),
          ),
        ),
        'No events.',
      ),
    );
  sections.push(el('h2', {}, 'Artifact and verification'));
  if (!r.artifactId) sections.push(el('p', { class: 'empty' }, 'No artifact until the run is finalized.'));
  else if (verification instanceof Error) sections.push(errorBox(verification, 'Could not verify'));
  else
    sections.push(
      fields([
        [
          'Artifact',
          el('a', { href: `/v1/verify/${encodeURIComponent(r.artifactId)}`, target: '_blank' }, r.artifactId),
        ],
        [
          'Verified',
          el(
            'span',
            { class: verification.verified ? 'ok' : 'bad' },
            verification.verified ? 'yes: every check passed' : `no: ${verification.failures.join('; ')}`,
          ),
        ],
        [
          'Checks',
          Object.entries(verification.checks)
            .map(([check, passed]) => `${check} ${passed ? 'passed' : 'FAILED'}`)
            .join(', '),
        ],
        ['Hash', el('span', { class: 'mono' }, verification.artifactHash)],
        ['Signing key', verification.keyId],
      ]),
    );
  sections.push(el('h2', {}, 'Settlement'));
  if (settlement instanceof Error) sections.push(errorBox(settlement, 'Could not load the settlement'));
  else if (!settlement)
    sections.push(
      el(
        'p',
        { class: 'empty' },
        'Not settled. A finalized run with settlement terms is settled with POST /v1/runs/{runId}/settle.',
      ),
    );
  else {
    sections.push(settlementFields(settlement));
    sections.push(el('h2', {}, 'Ledger entries'));
    sections.push(await entriesOfSettlement(settlement));
  }
  sections.push(el('h2', {}, 'Webhook deliveries'));
  if (deliveries instanceof Error)
    sections.push(errorBox(deliveries, 'Could not load the deliveries (they need webhooks:read)'));
  else
    sections.push(
      el(
        'div',
        { id: 'run-deliveries' },
        table(
          ['Delivery', 'Endpoint', 'Event', 'Status', 'Attempts', 'Last error', 'Created'],
          deliveries.items.map((d) =>
            el(
              'tr',
              { dataset: { deliveryId: d.id, status: d.status } },
              el('td', { class: 'mono' }, d.id),
              el('td', {}, link(`/webhooks/${encodeURIComponent(d.endpointId)}`, d.endpointId)),
              el('td', {}, d.eventType),
              el(
                'td',
                {
                  class:
                    d.status === 'failed' || d.status === 'abandoned' ? 'bad' : d.status === 'succeeded' ? 'ok' : null,
                },
                d.status,
              ),
              el('td', { class: 'num' }, String(d.attemptCount)),
              el('td', {}, d.lastError ?? '—'),
              el('td', {}, time(d.createdAt)),
            ),
          ),
          'No webhook deliveries: no endpoint of this tenant subscribes to the events of this run yet.',
        ),
      ),
    );
  show(...sections);
}

/** A payload folded to one line; opened, the whole of it as indented JSON (text, never markup). */
function payloadDetails(payload) {
  return el(
    'details',
    {},
    el('summary', {}, payloadSummary(payload)),
    el('pre', { class: 'json' }, JSON.stringify(payload, null, 2)),
  );
}

function settlementFields(s) {
  return fields([
    ['Settlement', el('span', { class: 'mono' }, s.settlementId)],
    ['Status', s.status],
    ['Amount', money(s.amount, s.currency)],
    ['Released', money(s.releasedAmount, s.currency)],
    ['Refunded', money(s.refundedAmount, s.currency)],
    ['Holdback', `${money(s.holdback, s.currency)} (${s.holdbackState})`],
    ['Payer wallet', link(`/wallets/${encodeURIComponent(s.payerWalletId)}`, s.payerWalletId)],
    ['Payee wallet', link(`/wallets/${encodeURIComponent(s.payeeWalletId)}`, s.payeeWalletId)],
    ['Dispute window ends', time(s.disputeWindowEndsAt)],
    ['Dispute', s.dispute ? `${s.dispute.status}: ${s.dispute.reason}` : 'none'],
    [
      'Decision',
      s.decision
        ? `${s.decision.verdict}${s.decision.reason ? ` (${s.decision.reason})` : ''}, ${time(s.decision.decidedAt)}`
        : '—',
    ],
  ]);
}

/** The payer's and payee's postings whose entry names this settlement or its run (the latest page of each wallet). */
async function entriesOfSettlement(s) {
  try {
    const pages = await Promise.all(
      [s.payerWalletId, s.payeeWalletId].map((w) =>
        api.walletEntries(w).then((p) => p.items.map((i) => ({ ...i, walletId: w }))),
      ),
    );
    const mine = pages
      .flat()
      .filter((i) => i.entryId.includes(s.settlementId) || i.entryId.includes(s.runId))
      .sort((x, y) => Date.parse(y.at) - Date.parse(x.at));
    return entriesTable(
      mine,
      'No postings of this settlement in the latest entries of its wallets; open the wallets for older ones.',
    );
  } catch (err) {
    return errorBox(err, 'Could not load ledger entries');
  }
}

function entriesTable(items, empty) {
  // One wallet's own page names no wallet per row; the entries of a settlement (two wallets) do.
  const ofWallets = items.some((i) => i.walletId);
  return table(
    ['At', ofWallets && 'Wallet', 'Kind', 'Bucket', 'Change', 'Balance after', 'Entry'].filter(Boolean),
    items.map((i) =>
      el(
        'tr',
        {},
        el('td', {}, time(i.at)),
        ofWallets ? el('td', {}, link(`/wallets/${encodeURIComponent(i.walletId)}`, i.walletId)) : null,
        el('td', {}, i.kind),
        el('td', {}, i.bucket),
        el('td', { class: `num ${i.delta < 0 ? 'bad' : 'ok'}` }, money(i.delta, i.currency)),
        el('td', { class: 'num' }, money(i.balanceAfter, i.currency)),
        el('td', { class: 'mono' }, i.entryId),
      ),
    ),
    empty,
  );
}

async function settlementLookupScreen() {
  const heading = el('h1', {}, 'Settlements');
  const runId = new URLSearchParams(location.search).get('run');
  const form = lookup('Run id', 'run_…', (id) => location.assign(href('/settlements', { run: id })));
  if (!runId) return genericListScreen('settlements');
  try {
    const s = await api.runSettlement(runId);
    show(heading, form, el('p', {}, 'Run ', link(`/runs/${encodeURIComponent(runId)}`, runId)), settlementFields(s));
  } catch (err) {
    show(
      heading,
      form,
      err.status === 404
        ? el('p', { class: 'empty' }, `Run ${runId} has no settlement (or no such run in this tenant).`)
        : errorBox(err, 'Could not load the settlement'),
    );
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
  show(
    heading,
    fields([
      ['Status', el('strong', { 'data-gate-status': g.status }, g.status)],
      ['Payer', g.payerAgentId],
      ['Payee', g.payeeAgentId],
      ['Amount', money(g.amount, g.currency)],
      ['Holdback', `${g.holdbackBps / 100}%`],
      ['Tool', g.toolId],
      ['Escrow wallet', link(`/wallets/${encodeURIComponent(g.escrowWalletId)}`, g.escrowWalletId)],
      ['Created', time(g.createdAt)],
      ['Quote', g.quote ? `${g.quote.quoteId} (${g.quote.status}, expires ${time(g.quote.expiresAt)})` : 'none'],
      [
        'Authorization',
        g.authorization ? `${g.authorization.authorizationRef}, expires ${time(g.authorization.expiresAt)}` : 'none',
      ],
      [
        'Verification',
        g.verification
          ? `${g.verification.verificationStatus} ${time(g.verification.at)}${g.verification.capturedAmount === null ? '' : `, ${money(g.verification.capturedAmount, g.currency)} captured`}`
          : 'none',
      ],
      [
        'Settlement',
        g.settlement
          ? `${g.settlement.status}: ${money(g.settlement.releasedAmount, g.currency)} released, ${money(g.settlement.refundedAmount, g.currency)} refunded, holdback ${money(g.settlement.holdback, g.currency)} (${g.settlement.holdbackState})`
          : 'none',
      ],
      [
        'Decision',
        g.decision
          ? `${g.decision.verdict}${g.decision.reason ? ` (${g.decision.reason})` : ''}, ${time(g.decision.decidedAt)}`
          : 'none',
      ],
    ]),
    el('p', {}, link('/escalations', 'Escalations of this tenant', { status: 'all' })),
  );
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
  // No policy is a 404; another failure (a key without the scope) is said as such, not taken for "none".
  const policy = await api.walletPolicy(walletId).catch((err) => (err.status === 404 ? null : err));
  const balances = Object.entries(w.balances);
  show(
    heading,
    fields([
      ['Kind', w.kind],
      ['Created', time(w.createdAt)],
      [
        'Policy',
        policy instanceof Error
          ? el('span', { class: 'quiet' }, `could not be read: ${policy.message}`)
          : policy
            ? [
                policyRules(policy),
                el('div', { class: 'quiet' }, `version ${policy.version}, set ${time(policy.updatedAt)}`),
              ]
            : 'none: payments from this wallet are not limited by a policy',
      ],
    ]),
    el('h2', {}, 'Balances'),
    table(
      ['Currency', 'Available', 'Held in reserves (escrow)'],
      balances.map(([cur, b]) =>
        el(
          'tr',
          {},
          el('td', {}, cur),
          el('td', { class: 'num', 'data-available': cur }, money(b.available, cur)),
          el('td', { class: 'num' }, money(b.escrow, cur)),
        ),
      ),
      'No money yet. An operator credits a wallet with POST /ops/wallets/{walletId}/credit.',
    ),
    el('h2', {}, 'Entries'),
    entriesTable(entries.items, 'No entries yet.'),
    entries.nextCursor
      ? el('p', {}, link(`/wallets/${encodeURIComponent(walletId)}`, 'Older entries →', { cursor: entries.nextCursor }))
      : null,
  );
}

// ---- Payment sessions -------------------------------------------------------------------------------------------

async function sessionScreen(sessionId) {
  const heading = el('h1', {}, 'Payment session ', el('span', { class: 'mono' }, sessionId));
  let s;
  let charges;
  try {
    [s, charges] = await Promise.all([api.paymentSession(sessionId), api.sessionCharges(sessionId)]);
  } catch (err) {
    return show(heading, errorBox(err, 'Could not load the session'));
  }
  const closed = s.closedAt !== null;
  const statement = closed ? await api.sessionStatement(sessionId).catch((err) => err) : null;
  show(
    heading,
    fields([
      ['Status', el('strong', { 'data-session-status': s.status }, s.status)],
      ['Payer', agentRunsLink(s.payerAgentId)],
      [
        'Payees',
        s.payeeAgentIds.length === 1
          ? s.payeeAgentIds[0]
          : el(
              'ul',
              { class: 'plain' },
              s.payeeAgentIds.map((p) => el('li', {}, p)),
            ),
      ],
      ['Budget wallet', walletLink(s.walletId)],
      s.sponsorWalletId && ['Sponsor wallet', walletLink(s.sponsorWalletId)],
      ['Budget', `${money(s.budget, s.currency)}, at most ${money(s.maxPerCall, s.currency)} per call`],
      ['Spent', `${money(s.spent, s.currency)} in ${s.charges} charges`],
      !closed && ['Remaining', money(s.remaining, s.currency)],
      ['Holdback', `${s.holdbackBps / 100}% for ${duration(s.disputeWindowSeconds * 1000)} (the dispute window)`],
      ['Opened', time(s.createdAt)],
      closed ? ['Closed', time(s.closedAt)] : ['Expires', time(s.expiresAt)],
      closed && ['Returned at close', money(s.refunded, s.currency)],
    ]),
    el('h2', {}, 'Statement'),
    closed
      ? statementSection(s, statement)
      : el('p', { class: 'empty' }, 'Signed when the session closes (by the payer, at expiry, or by a wind-down).'),
    el('h2', {}, 'Charges'),
    sessionChargesTable(s, charges),
    el('p', {}, link('/settlements', 'Settlements of this tenant'), ' · ', link('/sessions', 'All sessions')),
  );
}

/** The signed statement of a closed session: its totals, what each payee gets, and what to check it with. */
function statementSection(s, statement) {
  if (statement instanceof Error) return errorBox(statement, 'Could not load the statement');
  const b = statement.body;
  return el(
    'section',
    { id: 'statement', dataset: { statementHash: statement.statementHash } },
    fields([
      ['Ended', `${b.reason === 'closed' ? 'closed' : b.reason.replace('_', ' ')} ${time(b.closedAt)}`],
      [
        'Charged',
        `${money(b.totalCharged, b.currency)} in ${b.chargeCount} charges${b.voided ? ` (${b.voided} voided)` : ''}`,
      ],
      ['Returned to the payer', money(b.refunded, b.currency)],
      ['Statement hash', el('span', { class: 'mono' }, statement.statementHash)],
      ['Signed by', el('span', { class: 'mono' }, `${statement.signature.alg} key ${statement.signature.keyId}`)],
    ]),
    table(
      ['Payee', 'Charged', 'Paid through'],
      b.payees.map((p) =>
        el(
          'tr',
          {},
          el('td', { class: 'id' }, p.payeeAgentId),
          el('td', { class: 'num' }, money(p.charged, b.currency)),
          el('td', { class: 'mono' }, p.settlementId ?? 'nothing to pay'),
        ),
      ),
      'No payees.',
    ),
    el(
      'p',
      { class: 'quiet' },
      'Anyone can check it offline: save GET /x402/sessions/{sessionId}/statement and run npx agent-settlement verify statement.json --jwks <service>/.well-known/jwks.json.',
    ),
  );
}

/** A session's charges, newest first, with "More" reading the next page by its cursor. */
function sessionChargesTable(s, first) {
  let page = first;
  const drawRow = (c) =>
    el(
      'tr',
      { dataset: { chargeSeq: c.seq, state: c.state } },
      el('td', { class: 'num' }, String(c.seq)),
      el('td', {}, time(c.chargedAt)),
      c.state === 'void'
        ? el('td', { class: 'quiet', colspan: 3 }, 'void: the call never answered, so nothing was charged')
        : [
            el('td', { class: 'id' }, c.payeeAgentId),
            el('td', { class: 'num' }, money(c.amount, c.currency)),
            el('td', { class: 'mono' }, c.paymentId),
          ],
      el('td', { class: 'mono', title: c.receiptHash ?? '' }, c.receiptHash ? `${c.receiptHash.slice(0, 12)}…` : '—'),
    );
  if (page.items.length === 0)
    return el(
      'p',
      { class: 'empty' },
      `No charges yet. The payer charges each paid call with POST /x402/sessions/${s.sessionId}/charges.`,
    );
  const tbody = el('tbody', {}, page.items.map(drawRow));
  const more = el('button', { type: 'button', id: 'more-charges', hidden: !page.nextCursor }, 'More');
  more.addEventListener('click', async () => {
    more.disabled = true;
    try {
      page = await api.sessionCharges(s.sessionId, page.nextCursor);
      tbody.append(...page.items.map(drawRow));
      more.hidden = !page.nextCursor;
    } catch (err) {
      more.after(errorBox(err, 'Could not load more charges'));
    } finally {
      more.disabled = false;
    }
  });
  return el(
    'div',
    { id: 'charges' },
    el(
      'table',
      {},
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          ['#', 'At', 'Payee', 'Amount', 'Payment id', 'Receipt'].map((h) => el('th', {}, h)),
        ),
      ),
      tbody,
    ),
    el('p', {}, more),
  );
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
  show(
    heading,
    table(
      ['Endpoint', 'URL', 'Status', 'Events', 'Last success', 'Failing since'],
      page.items.map((e) =>
        el(
          'tr',
          {},
          el('td', {}, link(`/webhooks/${encodeURIComponent(e.id)}`, e.id)),
          el('td', { class: 'mono' }, e.url ?? 'pull (feed only)'),
          el('td', {}, e.status, e.disabledReason ? el('div', { class: 'quiet' }, e.disabledReason) : null),
          el('td', {}, e.events.join(', ')),
          el('td', {}, time(e.lastSuccessAt)),
          el('td', { class: e.failingSince ? 'bad' : null }, time(e.failingSince)),
        ),
      ),
      'No endpoints. Register one with POST /v1/webhooks (scope webhooks:write) to receive events.',
    ),
    page.nextCursor ? el('p', {}, link('/webhooks', 'Next page →', { cursor: page.nextCursor })) : null,
  );
}

/** Calls `step` every `seconds` until it answers true, fails, or `limit` calls have passed (a page left open stops). */
function every(seconds, limit, step) {
  let n = 0;
  const tick = async () => {
    n += 1;
    const done = await step().catch(() => true);
    if (!done && n < limit) setTimeout(tick, seconds * 1000);
  };
  setTimeout(tick, seconds * 1000);
}

function deliveryRow(d, resend) {
  return el(
    'tr',
    { dataset: { deliveryId: d.id, status: d.status, eventId: d.eventId } },
    el('td', { class: 'mono' }, d.id),
    el('td', {}, d.eventType, el('div', { class: 'quiet mono' }, d.eventId)),
    el(
      'td',
      { class: d.status === 'failed' || d.status === 'abandoned' ? 'bad' : d.status === 'succeeded' ? 'ok' : null },
      d.status,
    ),
    el('td', { class: 'num' }, String(d.attemptCount)),
    el('td', {}, d.lastError ?? '—'),
    el('td', {}, time(d.nextAttemptAt)),
    el('td', {}, time(d.createdAt)),
    el(
      'td',
      {},
      d.status !== 'pending'
        ? el('button', { type: 'button', class: 'resend', onclick: () => resend(d) }, 'Resend')
        : null,
    ),
  );
}

async function endpointScreen(endpointId) {
  const heading = el('h1', {}, 'Endpoint ', el('span', { class: 'mono' }, endpointId));
  const params = new URLSearchParams(location.search);
  const status = params.get('status') ?? undefined;
  const cursor = params.get('cursor') ?? undefined;
  let endpoint;
  let page;
  try {
    [endpoint, page] = await Promise.all([
      api.webhookEndpoint(endpointId),
      api.deliveries(endpointId, { status, cursor }),
    ]);
  } catch (err) {
    return show(heading, errorBox(err, 'Could not load the endpoint'));
  }
  const results = el('section', { id: 'delivery-results', 'aria-live': 'polite' });
  const deliveriesBox = el('div', { id: 'deliveries' });
  const drawDeliveries = () =>
    fill(
      deliveriesBox,
      table(
        ['Delivery', 'Event', 'Status', 'Attempts', 'Last error', 'Next attempt', 'Created', ''],
        page.items.map((d) => deliveryRow(d, resend)),
        status
          ? `No ${status} deliveries.`
          : 'No deliveries yet. They appear when an event this endpoint subscribes to happens; "Send test event" makes one now.',
      ),
      page.nextCursor
        ? el(
            'p',
            {},
            link(`/webhooks/${encodeURIComponent(endpointId)}`, 'Older deliveries →', {
              ...(status ? { status } : {}),
              cursor: page.nextCursor,
            }),
          )
        : null,
    );
  /** Reads this page of deliveries again; true once none of them is on its way. */
  const refresh = async () => {
    page = await api.deliveries(endpointId, { status, cursor });
    drawDeliveries();
    return !page.items.some((d) => d.status === 'pending');
  };
  const watch = () => every(1, 300, refresh);

  async function resend(d) {
    try {
      await api.resendDelivery(endpointId, d.id);
      results.replaceChildren(
        el(
          'p',
          { class: 'ok', dataset: { resent: d.id } },
          `Delivery ${d.id} (event ${d.eventId}) is being sent again; its row updates below.`,
        ),
      );
      await refresh();
      watch();
    } catch (err) {
      results.replaceChildren(errorBox(err, `Could not resend ${d.id}`));
    }
  }
  const sendTest = async () => {
    try {
      const sent = await api.sendTestEvent(endpointId);
      results.replaceChildren(
        el(
          'p',
          { class: 'ok', dataset: { testDelivery: sent.deliveryId } },
          `A webhook.test event (${sent.eventId}) is on its way as delivery ${sent.deliveryId}.`,
        ),
      );
      await refresh();
      watch();
    } catch (err) {
      results.replaceChildren(errorBox(err, 'Could not send a test event'));
    }
  };

  const since = el('input', {
    type: 'datetime-local',
    name: 'since',
    required: true,
    value: localInput(new Date(Date.now() - 3_600_000).toISOString()),
  });
  const progress = el('section', { id: 'recovery', 'aria-live': 'polite' });
  const showRecovery = (r) =>
    progress.replaceChildren(
      el(
        'p',
        { dataset: { recoveryStatus: r.status, recoveryId: r.id } },
        el('strong', {}, r.status === 'finished' ? 'Recovery finished' : 'Recovery running'),
        ` (since ${time(r.since)}): `,
        `${r.counts.queued} sent again; of those ${r.counts.sent} delivered, ${r.counts.failed} failed again, ${r.counts.pending} on their way.`,
      ),
    );
  const recover = async (event) => {
    event.preventDefault();
    const iso = fromLocalInput(since.value);
    if (!iso) return progress.replaceChildren(el('p', { class: 'notice' }, 'Pick the time to recover from.'));
    let r;
    try {
      r = await api.recoverDeliveries(endpointId, iso);
    } catch (err) {
      return progress.replaceChildren(errorBox(err, 'Could not start the recovery'));
    }
    showRecovery(r);
    // Read the progress back until the job has looked at everything and nothing it resent is still on its way.
    every(1, 300, async () => {
      r = await api.recovery(endpointId, r.id);
      showRecovery(r);
      const done = r.status === 'finished' && r.counts.pending === 0;
      if (done) await refresh();
      return done;
    });
  };
  const disabled = endpoint.status !== 'active';
  show(
    heading,
    fields([
      ['URL', el('span', { class: 'mono' }, endpoint.url ?? 'none: a pull endpoint, read through its feed')],
      ['Status', endpoint.status],
      endpoint.disabledReason && ['Disabled because', endpoint.disabledReason],
      ['Events', endpoint.events.join(', ')],
      ['Last success', time(endpoint.lastSuccessAt)],
      ['Failing since', time(endpoint.failingSince)],
    ]),
    disabled
      ? el(
          'p',
          { class: 'notice' },
          'This endpoint is disabled: nothing is sent to it, resends and recoveries included. Enable it with POST /v1/webhooks/{endpointId}/enable once the receiver is back.',
        )
      : null,
    el(
      'div',
      { class: 'actions' },
      el('button', { type: 'button', id: 'send-test', onclick: sendTest, disabled }, 'Send test event'),
      el(
        'form',
        { class: 'lookup', id: 'recover', onsubmit: recover },
        el('label', {}, 'Recover failed since ', since),
        el('button', { type: 'submit', disabled }, 'Recover'),
        el('span', { class: 'quiet' }, zone),
      ),
      el(
        'button',
        {
          type: 'button',
          id: 'refresh-deliveries',
          onclick: () =>
            refresh().catch((err) => results.replaceChildren(errorBox(err, 'Could not reload the deliveries'))),
        },
        'Refresh',
      ),
    ),
    progress,
    results,
    el(
      'nav',
      { class: 'filters' },
      ['all', 'pending', 'succeeded', 'failed', 'abandoned'].map((s) =>
        el(
          'a',
          {
            href: href(`/webhooks/${encodeURIComponent(endpointId)}`, s === 'all' ? {} : { status: s }),
            class: (status ?? 'all') === s ? 'current' : null,
          },
          s,
        ),
      ),
    ),
    deliveriesBox,
  );
  drawDeliveries();
}

// ---- Operator: tenants ------------------------------------------------------------------------------------------

async function tenantsScreen() {
  const heading = el('h1', {}, 'Tenants');
  try {
    const { items } = await api.tenants();
    show(
      heading,
      el('p', {}, 'Open a tenant to see its escalations, runs, gates, wallets and webhooks.'),
      table(
        ['Tenant', 'Name', 'Rate limit', 'Created'],
        items.map((t) =>
          el(
            'tr',
            {},
            el(
              'td',
              {},
              el('a', { href: `/console/escalations?tenant=${encodeURIComponent(t.tenantId)}` }, t.tenantId),
            ),
            el('td', {}, t.name),
            el('td', {}, t.rateLimit ? `${t.rateLimit.limit} / ${t.rateLimit.windowSeconds}s` : 'default'),
            el('td', {}, time(t.createdAt)),
          ),
        ),
        'No tenants yet. Create one with POST /ops/tenants.',
      ),
    );
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
  if (screenName === 'tenants')
    return isOperator
      ? tenantsScreen()
      : show(el('p', { class: 'error' }, 'Only the operator (the admin key) sees the tenants.'));
  if (!(await needTenant())) return;
  switch (screenName) {
    case 'escalations':
      return escalationsScreen();
    case 'runs':
      return id ? runScreen(id) : genericListScreen('runs');
    case 'agents':
      return genericListScreen('agents');
    case 'gates':
      return id ? gateScreen(id) : genericListScreen('gates');
    case 'sessions':
      return id ? sessionScreen(id) : genericListScreen('sessions');
    case 'settlements':
      return settlementLookupScreen();
    case 'disputes':
      return genericListScreen('disputes');
    case 'wallets':
      return id ? walletScreen(id) : lookupScreen('Wallets', 'Wallet id', (v) => `/wallets/${encodeURIComponent(v)}`);
    case 'webhooks':
      return id ? endpointScreen(id) : webhooksScreen();
    default:
      return show(el('p', { class: 'error' }, 'No such screen. '), link('/escalations', 'Go to the escalation inbox'));
  }
}

// Kept short so the bar stays one line; the whole of it (with the time zone every time is shown in) on hover.
const who = document.getElementById('who');
who.textContent = isOperator
  ? `operator${tenant ? ` · ${tenant}` : ''}`
  : `${api.session.tenantId} · key ${api.session.keyId}`;
who.title = `${isOperator ? 'the operator (admin key)' : `tenant ${api.session.tenantId}, key ${api.session.keyId}`}${tenant && isOperator ? `, tenant ${tenant}` : ''}; times in ${zone}`;
route().catch((err) => show(errorBox(err, 'Something failed')));
