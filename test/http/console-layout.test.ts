import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { appendEvents, createRun, events, registerAgent, waitFinalized } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { credit, settle, waitSettlement } from '../helpers/money.ts';
import { createGate, post, quote } from '../x402/helpers.ts';

// The console on a laptop and on a desktop screen (1366×768, 1920×1080), in Debian's chromium driven by
// playwright-core, against the service on loopback with the data an operator meets: long agent ids, a settled run
// under dispute, a held one, an escalation, a wallet policy with allow-lists, payment sessions open and closed, a
// webhook endpoint. Every screen must fit: nothing wider than the window, the top bar on one line, every table's last
// column on screen. Also the screens' content: the payer named once per escalation, policies as rules, a session's
// charges and statement, run events with their payloads folded. Screens go to .data/console-screenshots/layout-*.

const CHROMIUM = '/usr/bin/chromium';
const SHOTS = join(process.cwd(), '.data', 'console-screenshots');
const SCOPES = ['agents:write', 'runs:write', 'x402:write', 'wallets:write', 'webhooks:write'] as const;
const BROWSER_TIMEOUT_MS = 180_000;
const SIZES = [
  { width: 1366, height: 768 },
  { width: 1920, height: 1080 },
];

interface Fit {
  viewport: number;
  problems: string[];
}

/** What breaks the fit of the screen on show, measured in the page (an empty `problems` is a screen that fits). */
function measureFit(): Fit {
  const viewport = document.documentElement.clientWidth;
  const problems: string[] = [];
  const scrollWidth = document.documentElement.scrollWidth;
  if (scrollWidth > viewport) problems.push(`the document is ${scrollWidth} px wide in a ${viewport} px window`);
  const main = document.querySelector('main')!;
  if (main.scrollWidth > main.clientWidth + 1)
    problems.push(`main scrolls sideways (${main.scrollWidth} px of content in ${main.clientWidth} px)`);
  const header = document.querySelector('body > header');
  if (header) {
    const items = [...header.querySelectorAll('.brand, nav a, .who, button')].filter(
      (e) => (e as HTMLElement).offsetParent !== null,
    );
    const first = items[0]!.getBoundingClientRect();
    for (const item of items) {
      const r = item.getBoundingClientRect();
      if (r.top >= first.bottom) problems.push(`the top bar wraps: "${item.textContent}" is on a second line`);
      if (r.right > viewport) problems.push(`the top bar's "${item.textContent}" is past the window's edge`);
    }
    const line = parseFloat(getComputedStyle(header).lineHeight) || 20;
    if (header.getBoundingClientRect().height > 3 * line)
      problems.push(`the top bar is ${header.getBoundingClientRect().height} px tall`);
  }
  const paddingRight = parseFloat(getComputedStyle(main).paddingRight);
  const contentRight = Math.min(viewport, main.getBoundingClientRect().right - paddingRight);
  for (const table of main.querySelectorAll('table')) {
    const last = table.querySelector('thead tr > :last-child');
    if (!last) continue;
    const r = last.getBoundingClientRect();
    const name = `${table.closest('section, div[id]')?.id || 'table'} column ${last.parentElement!.children.length}`;
    if (!last.checkVisibility() || r.width === 0) problems.push(`${name} is hidden`);
    if (r.right > contentRight + 1) problems.push(`${name} ends at ${r.right} px, past ${contentRight} px`);
  }
  return { viewport, problems };
}

describe('console layout on laptop and desktop screens', () => {
  let t: TestApp;
  let base: string;
  let context: BrowserContext;
  let page: Page;
  let profile: string;
  let tenant: Awaited<ReturnType<TestApp['tenantWithKey']>>;
  // A receiver that is down (500 to everything): the endpoint's deliveries fail, with their errors to show.
  let receiver: Server;
  const seen: Record<string, string> = {};

  async function agent(name: string) {
    return registerAgent(t, tenant.auth, name);
  }

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
    receiver = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(500, { 'content-type': 'text/plain' }).end('upstream database unavailable'));
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    await t.app.listen({ host: '127.0.0.1', port: 0 });
    base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
    tenant = await t.tenantWithKey([...SCOPES], 'Acme Research Laboratories (EU, production)');
    const tag = randomBytes(3).toString('hex');
    const payer = await agent(`procurement-orchestrator-primary-${tag}`);
    const worker = await agent(`literature-review-summarizer-large-${tag}`);
    const tool = await agent(`web-search-tool-provider-eu-west-${tag}`);
    await credit(t, payer.agentId, 5_000_000);
    seen.payer = payer.agentId;
    // Subscribed before anything happens, so the run's, the settlement's and the escalation's events reach it.
    const endpoint = await post(t, tenant.auth, '/v1/webhooks', {
      url: `http://127.0.0.1:${(receiver.address() as { port: number }).port}/settlement-service/v1/inbound-events?source=agent-settlement`,
      events: ['run.finalized', 'settlement.completed', 'settlement.held', 'dispute.opened', 'x402.escalation.created'],
      description: 'production receiver',
    });
    expect(endpoint.statusCode, endpoint.body).toBe(201);
    seen.endpointId = endpoint.json().id;
    seen.worker = worker.agentId;
    seen.tool = tool.agentId;

    // A run with evidence of several kinds, settled with a holdback, then disputed by the payer.
    const runId = await createRun(t, tenant.auth, {
      agentId: worker.agentId,
      terms: { accuracy: { min: 0.9 }, latencyP95: { max: 1200 } },
      settlement: {
        payerAgentId: payer.agentId,
        amount: 125_000,
        currency: 'USD',
        holdbackBps: 1000,
        disputeWindowSeconds: 86_400,
      },
    });
    const evidence = events(runId, { seq: 0, chainHash: null }, worker, [
      {
        type: 'tool_call',
        payload: {
          tool: 'search/scholar',
          arguments: { query: 'randomised controlled trials of intermittent fasting in adults over 65, 2015-2025' },
          resultCount: 48,
          topResultUrl: 'https://scholar.example.org/citations?view_op=view_citation&hl=en&user=abcdefghijklmnop',
        },
      },
      { type: 'sample', payload: { latencyMs: 840, correct: true } },
      { type: 'log', payload: { level: 'info', message: 'summary drafted; 12 sources kept of 48 read' } },
      { type: 'metric', payload: { name: 'latencyP95', value: 910 } },
      { type: 'metric', payload: { name: 'accuracy', value: 0.96 } },
    ]);
    expect((await appendEvents(t, tenant.auth, runId, evidence)).statusCode).toBe(201);
    expect((await post(t, tenant.auth, `/v1/runs/${runId}/finalize`, {})).statusCode).toBe(202);
    await waitFinalized(t, tenant.auth, runId);
    expect((await settle(t, tenant.auth, runId)).statusCode).toBeLessThan(300);
    await waitSettlement(t, tenant.auth, runId, (s) => s.status === 'completed');
    const dispute = await post(t, tenant.auth, `/v1/runs/${runId}/disputes`, {
      reason: 'two of the twelve cited sources do not support the claims they are cited for',
    });
    expect(dispute.statusCode, dispute.body).toBe(201);
    seen.runId = runId;

    // The payer's policy: limits and allow-lists, so a large call escalates.
    const policy = await t.app.inject({
      method: 'PUT',
      url: `/x402/wallets/${encodeURIComponent(payer.agentId)}/policy`,
      headers: tenant.auth,
      payload: {
        currency: 'USD',
        perCallLimit: 10_000,
        dailyLimit: 500_000,
        allowedPayeeAgentIds: [tool.agentId, worker.agentId],
        allowedToolIds: ['search/web', 'search/scholar'],
        escalationTimeoutSeconds: 900,
      },
    });
    expect(policy.statusCode, policy.body).toBe(200);
    // Three paid calls that break it three ways, each waiting in the inbox.
    const escalate = async (payeeAgentId: string, amount: number, toolId: string) => {
      const gate = await createGate(t, tenant.auth, { payerAgentId: payer.agentId, payeeAgentId, amount, toolId });
      const q = await quote(t, tenant.auth, gate.gateId);
      const refused = await post(t, tenant.auth, '/x402/gate/authorize-payment', {
        gateId: gate.gateId,
        quoteId: q.quoteId,
        requestSha256: q.requestSha256,
      });
      expect(refused.statusCode, refused.body).toBe(409);
      return { gateId: gate.gateId, escalationId: refused.json().details.escalationId as string };
    };
    const stranger = await agent(`translation-service-unvetted-${tag}`);
    await escalate(stranger.agentId, 4_000, 'search/web');
    await escalate(tool.agentId, 900, 'translate/deepl');
    const overLimit = await escalate(tool.agentId, 25_000, 'search/web');
    seen.gateId = overLimit.gateId;
    seen.escalationId = overLimit.escalationId;

    // Payment sessions: one open with charges, one closed with its statement.
    const openSession = async () => {
      const res = await post(
        t,
        tenant.auth,
        '/x402/sessions',
        {
          payerAgentId: payer.agentId,
          payeeAgentIds: [tool.agentId, worker.agentId],
          currency: 'USD',
          budget: 50_000,
          maxPerCall: 500,
        },
        { 'idempotency-key': randomBytes(8).toString('hex') },
      );
      expect(res.statusCode, res.body).toBe(201);
      return res.json().sessionId as string;
    };
    const charge = async (sessionId: string, i: number) => {
      const res = await post(t, tenant.auth, `/x402/sessions/${sessionId}/charges`, {
        paymentId: `search-call-2026-11-28-${String(i).padStart(4, '0')}`,
        payeeAgentId: i % 3 === 0 ? worker.agentId : tool.agentId,
        amount: 120 + i * 7,
      });
      expect(res.statusCode, res.body).toBe(201);
    };
    seen.openSession = await openSession();
    for (let i = 1; i <= 6; i++) await charge(seen.openSession, i);
    seen.closedSession = await openSession();
    for (let i = 1; i <= 4; i++) await charge(seen.closedSession, i);
    const closed = await post(t, tenant.auth, `/x402/sessions/${seen.closedSession}/close`, {});
    expect(closed.statusCode, closed.body).toBe(200);
    // More charges than the page reads at once (50).
    seen.busySession = await openSession();
    for (let from = 1; from <= 53; from += 10)
      await Promise.all(Array.from({ length: Math.min(10, 54 - from) }, (_, i) => charge(seen.busySession!, from + i)));

    mkdirSync(SHOTS, { recursive: true });
    profile = mkdtempSync(join(tmpdir(), 'console-layout-'));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
      viewport: SIZES[0]!,
      timezoneId: 'Europe/Berlin',
      locale: 'en-US',
    });
    page = context.pages()[0] ?? (await context.newPage());
  }, BROWSER_TIMEOUT_MS);

  afterAll(async () => {
    await context?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await new Promise((resolve) => receiver?.close(resolve));
    await t?.close();
  });

  async function signIn(key: string) {
    await context.clearCookies();
    await page.goto(`${base}/console`);
    await page.locator('#key').fill(key);
    await page.locator('#sign-in button[type=submit]').click();
    await page.locator('#sign-out').waitFor();
  }

  /** Every screen, with what shows it is drawn (its data, not "Loading…"). */
  const screens = () => {
    const tq = `tenant=${tenant.tenantId}`;
    const enc = encodeURIComponent;
    return [
      ['escalations', `/console/escalations?${tq}`, `tr[data-escalation-id="${seen.escalationId}"]`],
      ['escalations-all', `/console/escalations?status=all&${tq}`, `tr[data-escalation-id="${seen.escalationId}"]`],
      ['runs', `/console/runs?${tq}`, `tr[data-row-id="${seen.runId}"]`],
      ['run', `/console/runs/${seen.runId}?${tq}`, 'text=yes: every check passed'],
      ['agents', `/console/agents?${tq}`, `tr[data-row-id="${seen.payer}"]`],
      ['gates', `/console/gates?${tq}`, `tr[data-row-id="${seen.gateId}"]`],
      ['gate', `/console/gates/${seen.gateId}?${tq}`, '[data-gate-status]'],
      ['sessions', `/console/sessions?${tq}`, `tr[data-row-id="${seen.openSession}"]`],
      ['session-open', `/console/sessions/${seen.openSession}?${tq}`, '#charges tr[data-charge-seq="6"]'],
      ['session-closed', `/console/sessions/${seen.closedSession}?${tq}`, '#statement'],
      ['settlements', `/console/settlements?${tq}`, 'main tr[data-row-id]'],
      ['settlement', `/console/settlements?run=${seen.runId}&${tq}`, 'main .fields'],
      ['disputes', `/console/disputes?${tq}`, 'main tr[data-row-id]'],
      ['wallets', `/console/wallets?${tq}`, 'main form.lookup'],
      ['wallet', `/console/wallets/${enc(seen.payer!)}?${tq}`, 'ul.rules'],
      ['webhooks', `/console/webhooks?${tq}`, `a[href^="/console/webhooks/${seen.endpointId}"]`],
      ['endpoint', `/console/webhooks/${seen.endpointId}?${tq}`, '#deliveries tr[data-status="failed"]'],
      ['tenants', '/console/tenants', `text=${tenant.tenantId}`],
    ] as const;
  };

  for (const size of SIZES) {
    it(
      `at ${size.width}×${size.height} every screen fits: no sideways scroll, a one-line top bar, every table's last column on screen`,
      async () => {
        await page.setViewportSize(size);
        // The operator's bar is the longest (Tenants and Queues besides the tenant's links).
        await signIn(t.env.adminKey);
        const failures: string[] = [];
        for (const [name, path, ready] of screens()) {
          await page.goto(`${base}${path}`);
          await page.locator(ready).first().waitFor();
          const fit = await page.evaluate(measureFit);
          expect(fit.viewport).toBeLessThanOrEqual(size.width);
          failures.push(...fit.problems.map((p) => `${name}: ${p}`));
          await page.screenshot({ path: join(SHOTS, `layout-${size.width}-${name}.png`), fullPage: true });
        }
        // A tenant key's bar names its tenant and key instead.
        await signIn(tenant.token);
        await page.goto(`${base}/console/settlements`);
        await page.locator('main tr[data-row-id]').first().waitFor();
        failures.push(...(await page.evaluate(measureFit)).problems.map((p) => `settlements (tenant key): ${p}`));
        expect(failures).toEqual([]);
      },
      BROWSER_TIMEOUT_MS,
    );
  }

  it(
    'the measure fails a screen that does not fit: a table too wide, a bar on two lines',
    async () => {
      // The check itself must be able to fail: a page made too wide and a bar forced to wrap are both reported.
      await page.setViewportSize(SIZES[0]!);
      await signIn(tenant.token);
      await page.goto(`${base}/console/settlements`);
      await page.locator('main tr[data-row-id]').first().waitFor();
      // Through the CSSOM: the console's CSP refuses style attributes.
      await page.evaluate(() => {
        document.querySelector<HTMLElement>('main table')!.style.minWidth = '2400px';
        document.querySelector<HTMLElement>('body > header')!.style.flexWrap = 'wrap';
        document.querySelector<HTMLElement>('body > header nav')!.style.width = '1300px';
      });
      const fit = await page.evaluate(measureFit);
      expect(fit.problems.some((p) => p.includes('main scrolls sideways'))).toBe(true);
      expect(fit.problems.some((p) => p.includes('column 9') && p.includes('past'))).toBe(true);
      expect(fit.problems.some((p) => p.includes('the top bar wraps'))).toBe(true);
    },
    BROWSER_TIMEOUT_MS,
  );

  it(
    "the screens say it plainly: the settlement's dispute, the payer once, policies as rules, a session's charges and statement, run events' payloads folded",
    async () => {
      await page.setViewportSize(SIZES[0]!);
      await signIn(tenant.token);

      await page.goto(`${base}/console/settlements`);
      const settled = page.locator(`main tr[data-row-id]`, { hasText: seen.runId! });
      await settled.waitFor();
      expect(await settled.locator('td:last-child').textContent()).toContain('open: two of the twelve cited sources');

      // The escalation: its payer once (linked to the wallet it pays from), the rule it broke in words.
      await page.goto(`${base}/console/escalations`);
      const row = page.locator(`tr[data-escalation-id="${seen.escalationId}"]`);
      await row.waitFor();
      const rowText = (await row.textContent())!;
      expect(rowText.split(seen.payer!).length - 1).toBe(1);
      expect(await row.locator(`td.payer a[href*="/console/wallets/"]`).textContent()).toBe(seen.payer);
      expect(await row.locator('td.rule').getAttribute('data-rule')).toBe('perCallLimit');
      expect(await row.locator('td.rule').textContent()).toContain('$250.00 is over the limit of $100.00 per payment');

      // The wallet's policy as rules, not JSON.
      await page.goto(`${base}/console/wallets/${encodeURIComponent(seen.payer!)}`);
      const rules = page.locator('ul.rules');
      await rules.waitFor();
      const ruleText = (await rules.innerText()).replace(/\s+/g, ' ');
      expect(ruleText).toContain('at most $100.00 per payment');
      expect(ruleText).toContain('at most $5,000.00 per day');
      expect(ruleText).toContain('only these payees (2):');
      expect(ruleText).toContain(seen.tool);
      expect(ruleText).toContain('only these tools (2): search/web search/scholar');
      expect(ruleText).toContain('waits 15 min in the escalation inbox');
      expect(await page.locator('main').textContent()).not.toMatch(/[{}"]|perCallLimit|allowedPayeeAgentIds/);

      // An open session: its charges, newest first, each with its payee, amount and payment id; no statement yet.
      await page.goto(`${base}/console/sessions/${seen.openSession}`);
      await page.locator('#charges tr[data-charge-seq="6"]').waitFor();
      const seqs = await page
        .locator('#charges tbody tr')
        .evaluateAll((trs) => trs.map((tr) => Number((tr as HTMLElement).dataset.chargeSeq)));
      expect(seqs).toEqual([6, 5, 4, 3, 2, 1]);
      const sixth = (await page.locator('#charges tr[data-charge-seq="6"]').textContent())!;
      expect(sixth).toContain('search-call-2026-11-28-0006');
      expect(sixth).toContain('$1.62'); // 120 + 6 × 7 cents
      expect(sixth).toContain(seen.worker);
      expect(await page.locator('main').textContent()).toContain('Signed when the session closes');

      // A busy one: 50 charges, then "More" reads the other 3 with the cursor.
      await page.goto(`${base}/console/sessions/${seen.busySession}`);
      await page.locator('#charges tr[data-charge-seq="53"]').waitFor();
      expect(await page.locator('#charges tbody tr').count()).toBe(50);
      await page.locator('#more-charges').click();
      await page.locator('#charges tr[data-charge-seq="1"]').waitFor();
      expect(await page.locator('#charges tbody tr').count()).toBe(53);
      expect(await page.locator('#more-charges').isHidden()).toBe(true);

      // A closed one: the statement (totals, refund, per payee, hash and signer) beside its charges.
      await page.goto(`${base}/console/sessions/${seen.closedSession}`);
      const statement = page.locator('#statement');
      await statement.waitFor();
      const api = await t.app.inject({
        method: 'GET',
        url: `/x402/sessions/${seen.closedSession}/statement`,
        headers: tenant.auth,
      });
      expect(await statement.getAttribute('data-statement-hash')).toBe(api.json().statementHash);
      const statementText = (await statement.textContent())!;
      expect(statementText).toContain('$5.50 in 4 charges'); // 127 + 134 + 141 + 148
      expect(statementText).toContain('$494.50'); // 50,000 − 550 returned
      expect(statementText).toContain(api.json().signature.keyId);
      expect(await page.locator('#charges tbody tr').count()).toBe(4);

      // The run's events: each payload folded to one line, the whole JSON when opened.
      await page.goto(`${base}/console/runs/${seen.runId}`);
      const toolCall = page.locator('tr[data-event-seq="1"] details');
      await toolCall.waitFor();
      expect(await toolCall.locator('summary').textContent()).toContain('tool: search/scholar');
      expect(await toolCall.locator('pre').isVisible()).toBe(false);
      await toolCall.locator('summary').click();
      expect(await toolCall.locator('pre').isVisible()).toBe(true);
      expect(JSON.parse((await toolCall.locator('pre').textContent())!)).toMatchObject({
        tool: 'search/scholar',
        resultCount: 48,
      });
      expect(await page.locator('main').textContent()).toContain('accuracy ≥ 0.9, latencyP95 ≤ 1200');
      await page.screenshot({ path: join(SHOTS, 'layout-1366-run-payload-open.png'), fullPage: true });

      // The README's picture (docs/console.png is copied from it): the inbox as a laptop shows it.
      await page.goto(`${base}/console/escalations`);
      await page.locator(`tr[data-escalation-id="${seen.escalationId}"]`).waitFor();
      await page.screenshot({ path: join(SHOTS, 'console-1366x768.png') });
      expect(await page.locator('main').textContent()).not.toMatch(/\bnull\b|undefined/);
    },
    BROWSER_TIMEOUT_MS,
  );

  it('GET /x402/sessions/{id}/charges: newest first a page at a time, its tenant only, x402:read, cursors of its own', async () => {
    const url = `/x402/sessions/${seen.openSession}/charges`;
    const first = await t.app.inject({ method: 'GET', url: `${url}?limit=4`, headers: tenant.auth });
    expect(first.statusCode, first.body).toBe(200);
    expect(first.json().items.map((c: { seq: number }) => c.seq)).toEqual([6, 5, 4, 3]);
    expect(first.json().items[0]).toMatchObject({
      chargeId: `${seen.openSession}#6`,
      state: 'charged',
      paymentId: 'search-call-2026-11-28-0006',
      payeeAgentId: seen.worker,
      amount: 162,
      currency: 'USD',
    });
    expect(first.json().items[0].receiptHash).toMatch(/^[0-9a-f]{64}$/);
    const second = await t.app.inject({
      method: 'GET',
      url: `${url}?limit=4&cursor=${first.json().nextCursor}`,
      headers: tenant.auth,
    });
    expect(second.json()).toMatchObject({ nextCursor: null });
    expect(second.json().items.map((c: { seq: number }) => c.seq)).toEqual([2, 1]);
    // A closed session still lists what its statement lists.
    const closed = await t.app.inject({
      method: 'GET',
      url: `/x402/sessions/${seen.closedSession}/charges`,
      headers: tenant.auth,
    });
    expect(closed.json().items.map((c: { seq: number }) => c.seq)).toEqual([4, 3, 2, 1]);

    // Another session's cursor is not one of this list's.
    const closedPage = await t.app.inject({
      method: 'GET',
      url: `/x402/sessions/${seen.closedSession}/charges?limit=1`,
      headers: tenant.auth,
    });
    const foreign = await t.app.inject({
      method: 'GET',
      url: `${url}?cursor=${closedPage.json().nextCursor}`,
      headers: tenant.auth,
    });
    expect(foreign.statusCode).toBe(422);
    expect(foreign.json()).toMatchObject({ code: 'VALIDATION_FAILED' });
    // Another tenant: not found; a key without x402:read: forbidden.
    const other = await t.tenantWithKey([...SCOPES], 'Globex');
    expect((await t.app.inject({ method: 'GET', url, headers: other.auth })).statusCode).toBe(404);
    const runsOnly = await t.app.inject({
      method: 'POST',
      url: '/ops/api-keys',
      headers: t.admin,
      payload: { tenantId: tenant.tenantId, scopes: ['runs:write'] },
    });
    const forbidden = await t.app.inject({
      method: 'GET',
      url,
      headers: { authorization: `Bearer ${runsOnly.json().token}` },
    });
    expect(forbidden.statusCode).toBe(403);
    expect(forbidden.json()).toMatchObject({ code: 'FORBIDDEN', details: { requiredScope: 'x402:read' } });
  });
});
