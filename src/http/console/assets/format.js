// Formatting in the viewer's browser: money in its currency's units, times in the viewer's own time zone, and DOM
// built from text (never from HTML strings), so a value from the API cannot become markup.

const fractionDigits = new Map();
function digitsOf(currency) {
  if (!fractionDigits.has(currency)) {
    let digits = null;
    try {
      if (Intl.supportedValuesOf('currency').includes(currency)) {
        digits = new Intl.NumberFormat(undefined, { style: 'currency', currency }).resolvedOptions()
          .maximumFractionDigits;
      }
    } catch {
      digits = null;
    }
    fractionDigits.set(currency, digits);
  }
  return fractionDigits.get(currency);
}

/**
 * An integer amount of minor units as the currency shows it (2500 USD -> "$25.00"); a currency ISO 4217 does not
 * know (USDC, credits) has no known minor unit, so its integer is shown as it is, with the code.
 */
export function money(amount, currency) {
  if (amount === null || amount === undefined) return '—';
  const digits = digitsOf(currency);
  if (digits === null) return `${Number(amount).toLocaleString()} ${currency} (minor units)`;
  return new Intl.NumberFormat(undefined, { style: 'currency', currency }).format(amount / 10 ** digits);
}

const dateTime = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
export const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;

export function time(iso) {
  if (!iso) return '—';
  return dateTime.format(new Date(iso));
}

/** "3 min", "2 h 5 min": how long between two instants. */
export function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

/** An element: el('td', {class: 'x'}, 'text', child, …); attributes starting with "on" become listeners. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const pad = (n) => String(n).padStart(2, '0');

/** An ISO instant as a `datetime-local` input shows it: the viewer's wall clock, to the minute. */
export function localInput(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** A `datetime-local` input's value (the viewer's wall clock) as an ISO instant; '' stays ''. */
export function fromLocalInput(value) {
  if (!value) return '';
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? '' : d.toISOString();
}

/** "a, b and 3 more": a list of names kept to one line's worth, the rest counted. */
export function someOf(names, shown = 3) {
  if (names.length <= shown) return names.join(', ');
  return `${names.slice(0, shown).join(', ')} and ${names.length - shown} more`;
}

/**
 * A wallet policy as the rules a person reads (GET /x402/wallets/{walletId}/policy): each limit in the policy's
 * currency, the allow-lists in full (they are what someone checks a refused payee against), what a breach does.
 */
export function policyRules(policy) {
  const c = policy.currency;
  const rules = [];
  rules.push(`pays in ${c} only`);
  if (policy.perCallLimit !== null && policy.perCallLimit !== undefined)
    rules.push(`at most ${money(policy.perCallLimit, c)} per payment`);
  if (policy.dailyLimit !== null && policy.dailyLimit !== undefined)
    rules.push(`at most ${money(policy.dailyLimit, c)} per day (UTC), authorized payments added up`);
  const allowList = (ids, noun) => {
    if (ids === null || ids === undefined) return `any ${noun}`;
    if (ids.length === 0) return `no ${noun} at all (the allow-list is empty)`;
    return [
      `only these ${noun}s (${ids.length}):`,
      el(
        'ul',
        {},
        ids.map((id) => el('li', { class: 'mono' }, id)),
      ),
    ];
  };
  rules.push(allowList(policy.allowedPayeeAgentIds, 'payee'));
  rules.push(allowList(policy.allowedToolIds, 'tool'));
  if (policy.escalationTimeoutSeconds)
    rules.push(
      `a payment that breaks a rule waits ${duration(policy.escalationTimeoutSeconds * 1000)} in the escalation inbox, then is denied by itself`,
    );
  return el(
    'ul',
    { class: 'rules', 'data-policy-version': policy.version },
    rules.map((r) => el('li', {}, r)),
  );
}

const RULE_NAMES = {
  perCallLimit: 'over the per-payment limit',
  dailyLimit: 'over the daily limit',
  allowedPayeeAgentIds: 'payee not allowed',
  allowedToolIds: 'tool not allowed',
  currency: 'other currency',
  policy: 'no policy',
  sponsorWallet: 'not this sponsor',
};

/** A policy breach (an escalation's rule and details) in words, its amounts in the call's currency. */
export function breach(rule, details, currency) {
  const d = details ?? {};
  const m = (n) => money(n, currency);
  let text = d.message ?? '';
  if (rule === 'perCallLimit' && Number.isInteger(d.limit) && Number.isInteger(d.amount))
    text = `${m(d.amount)} is over the limit of ${m(d.limit)} per payment`;
  if (rule === 'dailyLimit' && Number.isInteger(d.limit) && Number.isInteger(d.amount))
    text = `${m(d.amount)} on top of ${m(d.spentToday ?? 0)} today is over the limit of ${m(d.limit)} per day`;
  return { title: RULE_NAMES[rule] ?? rule, text };
}

/** An event payload in one short line (its first keys), for the summary of a collapsed payload. */
export function payloadSummary(payload) {
  if (payload === null || payload === undefined) return 'no payload';
  if (typeof payload !== 'object') return String(payload);
  const keys = Object.keys(payload);
  if (keys.length === 0) return '{}';
  const line = keys
    .slice(0, 3)
    .map((k) => {
      const v = payload[k];
      return `${k}: ${v !== null && typeof v === 'object' ? (Array.isArray(v) ? `[${v.length}]` : '{…}') : String(v)}`;
    })
    .join(', ');
  const text = keys.length > 3 ? `${line}, …` : line;
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

/** Run terms ({accuracy: {min: 0.9}}) as "accuracy ≥ 0.9, latencyP95 ≤ 800". */
export function termsText(terms) {
  const entries = Object.entries(terms ?? {});
  if (entries.length === 0) return 'none';
  return entries
    .map(([metric, bound]) => ('min' in bound ? `${metric} ≥ ${bound.min}` : `${metric} ≤ ${bound.max}`))
    .join(', ');
}
