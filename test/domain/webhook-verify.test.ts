import { Webhook } from 'standardwebhooks';
import { describe, expect, it } from 'vitest';
import { generateWebhookSecret, signedHeaders } from '../../src/domain/webhook-signing.ts';
import { verifyWebhook, WebhookVerificationError } from '../../src/index.ts';

const body = JSON.stringify({
  id: 'evt_abc',
  type: 'settlement.completed',
  createdAt: '2025-01-01T00:00:00.000Z',
  data: { runId: 'run_1', amount: 500 },
});
const now = () => Math.floor(Date.now() / 1000);

function codeOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(WebhookVerificationError);
    return (err as WebhookVerificationError).code;
  }
  throw new Error('did not throw');
}

describe('verifyWebhook (receiver helper)', () => {
  const secret = generateWebhookSecret();

  it('returns the parsed event for a genuine delivery, from a string or a Buffer body', () => {
    const headers = signedHeaders([secret], 'evt_abc', now(), body);
    expect(verifyWebhook(body, headers, secret)).toEqual(JSON.parse(body));
    expect(verifyWebhook(Buffer.from(body), headers, secret).data).toEqual({ runId: 'run_1', amount: 500 });
  });

  it('accepts what a stock Standard Webhooks signer produces, and header names in any case', () => {
    const ts = new Date();
    const sig = new Webhook(secret).sign('evt_abc', ts, body);
    const headers = {
      'Webhook-Id': 'evt_abc',
      'Webhook-Timestamp': String(Math.floor(ts.getTime() / 1000)),
      'Webhook-Signature': sig,
    };
    expect(verifyWebhook(body, headers, secret).id).toBe('evt_abc');
    expect(verifyWebhook(body, new Headers(headers), secret).id).toBe('evt_abc');
  });

  it('refuses a tampered body, a wrong secret, or a swapped id', () => {
    const headers = signedHeaders([secret], 'evt_abc', now(), body);
    expect(codeOf(() => verifyWebhook(body.replace('500', '501'), headers, secret))).toBe('NO_MATCHING_SIGNATURE');
    expect(codeOf(() => verifyWebhook(body, headers, generateWebhookSecret()))).toBe('NO_MATCHING_SIGNATURE');
    expect(codeOf(() => verifyWebhook(body, { ...headers, 'webhook-id': 'evt_other' }, secret))).toBe(
      'NO_MATCHING_SIGNATURE',
    );
    const other = signedHeaders([secret], 'evt_other', now(), body);
    expect(codeOf(() => verifyWebhook(body, other, secret))).toBe('INVALID_PAYLOAD');
  });

  it('refuses timestamps outside the tolerance (replays) and malformed ones', () => {
    const old = signedHeaders([secret], 'evt_abc', now() - 301, body);
    expect(codeOf(() => verifyWebhook(body, old, secret))).toBe('TIMESTAMP_TOO_OLD');
    expect(verifyWebhook(body, old, secret, { toleranceSeconds: 600 }).id).toBe('evt_abc');
    const future = signedHeaders([secret], 'evt_abc', now() + 301, body);
    expect(codeOf(() => verifyWebhook(body, future, secret))).toBe('TIMESTAMP_TOO_NEW');
    const headers = signedHeaders([secret], 'evt_abc', now(), body);
    expect(codeOf(() => verifyWebhook(body, headers, secret, { now: Date.now() + 10 * 60_000 }))).toBe(
      'TIMESTAMP_TOO_OLD',
    );
    expect(codeOf(() => verifyWebhook(body, { ...headers, 'webhook-timestamp': '12e3' }, secret))).toBe(
      'INVALID_TIMESTAMP',
    );
    expect(codeOf(() => verifyWebhook(body, { 'webhook-id': 'evt_abc' }, secret))).toBe('MISSING_HEADERS');
  });

  it('accepts any of several signatures, and any of several secrets (rotation)', () => {
    const [oldSecret, newSecret] = [generateWebhookSecret(), generateWebhookSecret()];
    const both = signedHeaders([newSecret, oldSecret], 'evt_abc', now(), body);
    expect(verifyWebhook(body, both, oldSecret).id).toBe('evt_abc');
    expect(verifyWebhook(body, both, newSecret).id).toBe('evt_abc');
    const newOnly = signedHeaders([newSecret], 'evt_abc', now(), body);
    expect(verifyWebhook(body, newOnly, [oldSecret, newSecret]).id).toBe('evt_abc');
    expect(codeOf(() => verifyWebhook(body, newOnly, [oldSecret]))).toBe('NO_MATCHING_SIGNATURE');
    // Signatures of other schemes and garbage are skipped, not fatal.
    const mixed = {
      ...newOnly,
      'webhook-signature': `v1a,abc v2,${'A'.repeat(44)} junk ${newOnly['webhook-signature']}`,
    };
    expect(verifyWebhook(body, mixed, newSecret).id).toBe('evt_abc');
  });

  it('accepts service-signature when webhook-signature is absent, and raw key bytes as the secret', () => {
    const headers = signedHeaders([secret], 'evt_abc', now(), body);
    const { 'webhook-signature': _dropped, ...rest } = headers;
    expect(verifyWebhook(body, rest, secret).id).toBe('evt_abc');
    expect(verifyWebhook(body, headers, Buffer.from(secret.slice(6), 'base64')).id).toBe('evt_abc');
    expect(codeOf(() => verifyWebhook(body, headers, 'whsec_not base64!'))).toBe('INVALID_SECRET');
  });
});
