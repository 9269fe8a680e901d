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
