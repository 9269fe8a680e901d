import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page, type Request, type Route } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRun, registerAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { finalizedRun, parties, settle, waitSettlement } from '../helpers/money.ts';
import { createGate, gateParties, post, quote } from '../x402/helpers.ts';

// The console in a real browser (Debian's chromium driven by playwright-core) against the service listening on
// loopback: sign-in, the escalation inbox deciding real paid calls (one and in bulk, stale decisions included),
// the cursor lists of one tenant only, a failed webhook delivery resent and recovered from the page, tenant
// isolation, sessions that end, CSRF, and Bull Board for the admin key alone.
// Each screen is written to .data/console-screenshots/ for people to look at.

const CHROMIUM = '/usr/bin/chromium';
const SHOTS = join(process.cwd(), '.data', 'console-screenshots');
const SCOPES = ['agents:write', 'runs:write', 'x402:write', 'wallets:write', 'webhooks:write'] as const;
const BROWSER_TIMEOUT_MS = 120_000;

/** Waits until `condition` holds, checking every 100 ms (the test's own timeout bounds it). */
async function until(condition: () => boolean | Promise<boolean>) {
  while (!(await condition())) await new Promise((resolve) => setTimeout(resolve, 100));
}

describe('web console in a browser', () => {
  let t: TestApp;
  let base: string;
  let context: BrowserContext;
  let page: Page;
  let profile: string;
  let receiver: Server;
  const received: string[] = [];
  // A second receiver that answers 500 while `failing` is set: its deliveries end `failed` (retry scale 0).
  let flaky: Server;
  let failing = true;
  const flakyRequests: Array<{ eventId: string; status: number }> = [];
  let a: Awaited<ReturnType<TestApp['tenantWithKey']>>;
  let b: Awaited<ReturnType<TestApp['tenantWithKey']>>;

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['finalize', 'settle', 'x402-verify', 'webhook-dispatch'],
      overrides: {
        RATE_LIMIT_MAX: '100000',
        WEBHOOK_ALLOW_INSECURE_URLS: 'true',
        WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
        WEBHOOK_RETRY_SCALE: '0',
      },
    });
    await t.app.listen({ host: '127.0.0.1', port: 0 });
    base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
    a = await t.tenantWithKey([...SCOPES], 'Acme');
    b = await t.tenantWithKey([...SCOPES], 'Globex');
    receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        received.push(body);
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    flaky = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const status = failing ? 500 : 200;
        flakyRequests.push({ eventId: String(req.headers['webhook-id']), status });
        res.writeHead(status).end();
      });
    });
    await new Promise<void>((resolve) => flaky.listen(0, '127.0.0.1', resolve));
    mkdirSync(SHOTS, { recursive: true });
    profile = mkdtempSync(join(tmpdir(), 'console-chromium-'));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
      viewport: { width: 1280, height: 800 },
      timezoneId: 'Europe/Berlin',
      locale: 'en-US',
    });
    page = context.pages()[0] ?? (await context.newPage());
  }, BROWSER_TIMEOUT_MS);

  afterAll(async () => {
    await context?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await new Promise((resolve) => receiver?.close(resolve));
    await new Promise((resolve) => flaky?.close(resolve));
    await t?.close();
  });

  const shot = (name: string) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

  async function signIn(key: string) {
    await context.clearCookies();
    // The page on screen may itself be navigating (a console page whose session just ended goes to the sign-in
    // page), which aborts this navigation: go again.
    for (let attempt = 1; ; attempt++) {
      try {
        await page.goto(`${base}/console`);
        break;
      } catch (err) {
        if (attempt >= 3 || !String(err).includes('ERR_ABORTED')) throw err;
      }
    }
    await page.locator('#key').fill(key);
    await page.locator('#sign-in button[type=submit]').click();
    await page.locator('#sign-out').waitFor();
  }

  /** A gate of the tenant whose payer's policy caps calls at 100 USD cents, and the 409 its 500-cent call gets. */
  async function escalatedCall(auth: Record<string, string>) {
    const { payer, payee } = await gateParties(t, auth, 10_000);
    const policy = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer)}/policy`,
      headers: auth,
      payload: { currency: 'USD', perCallLimit: 100 },
    });
    expect(policy.statusCode, policy.body).toBe(200);
    const gate = await createGate(t, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 500 });
    const q = await quote(t, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };
    const refused = await post(t, auth, '/x402/gate/authorize-payment', body);
    expect(refused.statusCode, refused.body).toBe(409);
    return { payer, gateId: gate.gateId, body, escalationId: refused.json().details.escalationId as string };
  }

  it(
    'without a session /console is the sign-in page; a wrong key is refused there; GET / links the console',
    async () => {
      expect((await t.app.inject({ method: 'GET', url: '/' })).json().links.console).toBe('/console');
      await context.clearCookies();
      await page.goto(`${base}/console/escalations`);
      await expect(page.locator('#sign-in').isVisible()).resolves.toBe(true);
      await page.locator('#key').fill('sk_ak_notakeyatall0000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA');
      await page.locator('#sign-in button[type=submit]').click();
      await page.locator('#notice:not([hidden])').waitFor();
      expect(await page.locator('#notice').textContent()).toContain('not accepted');
      await shot('sign-in');
      // A key without a read scope (onboarding only) cannot sign in either.
      const writer = await t.app.inject({
        method: 'POST',
        url: '/ops/api-keys',
        headers: t.admin,
        payload: { tenantId: a.tenantId, scopes: ['onboarding'] },
      });
      await page.locator('#key').fill(writer.json().token);
      await page.locator('#sign-in button[type=submit]').click();
      await page.waitForFunction(() => document.getElementById('notice')?.textContent?.includes('no read scope'));
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    'a paid call that escalates appears in the inbox, is approved in the page, and the waiting authorization then succeeds',
    async () => {
      const call = await escalatedCall(a.auth);
      await signIn(a.token);

      // The session is a cookie the page's scripts cannot read, and it is not the key.
      const cookies = await context.cookies(base);
      expect(cookies).toHaveLength(1);
      expect(cookies[0]).toMatchObject({ name: 'as_console', httpOnly: true, sameSite: 'Strict', secure: true });
      expect(cookies[0]!.value).not.toContain(a.token.split('.')[1]!);
      expect(
        await page.evaluate(() => ({ cookie: document.cookie, stored: localStorage.length + sessionStorage.length })),
      ).toEqual({ cookie: '', stored: 0 });

      const row = page.locator(`tr[data-escalation-id="${call.escalationId}"]`);
      await row.waitFor();
      const text = await row.textContent();
      expect(text).toContain(call.payer);
      expect(text).toContain('$5.00'); // 500 minor units of USD
      expect(text).toContain('$5.00 is over the limit of $1.00 per payment'); // the rule it broke, in words
      expect(await row.locator('td.rule').getAttribute('data-rule')).toBe('perCallLimit');
      await shot('escalations');

      await row.locator('input[type=checkbox]').check();
      await page.locator('input[name=reason]').fill('known tool, one-off');
      await page.locator('#approve').click();
      const token = await page.locator(`[data-override-token="${call.escalationId}"]`).textContent();
      expect(token).toMatch(/^[\w-]+\.[\w-]+\.[\w-]+$/);
      await shot('escalation-approved');

      const paid = await post(t, a.auth, '/x402/gate/authorize-payment', {
        ...call.body,
        escalationOverrideToken: token,
      });
      expect(paid.statusCode, paid.body).toBe(200);
      const listed = await t.app.inject({
        method: 'GET',
        url: `/x402/gate/escalations?gateId=${call.gateId}`,
        headers: a.auth,
      });
      expect(listed.json().items[0]).toMatchObject({
        status: 'approved',
        resolution: { action: 'approve', reason: 'known tool, one-off' },
      });

      await page.goto(`${base}/console/gates/${call.gateId}`);
      await page.locator('[data-gate-status="authorized"]').waitFor();
      await shot('gate');
      await page.goto(`${base}/console/wallets/${encodeURIComponent(call.payer)}`);
      await page.locator('[data-available="USD"]').waitFor();
      expect(await page.locator('[data-available="USD"]').textContent()).toBe('$95.00'); // 10,000 credited, 500 reserved
      await shot('wallet');
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    'bulk: several selected escalations are denied at once with one reason',
    async () => {
      const calls = [await escalatedCall(a.auth), await escalatedCall(a.auth)];
      await signIn(a.token);
      for (const call of calls)
        await page.locator(`tr[data-escalation-id="${call.escalationId}"] input[type=checkbox]`).check();
      await page.locator('input[name=reason]').fill('not in budget');
      await page.locator('#deny').click();
      for (const call of calls)
        await page.locator(`li[data-outcome="denied"][data-escalation-id="${call.escalationId}"]`).waitFor();
      for (const call of calls) {
        const res = await t.app.inject({
          method: 'GET',
          url: `/x402/gate/escalations?gateId=${call.gateId}`,
          headers: a.auth,
        });
        expect(res.json().items[0]).toMatchObject({ status: 'denied', resolution: { reason: 'not in budget' } });
      }
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    "a tenant key cannot see another tenant's rows; the operator sees each tenant it opens",
    async () => {
      const mine = await escalatedCall(a.auth);
      const theirs = await escalatedCall(b.auth);
      await signIn(a.token);
      await page.locator(`tr[data-escalation-id="${mine.escalationId}"]`).waitFor();
      expect(await page.locator(`tr[data-escalation-id="${theirs.escalationId}"]`).count()).toBe(0);
      // Naming the other tenant, or opening its gate by id, shows nothing of it.
      await page.goto(`${base}/console/escalations?tenant=${b.tenantId}`);
      await page.locator('.error').waitFor();
      expect(await page.locator('.error').textContent()).toContain('not found');
      await page.goto(`${base}/console/gates/${theirs.gateId}`);
      await page.locator('.error').waitFor();
      expect(await page.locator('.error').textContent()).toContain('not found');
      expect(await page.locator('main').textContent()).not.toContain(theirs.payer);

      await signIn(t.env.adminKey);
      await page.goto(`${base}/console/escalations`);
      await page.locator(`a[href="/console/escalations?tenant=${b.tenantId}"]`).waitFor(); // the tenant picker
      await shot('tenant-picker');
      await page.locator(`a[href="/console/escalations?tenant=${b.tenantId}"]`).click();
      await page.locator(`tr[data-escalation-id="${theirs.escalationId}"]`).waitFor();
      expect(await page.locator(`tr[data-escalation-id="${mine.escalationId}"]`).count()).toBe(0);
      await page.goto(`${base}/console/tenants`);
      await page.locator(`text=${a.tenantId}`).waitFor();
      await shot('tenants');
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    'a forged, expired or signed-out session gets the sign-in page, and the API answers 401',
    async () => {
      await context.clearCookies();
      await context.addCookies([{ name: 'as_console', value: 'A'.repeat(43), url: base }]);
      await page.goto(`${base}/console/escalations`);
      await page.locator('#sign-in').waitFor();
      expect(await page.locator('#notice').textContent()).toContain('session ended');
      const api = await page.evaluate(async () => (await fetch('/x402/gate/escalations')).status);
      expect(api).toBe(401);

      // Expired: the session's Redis key is gone (its TTL ran out).
      await signIn(a.token);
      const sessions = await t.runtime.redis.keys(`${t.env.redisPrefix}:console:session:*`);
      expect(sessions.length).toBeGreaterThan(0);
      await t.runtime.redis.del(...sessions);
      await page.reload();
      await page.locator('#sign-in').waitFor();

      // Revoking the key ends its sessions.
      await signIn(a.token);
      const other = await t.app.inject({
        method: 'POST',
        url: '/ops/api-keys',
        headers: t.admin,
        payload: { tenantId: a.tenantId, scopes: ['x402:read'] },
      });
      await signIn(other.json().token);
      await t.app.inject({ method: 'POST', url: `/ops/api-keys/${other.json().keyId}/revoke`, headers: t.admin });
      await page.reload();
      await page.locator('#sign-in').waitFor();

      await signIn(a.token);
      await page.locator('#sign-out').click();
      await page.locator('#sign-in').waitFor();
      expect(await context.cookies(base)).toEqual([]);
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    'on a slow network, sign-in and sign-out wait for their scripts: the key never reaches a URL, the click is never lost',
    async () => {
      // Both pages are on screen before their modules run. Held back 1.5 s here; a CI run met the sign-out click
      // landing on a button nothing handled yet (and the sign-in form, submitted by the browser itself, was a GET).
      const late = async (route: Route) => {
        await new Promise((resolve) => setTimeout(resolve, 1_500));
        await route.continue();
      };
      await page.route('**/console/assets/sign-in.js', late);
      await page.route('**/console/assets/app.js', late);
      const urls: string[] = [];
      const seen = (request: Request) => urls.push(request.url());
      page.on('request', seen);
      try {
        await context.clearCookies();
        await page.goto(`${base}/console`, { waitUntil: 'commit' });
        await page.locator('#key').fill(a.token);
        expect(await page.locator('#sign-in button[type=submit]').isDisabled()).toBe(true);
        await page.locator('#sign-in button[type=submit]').click(); // waits until enabled
        await page.locator('#sign-out').waitFor();
        expect(await page.locator('#sign-out').isDisabled()).toBe(true);
        await page.locator('#sign-out').click();
        await page.locator('#sign-in').waitFor();
        expect(await context.cookies(base)).toEqual([]);
        expect(urls.length).toBeGreaterThan(0);
        expect(urls.filter((u) => u.includes(a.token) || u.includes('key='))).toEqual([]);
      } finally {
        page.off('request', seen);
        await page.unrouteAll({ behavior: 'wait' }); // the sign-in page after sign-out still waits for its script
      }
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    "a state-changing request without the session's CSRF token is refused and changes nothing",
    async () => {
      const call = await escalatedCall(a.auth);
      await signIn(a.token);
      const answers = await page.evaluate(async (id) => {
        const resolve = (headers: Record<string, string>) =>
          fetch(`/x402/gate/escalations/${id}/resolve`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', ...headers },
            body: JSON.stringify({ action: 'deny' }),
          });
        const without = await resolve({});
        const wrong = await resolve({ 'x-csrf-token': 'x'.repeat(43) });
        return { without: without.status, wrong: wrong.status, body: await without.json() };
      }, call.escalationId);
      expect(answers).toMatchObject({ without: 403, wrong: 403, body: { code: 'FORBIDDEN' } });
      const res = await t.app.inject({
        method: 'GET',
        url: `/x402/gate/escalations?gateId=${call.gateId}`,
        headers: a.auth,
      });
      expect(res.json().items[0].status).toBe('pending');
    },
    BROWSER_TIMEOUT_MS,
  );

  it("a session acts with exactly its key's scopes: a read-only key reads but cannot decide, even with the CSRF token", async () => {
    const call = await escalatedCall(a.auth);
    const reader = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: a.tenantId, scopes: ['x402:read'] },
    });
    const signedIn = await t.app.inject({
      method: 'POST',
      url: '/console/session',
      payload: { key: reader.json().token },
    });
    expect(signedIn.statusCode, signedIn.body).toBe(200);
    const cookie = String(signedIn.headers['set-cookie']).split(';')[0]!;
    const shell = await t.app.inject({ method: 'GET', url: '/console', headers: { cookie } });
    const csrf = /name="console-csrf" content="([^"]+)"/.exec(shell.body)![1]!;
    const read = await t.app.inject({
      method: 'GET',
      url: `/x402/gate/escalations?gateId=${call.gateId}`,
      headers: { cookie },
    });
    expect(read.json().items[0].escalationId).toBe(call.escalationId);
    const decide = await t.app.inject({
      method: 'POST',
      url: `/x402/gate/escalations/${call.escalationId}/resolve`,
      headers: { cookie, 'x-csrf-token': csrf },
      payload: { action: 'approve' },
    });
    expect(decide.statusCode).toBe(403);
    expect(decide.json()).toMatchObject({ code: 'FORBIDDEN', details: { requiredScope: 'x402:write' } });
    // Nor does the cookie open the operator's routes.
    expect((await t.app.inject({ method: 'GET', url: '/ops/tenants', headers: { cookie } })).statusCode).toBe(403);
  });

  it(
    'run detail (events, verification, settlement, ledger), webhook endpoints and their deliveries',
    async () => {
      const endpoint = await t.app.inject({
        method: 'POST',
        url: '/v1/webhooks',
        headers: a.auth,
        payload: {
          url: `http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`,
          events: ['x402.escalation.created', 'run.finalized'],
        },
      });
      expect(endpoint.statusCode, endpoint.body).toBe(201);
      const p = await parties(t, a.auth, 5_000);
      const runId = await finalizedRun(t, a.auth, p, { pass: true, amount: 1_250 });
      expect((await settle(t, a.auth, runId)).statusCode).toBeLessThan(300);
      await waitSettlement(t, a.auth, runId, (s) => s.status !== 'pending');
      const call = await escalatedCall(a.auth); // an event for the endpoint
      const runDelivery = async () =>
        ((await t.app.inject({ method: 'GET', url: `/v1/runs/${runId}/deliveries`, headers: a.auth })).json().items ??
          []) as Array<{ id: string; eventType: string }>;
      await until(async () => (await runDelivery()).some((d) => d.eventType === 'run.finalized'));
      const finalizedDelivery = (await runDelivery()).find((d) => d.eventType === 'run.finalized')!.id;

      await signIn(a.token);
      await page.goto(`${base}/console/runs/${runId}`);
      await page.locator('text=yes: every check passed').waitFor();
      const detail = await page.locator('main').textContent();
      expect(detail).toContain('$12.50');
      expect(detail).toContain('metric');
      // The run's own webhook deliveries, with the endpoint each went to.
      await page.locator(`#run-deliveries tr[data-delivery-id="${finalizedDelivery}"]`).waitFor();
      expect(await page.locator(`#run-deliveries tr[data-delivery-id="${finalizedDelivery}"]`).textContent()).toContain(
        endpoint.json().id,
      );
      await shot('run');

      // The receiver gets the escalation's event; then the endpoint's page lists that delivery as succeeded.
      await until(() => received.some((body) => body.includes(call.escalationId)));
      const delivered = async () =>
        (
          await t.app.inject({
            method: 'GET',
            url: `/v1/webhooks/${endpoint.json().id}/deliveries?status=succeeded`,
            headers: a.auth,
          })
        ).json().items as Array<{ id: string; eventType: string }>;
      await until(async () => (await delivered()).some((d) => d.eventType === 'x402.escalation.created'));
      const deliveryId = (await delivered()).find((d) => d.eventType === 'x402.escalation.created')!.id;
      await page.goto(`${base}/console/webhooks`);
      await shot('webhooks');
      await page.locator(`a[href="/console/webhooks/${endpoint.json().id}"]`).click();
      await page.locator(`tr[data-delivery-id="${deliveryId}"][data-status="succeeded"]`).waitFor();
      await shot('webhook-deliveries');
    },
    BROWSER_TIMEOUT_MS,
  );

  it("Bull Board (every tenant's jobs) opens for the admin key and its console session only, never a tenant key's session, even one with scope ops", async () => {
    const sessionCookie = async (key: string) => {
      const signedIn = await t.app.inject({ method: 'POST', url: '/console/session', payload: { key } });
      expect(signedIn.statusCode, signedIn.body).toBe(200);
      return String(signedIn.headers['set-cookie']).split(';')[0]!;
    };
    const board = ['/admin/queues', '/admin/queues/api/queues', '/admin/queues/queue/webhook-dispatch'];
    const opsKey = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: a.tenantId, scopes: ['x402:read', 'ops'] },
    });
    expect(opsKey.statusCode, opsKey.body).toBe(201);
    for (const key of [a.token, opsKey.json().token as string]) {
      const cookie = await sessionCookie(key);
      const basic = `Basic ${Buffer.from(`x:${key}`).toString('base64')}`;
      for (const url of board) {
        for (const headers of [{ cookie }, { authorization: basic }, { authorization: `Bearer ${key}` }]) {
          const res = await t.app.inject({ method: 'GET', url, headers });
          expect(res.statusCode, `${url} ${Object.keys(headers)[0]}`).toBe(403);
          expect(res.json().code).toBe('FORBIDDEN');
          expect(res.body).not.toContain('webhook-dispatch"');
        }
      }
    }
    const admin = await sessionCookie(t.env.adminKey);
    const adminBasic = `Basic ${Buffer.from(`ops:${t.env.adminKey}`).toString('base64')}`;
    for (const headers of [{ cookie: admin }, { authorization: adminBasic }]) {
      const res = await t.app.inject({ method: 'GET', url: '/admin/queues/api/queues', headers });
      expect(res.statusCode, res.body).toBe(200);
      expect(res.body).toContain('webhook-dispatch');
    }
    const none = await t.app.inject({ method: 'GET', url: '/admin/queues' });
    expect(none.statusCode).toBe(401);
    expect(none.headers['www-authenticate']).toContain('Basic');
    // The admin's page links Bull Board; a tenant key's page does not.
    expect((await t.app.inject({ method: 'GET', url: '/console', headers: { cookie: admin } })).body).toContain(
      'href="/admin/queues"',
    );
    expect(
      (await t.app.inject({ method: 'GET', url: '/console', headers: { cookie: await sessionCookie(a.token) } })).body,
    ).not.toContain('/admin/queues');
  });

  it(
    'the lists show the signed-in tenant\'s rows only, filter by agent, and "More" pages on with the cursor',
    async () => {
      const alice = await registerAgent(t, a.auth);
      const bob = await registerAgent(t, a.auth);
      const carol = await registerAgent(t, b.auth);
      const mine: string[] = [];
      for (let i = 0; i < 5; i++)
        mine.push(await createRun(t, a.auth, { agentId: i % 2 === 0 ? alice.agentId : bob.agentId }));
      const theirs = await createRun(t, b.auth, { agentId: carol.agentId });
      const ofTenantA = (await t.app.inject({ method: 'GET', url: '/v1/runs?limit=100', headers: a.auth }))
        .json()
        .items.map((r: { runId: string }) => r.runId) as string[];

      await signIn(a.token);
      await page.goto(`${base}/console/runs?limit=2`);
      const rows = page.locator('tr[data-row-id]');
      await rows.first().waitFor();
      expect(await rows.count()).toBe(2);
      // "More" until the list ends: every run of this tenant once, newest first, none of the other tenant's.
      for (let shown = 2; shown < ofTenantA.length; shown = Math.min(shown + 2, ofTenantA.length)) {
        await page.locator('#more').click();
        await page.waitForFunction(
          (n) => document.querySelectorAll('tr[data-row-id]').length >= n,
          Math.min(shown + 2, ofTenantA.length),
        );
      }
      await page.locator('#more').waitFor({ state: 'hidden' });
      const listed = await rows.evaluateAll((trs) => trs.map((tr) => (tr as HTMLElement).dataset.rowId!));
      expect(listed).toEqual(ofTenantA);
      for (const runId of mine) expect(listed).toContain(runId);
      expect(listed).not.toContain(theirs);
      await shot('runs');

      // The search form: Alice's runs only (the filter lands in the URL, so the page can be shared or reloaded).
      await page.locator('#search input[name=agentId]').fill(alice.agentId);
      await page.locator('#search button[type=submit]').click();
      await page.waitForURL(/agentId=/);
      await rows.first().waitFor();
      while (await page.locator('#more').isVisible()) {
        const before = await rows.count();
        await page.locator('#more').click();
        await page.waitForFunction((n) => document.querySelectorAll('tr[data-row-id]').length > n, before);
      }
      const ofAlice = await rows.evaluateAll((trs) => trs.map((tr) => (tr as HTMLElement).dataset.rowId!));
      expect(ofAlice.sort()).toEqual([mine[0], mine[2], mine[4]].sort());
      // A row opens the run.
      await page.locator(`a[href="/console/runs/${mine[0]}"]`).click();
      await page.locator(`h1:has-text("${mine[0]}")`).waitFor();

      // Every other list: rows of this tenant only, and a clear empty state where there is nothing.
      await page.goto(`${base}/console/agents`);
      await page.locator(`tr[data-row-id="${alice.agentId}"]`).waitFor();
      expect(await page.locator(`tr[data-row-id="${carol.agentId}"]`).count()).toBe(0);
      await shot('agents');
      for (const kind of ['gates', 'settlements', 'disputes', 'sessions']) {
        await page.goto(`${base}/console/${kind}`);
        await page.locator('main table, main .empty').first().waitFor();
        expect(await page.locator('main').textContent()).not.toContain(carol.agentId);
        await shot(kind);
      }
      // Nonsense filters get the service's 4xx explained in the page, not a blank screen.
      await page.goto(
        `${base}/console/runs?createdAfter=2030-01-02T00:00:00.000Z&createdBefore=2030-01-01T00:00:00.000Z`,
      );
      await page.locator('main .error').waitFor();

      // The operator reads the same list of one tenant through /ops.
      await signIn(t.env.adminKey);
      await page.goto(`${base}/console/runs?tenant=${b.tenantId}`);
      await page.locator(`tr[data-row-id="${theirs}"]`).waitFor();
      expect(await page.locator(`tr[data-row-id="${mine[0]}"]`).count()).toBe(0);
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    'bulk from the inbox: deadline and time left shown; a row decided meanwhile is reported stale and left alone; the operator decides as admin',
    async () => {
      const calls = [await escalatedCall(a.auth), await escalatedCall(a.auth)];
      await signIn(a.token);
      for (const call of calls) {
        const row = page.locator(`tr[data-escalation-id="${call.escalationId}"]`);
        await row.waitFor();
        expect(await row.textContent()).toMatch(/\d+ min left/); // the default deadline is 15 minutes away
        await row.locator('input.pick').check();
      }
      // Someone else denies the first one after the page was drawn.
      const meanwhile = await post(t, a.auth, `/x402/gate/escalations/${calls[0]!.escalationId}/resolve`, {
        action: 'deny',
        reason: 'decided elsewhere',
      });
      expect(meanwhile.statusCode, meanwhile.body).toBe(200);
      // No reason, no decision.
      await page.locator('#approve').click();
      await page.locator('#results .notice').waitFor();
      expect(await page.locator('#results').textContent()).toContain('reason');
      await page.locator('input[name=reason]').fill('vendor confirmed');
      await page.locator('#approve').click();
      await page
        .locator(`li[data-outcome="already_decided"][data-escalation-id="${calls[0]!.escalationId}"]`)
        .waitFor();
      await page.locator(`li[data-outcome="approved"][data-escalation-id="${calls[1]!.escalationId}"]`).waitFor();
      expect(await page.locator('#stale').textContent()).toContain('1 of 2');
      expect(
        await page.locator(`tr[data-escalation-id="${calls[0]!.escalationId}"][data-status="stale"]`).textContent(),
      ).toContain('already decided');
      expect(await page.locator(`[data-override-token="${calls[1]!.escalationId}"]`).textContent()).toMatch(
        /^[\w-]+\.[\w-]+\.[\w-]+$/,
      );
      // The decided row now says who decided and why.
      const decided = page.locator(`tr[data-escalation-id="${calls[1]!.escalationId}"][data-status="approved"]`);
      await decided.waitFor();
      expect(await decided.textContent()).toContain(`by key ${a.keyId}`);
      expect(await decided.textContent()).toContain('reason: vendor confirmed');
      await shot('escalations-bulk');
      const stale = await t.app.inject({
        method: 'GET',
        url: `/x402/gate/escalations?gateId=${calls[0]!.gateId}`,
        headers: a.auth,
      });
      expect(stale.json().items[0]).toMatchObject({ status: 'denied', resolution: { reason: 'decided elsewhere' } });

      // Decided ones, with who decided, under the "denied" filter.
      await page.goto(`${base}/console/escalations?status=denied`);
      const denied = page.locator(`tr[data-escalation-id="${calls[0]!.escalationId}"]`);
      await denied.waitFor();
      expect(await denied.textContent()).toContain('reason: decided elsewhere');

      // The operator: the bulk route under /ops, recorded as decided by admin.
      const theirs = await escalatedCall(b.auth);
      await signIn(t.env.adminKey);
      await page.goto(`${base}/console/escalations?tenant=${b.tenantId}`);
      await page.locator(`tr[data-escalation-id="${theirs.escalationId}"] input.pick`).check();
      await page.locator('input[name=reason]').fill('over budget');
      await page.locator('#deny').click();
      await page.locator(`li[data-outcome="denied"][data-escalation-id="${theirs.escalationId}"]`).waitFor();
      expect(await page.locator(`tr[data-escalation-id="${theirs.escalationId}"]`).textContent()).toContain(
        'by the operator',
      );
      const res = await t.app.inject({
        method: 'GET',
        url: `/x402/gate/escalations?gateId=${theirs.gateId}`,
        headers: b.auth,
      });
      expect(res.json().items[0]).toMatchObject({
        status: 'denied',
        resolution: { by: 'admin', reason: 'over budget' },
      });
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    'deliveries: a failed delivery is resent from the page and the receiver gets the same event; failed ones since a time are recovered with progress',
    async () => {
      failing = true;
      const endpoint = await t.app.inject({
        method: 'POST',
        url: '/v1/webhooks',
        headers: a.auth,
        payload: {
          url: `http://127.0.0.1:${(flaky.address() as { port: number }).port}/hook`,
          events: ['run.finalized'],
        },
      });
      expect(endpoint.statusCode, endpoint.body).toBe(201);
      const endpointId = endpoint.json().id as string;
      await signIn(a.token);
      await page.goto(`${base}/console/webhooks/${endpointId}`);
      await page.locator('#send-test').click();
      const deliveryId = await page.locator('[data-test-delivery]').getAttribute('data-test-delivery');
      // The receiver answers 500 to every attempt; the page reads the deliveries back until the delivery has failed.
      const failedRow = page.locator(`tr[data-delivery-id="${deliveryId}"][data-status="failed"]`);
      await failedRow.waitFor({ timeout: 90_000 });
      const eventId = (await failedRow.getAttribute('data-event-id'))!;
      expect(flakyRequests.filter((r) => r.eventId === eventId && r.status === 500).length).toBeGreaterThan(1);
      await shot('webhook-failed');

      failing = false;
      await failedRow.locator('button.resend').click();
      await page.locator(`[data-resent="${deliveryId}"]`).waitFor();
      await until(() => flakyRequests.some((r) => r.eventId === eventId && r.status === 200));
      await page.locator(`tr[data-delivery-id="${deliveryId}"][data-status="succeeded"]`).waitFor({ timeout: 90_000 });
      await shot('webhook-resent');

      // Recover: another delivery fails, the receiver comes back, "recover failed since" sends it again.
      failing = true;
      await page.locator('#send-test').click();
      await page.waitForFunction((first) => {
        const d = document.querySelector('[data-test-delivery]') as HTMLElement | null;
        return d && d.dataset.testDelivery !== first;
      }, deliveryId);
      const second = (await page.locator('[data-test-delivery]').getAttribute('data-test-delivery'))!;
      await page.locator(`tr[data-delivery-id="${second}"][data-status="failed"]`).waitFor({ timeout: 90_000 });
      failing = false;
      await page.locator('#recover button[type=submit]').click();
      const finished = page.locator('[data-recovery-status="finished"]');
      await finished.waitFor({ timeout: 90_000 });
      await page.waitForFunction(
        () =>
          document
            .querySelector('[data-recovery-status="finished"]')
            ?.textContent?.includes('1 sent again; of those 1 delivered'),
        undefined,
        { timeout: 90_000 },
      );
      await page.locator(`tr[data-delivery-id="${second}"][data-status="succeeded"]`).waitFor({ timeout: 90_000 });
      const secondEvent = (await page.locator(`tr[data-delivery-id="${second}"]`).getAttribute('data-event-id'))!;
      expect(flakyRequests.some((r) => r.eventId === secondEvent && r.status === 200)).toBe(true);
      expect(await page.locator('main').textContent()).not.toMatch(/\bnull\b|undefined/);
      await shot('webhook-recovered');
    },
    2 * BROWSER_TIMEOUT_MS,
  );
});
