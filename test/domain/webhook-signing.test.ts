import { randomBytes } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { describe, expect, it } from 'vitest';
import {
  classifyAddress,
  generateWebhookSecret,
  isAddressAllowed,
  MAX_ATTEMPTS,
  parseRetryAfter,
  RETRY_SCHEDULE_MS,
  retryDelayMs,
  signedHeaders,
  signatureFor,
} from '../../src/domain/webhook-signing.ts';
import { decryptAtRest, encryptAtRest } from '../../src/domain/crypto.ts';

describe('webhook secrets and signatures', () => {
  it('generates whsec_ + base64 of 32 random bytes, never the same twice', () => {
    const a = generateWebhookSecret();
    const b = generateWebhookSecret();
    expect(a).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(Buffer.from(a.slice(6), 'base64')).toHaveLength(32);
    expect(a).not.toBe(b);
  });

  it('signs exactly as a stock Standard Webhooks library does', () => {
    const secret = generateWebhookSecret();
    const body = JSON.stringify({
      id: 'evt_1',
      type: 'run.finalized',
      createdAt: '2025-01-01T00:00:00.000Z',
      data: { runId: 'run_1' },
    });
    const ts = Math.floor(Date.now() / 1000);
    const lib = new Webhook(secret);
    expect(signatureFor(secret, 'evt_1', ts, body)).toBe(lib.sign('evt_1', new Date(ts * 1000), body));
    expect(lib.verify(body, signedHeaders([secret], 'evt_1', ts, body))).toMatchObject({ id: 'evt_1' });
  });

  it('carries one signature per secret, and each secret alone verifies', () => {
    const [current, previous, stranger] = [generateWebhookSecret(), generateWebhookSecret(), generateWebhookSecret()];
    const body = '{"id":"evt_2","type":"settlement.held","createdAt":"2025-01-01T00:00:00.000Z","data":{}}';
    const headers = signedHeaders([current, previous], 'evt_2', Math.floor(Date.now() / 1000), body);
    expect(headers['webhook-signature'].split(' ')).toHaveLength(2);
    expect(headers['service-signature']).toBe(headers['webhook-signature']);
    expect(() => new Webhook(current).verify(body, headers)).not.toThrow();
    expect(() => new Webhook(previous).verify(body, headers)).not.toThrow();
    expect(() => new Webhook(stranger).verify(body, headers)).toThrow(/No matching signature/);
  });

  it('seals secrets with AES-256-GCM bound to the endpoint: no plaintext, no tampering, no moving', () => {
    const key = randomBytes(32);
    const secret = generateWebhookSecret();
    const sealed = encryptAtRest(key, secret, 'whe_a');
    expect(sealed).not.toContain(secret.slice(6, 20));
    expect(encryptAtRest(key, secret, 'whe_a')).not.toBe(sealed); // fresh IV each time
    expect(decryptAtRest(key, sealed, 'whe_a')).toBe(secret);
    expect(() => decryptAtRest(key, sealed, 'whe_b')).toThrow();
    expect(() => decryptAtRest(randomBytes(32), sealed, 'whe_a')).toThrow();
    const parts = sealed.split('.');
    const flipped = Buffer.from(parts[3]!, 'base64url');
    flipped[0]! ^= 1;
    parts[3] = flipped.toString('base64url');
    expect(() => decryptAtRest(key, parts.join('.'), 'whe_a')).toThrow();
  });
});

describe('retry schedule', () => {
  it('has 8 attempts: 0 s, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h', () => {
    expect(MAX_ATTEMPTS).toBe(8);
    expect(RETRY_SCHEDULE_MS.map((ms) => ms / 1000)).toEqual([0, 5, 300, 1800, 7200, 18000, 36000, 36000]);
  });

  it('scales and jitters each delay within ±15%', () => {
    expect(retryDelayMs(0, 1, null, () => 1)).toBe(0);
    expect(retryDelayMs(1, 1, null, () => 0)).toBe(4250);
    expect(retryDelayMs(1, 1, null, () => 1)).toBe(5750);
    expect(retryDelayMs(2, 0.01, null, () => 0.5)).toBe(3000);
    const samples = Array.from({ length: 200 }, () => retryDelayMs(4, 1));
    expect(Math.min(...samples)).toBeGreaterThanOrEqual(7_200_000 * 0.85);
    expect(Math.max(...samples)).toBeLessThanOrEqual(7_200_000 * 1.15);
    expect(new Set(samples).size).toBeGreaterThan(100);
  });

  it('treats Retry-After as a floor, scaled like the schedule and capped at a day', () => {
    expect(retryDelayMs(1, 1, 60_000, () => 0.5)).toBe(60_000);
    expect(retryDelayMs(1, 0.001, 60_000, () => 0.5)).toBe(60);
    expect(retryDelayMs(3, 1, 1_000, () => 0.5)).toBe(1_800_000); // the schedule is longer: it wins
    expect(retryDelayMs(1, 1, 365 * 86_400_000, () => 0.5)).toBe(86_400_000);
  });

  it('parses Retry-After as seconds or an HTTP date', () => {
    const now = Date.parse('2025-03-01T12:00:00Z');
    expect(parseRetryAfter('120', now)).toBe(120_000);
    expect(parseRetryAfter('Sat, 01 Mar 2025 12:00:30 GMT', now)).toBe(30_000);
    expect(parseRetryAfter('Sat, 01 Mar 2025 11:00:00 GMT', now)).toBe(0);
    expect(parseRetryAfter('soon', now)).toBeNull();
    expect(parseRetryAfter(undefined, now)).toBeNull();
  });
});

describe('address classification (SSRF guard)', () => {
  it.each([
    ['93.184.216.34', 'public'],
    ['8.8.8.8', 'public'],
    ['127.0.0.1', 'loopback'],
    ['127.9.9.9', 'loopback'],
    ['10.1.2.3', 'private'],
    ['172.16.0.1', 'private'],
    ['172.31.255.255', 'private'],
    ['172.32.0.1', 'public'],
    ['192.168.1.1', 'private'],
    ['169.254.1.1', 'link-local'],
    ['169.254.169.254', 'metadata'],
    ['100.64.0.1', 'cgnat'],
    ['100.127.255.255', 'cgnat'],
    ['0.0.0.0', 'unspecified'],
    ['224.0.0.1', 'multicast'],
    ['255.255.255.255', 'reserved'],
    ['2606:4700:4700::1111', 'public'],
    ['::1', 'loopback'],
    ['::', 'unspecified'],
    ['fe80::1', 'link-local'],
    ['fd12:3456::1', 'unique-local'],
    ['fc00::1', 'unique-local'],
    ['fd00:ec2::254', 'metadata'],
    ['::ffff:127.0.0.1', 'loopback'],
    ['::ffff:7f00:1', 'loopback'],
    ['::ffff:169.254.169.254', 'metadata'],
    ['::ffff:8.8.8.8', 'public'],
    ['64:ff9b::a00:1', 'private'],
    ['2002:c0a8:101::1', 'private'],
    ['fe80::1%eth0', 'link-local'],
    ['not-an-ip', 'invalid'],
  ])('%s is %s', (address, cls) => {
    expect(classifyAddress(address)).toBe(cls);
  });

  it('allows only public addresses unless private ones are allowed; metadata never', () => {
    expect(isAddressAllowed('8.8.8.8', false)).toEqual({ allowed: true });
    expect(isAddressAllowed('127.0.0.1', false)).toEqual({ allowed: false, class: 'loopback' });
    expect(isAddressAllowed('127.0.0.1', true)).toEqual({ allowed: true });
    expect(isAddressAllowed('10.0.0.1', true)).toEqual({ allowed: true });
    expect(isAddressAllowed('169.254.169.254', true)).toEqual({ allowed: false, class: 'metadata' });
    expect(isAddressAllowed('fd00:ec2::254', true)).toEqual({ allowed: false, class: 'metadata' });
  });
});
