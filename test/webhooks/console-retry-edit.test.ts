import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { startReceiver, waitUntil, type Receiver } from './harness.ts';

// The console's webhook controls in a real browser (Debian's chromium, playwright-core) against the service on
// loopback: "Retry now" on a delivery whose next attempt is an hour away, and "Edit" changing the endpoint's URL,
// events and description in place, its deliveries still listed.

const BROWSER_TIMEOUT_MS = 120_000;

describe('console: retry now and edit an endpoint', () => {
  let t: TestApp;
  let base: string;
  let context: BrowserContext;
  let page: Page;
  let profile: string;
  const receivers: Receiver[] = [];

  beforeAll(async () => {
    t = await startTestApp({
      workers: ['webhook-dispatch'],
      overrides: {
        RATE_LIMIT_MAX: '100000',
        WEBHOOK_ALLOW_INSECURE_URLS: 'true',
        WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
        WEBHOOK_RETRY_SCALE: '1',
      },
    });
    await t.app.listen({ host: '127.0.0.1', port: 0 });
    base = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
    profile = mkdtempSync(join(tmpdir(), 'console-webhooks-'));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: '/usr/bin/chromium',
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
      viewport: { width: 1366, height: 768 },
    });
    page = context.pages()[0] ?? (await context.newPage());
  }, BROWSER_TIMEOUT_MS);

  afterAll(async () => {
    await context?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    for (const r of receivers) await r.close();
    await t?.close();
  });

  it(
    'retries a pending delivery now from its row, then edits the endpoint: same id, new URL, history kept',
    async () => {
      const { token, auth } = await t.tenantWithKey(['webhooks:write']);
      let first = true;
      const old = await startReceiver(() => {
        if (!first) return 204;
        first = false;
        return { status: 503, headers: { 'retry-after': '3600' } };
      });
      const next = await startReceiver();
      receivers.push(old, next);
      const created = await t.app.inject({
        method: 'POST',
        url: '/v1/webhooks',
        headers: auth,
        payload: { url: old.url, events: ['run.finalized'] },
      });
      const endpointId = created.json().id as string;
      const sent = await t.app.inject({ method: 'POST', url: `/v1/webhooks/${endpointId}/test`, headers: auth });
      const deliveryId = sent.json().deliveryId as string;
      await waitUntil(
        async () => (await t.runtime.stores.webhookDeliveries.get(deliveryId))?.attemptCount === 1,
        20_000,
        'the first attempt failed and the next is an hour away',
      );

      await page.goto(`${base}/console`);
      await page.locator('#key').fill(token);
      await page.locator('#sign-in button[type=submit]').click();
      await page.locator('#sign-out').waitFor();
      await page.goto(`${base}/console/webhooks/${endpointId}`);
      const row = page.locator(`tr[data-delivery-id="${deliveryId}"]`);
      await row.and(page.locator('[data-status="pending"]')).waitFor();
      await row.locator('button.resend').click();
      await page.locator(`[data-resent="${deliveryId}"][data-retried="true"]`).waitFor();
      await page.locator(`tr[data-delivery-id="${deliveryId}"][data-status="succeeded"]`).waitFor({ timeout: 60_000 });
      expect(old.received).toHaveLength(2);

      await page.locator('#edit-endpoint summary').click();
      await page.locator('#edit-endpoint input[name=url]').fill(next.url);
      await page.locator('#edit-endpoint input[name=events]').fill('run.finalized, settlement.completed');
      await page.locator('#edit-endpoint input[name=description]').fill('billing v2');
      await page.locator('#edit-endpoint button[type=submit]').click();
      await page.getByText(next.url, { exact: true }).first().waitFor();
      const endpoint = (await t.app.inject({ method: 'GET', url: `/v1/webhooks/${endpointId}`, headers: auth })).json();
      expect(endpoint).toMatchObject({
        id: endpointId,
        url: next.url,
        events: ['run.finalized', 'settlement.completed'],
        description: 'billing v2',
      });
      // The delivery made before the change is still listed; a test event now goes to the new URL.
      await page.locator(`tr[data-delivery-id="${deliveryId}"]`).waitFor();
      await page.locator('#send-test').click();
      await next.waitFor(1);
      expect(old.received).toHaveLength(2);

      // A URL the rules refuse is refused on the page, and nothing changes.
      await page.locator('#edit-endpoint summary').click();
      await page.locator('#edit-endpoint input[name=url]').fill('ftp://example.com/x');
      await page.locator('#edit-endpoint button[type=submit]').click();
      await page.locator('#edit-endpoint').getByText('Could not save the endpoint').waitFor();
      expect((await t.app.inject({ method: 'GET', url: `/v1/webhooks/${endpointId}`, headers: auth })).json().url).toBe(
        next.url,
      );
    },
    BROWSER_TIMEOUT_MS,
  );
});
