// The sign-in form: sends the key once, as JSON, to POST /console/session; the answer sets the session cookie.
const form = document.getElementById('sign-in');
const notice = document.getElementById('notice');

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const key = form.elements.key.value.trim();
  notice.hidden = true;
  const res = await fetch('/console/session', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ key }),
    credentials: 'same-origin',
  });
  if (res.ok) {
    form.reset();
    location.assign(location.pathname.startsWith('/console/') ? location.pathname + location.search : '/console');
    return;
  }
  const body = await res.json().catch(() => null);
  const why = {
    UNAUTHENTICATED: 'That key was not accepted: check it was copied whole, and that it is not revoked or expired.',
    FORBIDDEN: 'That key has no read scope (runs:read, x402:read or wallets:read). Sign in with a key that has one.',
    RATE_LIMITED: 'Too many attempts; wait a minute and try again.',
  }[body?.code];
  notice.textContent = why ?? body?.message ?? `Sign-in failed (HTTP ${res.status}).`;
  notice.hidden = false;
});
form.querySelector('button[type=submit]').disabled = false; // handled from here on (the page serves it disabled)
