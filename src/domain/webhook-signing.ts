// Webhook signing (Standard Webhooks), endpoint-secret encryption at rest, the retry schedule and the address
// classification behind the SSRF guard. Pure: node:crypto and node:net parsing only, no I/O.
import { createHmac, randomBytes } from 'node:crypto';
import { BlockList, isIP } from 'node:net';

// ---------------------------------------------------------------------------------------------------------------
// Secrets and signatures

export const SECRET_PREFIX = 'whsec_';
export const SECRET_BYTES = 32;

/** A fresh endpoint secret: `whsec_` + base64 of 32 random bytes (the form stock Standard Webhooks libraries take). */
export function generateWebhookSecret(): string {
  return `${SECRET_PREFIX}${randomBytes(SECRET_BYTES).toString('base64')}`;
}

/** The HMAC key of a secret: base64-decode of the part after `whsec_`. */
export function secretKeyBytes(secret: string): Buffer {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  const bytes = Buffer.from(encoded, 'base64');
  if (bytes.length === 0) throw new Error('webhook secret is empty');
  return bytes;
}

/** `v1,<base64 HMAC-SHA256(secret bytes, "{id}.{timestamp}.{body}")>` */
export function signatureFor(secret: string, msgId: string, timestampSeconds: number, body: string): string {
  const mac = createHmac('sha256', secretKeyBytes(secret))
    .update(`${msgId}.${timestampSeconds}.${body}`)
    .digest('base64');
  return `v1,${mac}`;
}

/**
 * The body every delivery of an event carries (and the pull feed hands out), rebuilt from the stored event byte for
 * byte the same on every attempt.
 */
export function eventBody(event: {
  _id: string;
  type: string;
  createdAt: Date;
  test?: boolean;
  data: Record<string, unknown>;
}): string {
  return JSON.stringify({
    id: event._id,
    type: event.type,
    createdAt: event.createdAt.toISOString(),
    test: event.test === true,
    data: event.data,
  });
}

export type SignedHeaders = {
  'webhook-id': string;
  'webhook-timestamp': string;
  'webhook-signature': string;
  'service-signature': string;
};

/**
 * Headers of one delivery attempt. Every secret in `secrets` (the current one, plus the previous one during a
 * rotation's grace period) contributes a signature; receivers accept the message when any one matches.
 */
export function signedHeaders(secrets: string[], msgId: string, timestampSeconds: number, body: string): SignedHeaders {
  if (secrets.length === 0) throw new Error('no secret to sign with');
  const signature = secrets.map((s) => signatureFor(s, msgId, timestampSeconds, body)).join(' ');
  return {
    'webhook-id': msgId,
    'webhook-timestamp': String(timestampSeconds),
    'webhook-signature': signature,
    'service-signature': signature,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Retry schedule

const SECOND = 1_000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;

/** Delay before attempt n+1 (index n): 8 attempts in all, the first at once. */
export const RETRY_SCHEDULE_MS = [
  0,
  5 * SECOND,
  5 * MINUTE,
  30 * MINUTE,
  2 * HOUR,
  5 * HOUR,
  10 * HOUR,
  10 * HOUR,
] as const;
export const MAX_ATTEMPTS = RETRY_SCHEDULE_MS.length;
/** An endpoint whose deliveries have all failed for this long (times the retry scale) is disabled. */
export const DISABLE_AFTER_FAILING_MS = 5 * 24 * HOUR;
/** Jitter spreads retries of many deliveries apart: each delay is multiplied by a factor in [1 - J, 1 + J]. */
export const RETRY_JITTER = 0.15;
/** A receiver's Retry-After is honoured up to this long (before scaling), so a typo cannot park a delivery for a year. */
export const MAX_RETRY_AFTER_MS = 24 * HOUR;

/**
 * Delay in ms before attempt `attemptIndex` (0-based, 0 = first attempt), scaled and jittered. `retryAfterMs` is
 * the receiver's Retry-After (already parsed, unscaled): it is a floor for the delay, and it is multiplied by the
 * same scale as the schedule so that a test running the schedule at 1/1000 speed is not stalled by a receiver that
 * says "Retry-After: 120". At scale 1 (production) it is honoured exactly.
 */
export function retryDelayMs(
  attemptIndex: number,
  scale: number,
  retryAfterMs: number | null = null,
  random: () => number = Math.random,
): number {
  const base = RETRY_SCHEDULE_MS[Math.min(Math.max(attemptIndex, 0), MAX_ATTEMPTS - 1)]!;
  const jittered = base * scale * (1 + (random() * 2 - 1) * RETRY_JITTER);
  const floor = retryAfterMs === null ? 0 : Math.min(retryAfterMs, MAX_RETRY_AFTER_MS) * scale;
  return Math.max(0, Math.round(Math.max(jittered, floor)));
}

// Receivers' Retry-After is read as the client package reads the service's.
export { parseRetryAfter } from 'agent-settlement-client/retry-after';

// ---------------------------------------------------------------------------------------------------------------
// Addresses (SSRF guard)

export type AddressClass =
  | 'public'
  | 'private'
  | 'loopback'
  | 'link-local'
  | 'cgnat'
  | 'unique-local'
  | 'metadata'
  | 'unspecified'
  | 'multicast'
  | 'reserved'
  | 'invalid';

const v4 = (ranges: Array<[string, number]>) => {
  const list = new BlockList();
  for (const [net, prefix] of ranges) list.addSubnet(net, prefix, 'ipv4');
  return list;
};
const v6 = (ranges: Array<[string, number]>) => {
  const list = new BlockList();
  for (const [net, prefix] of ranges) list.addSubnet(net, prefix, 'ipv6');
  return list;
};

// Order matters: the first matching class wins (metadata before link-local, for instance).
const V4_CLASSES: Array<[AddressClass, BlockList]> = [
  // AWS/GCP/Azure/OpenStack instance metadata, and Azure's wire server.
  [
    'metadata',
    v4([
      ['169.254.169.254', 32],
      ['168.63.129.16', 32],
    ]),
  ],
  ['unspecified', v4([['0.0.0.0', 8]])],
  ['loopback', v4([['127.0.0.0', 8]])],
  [
    'private',
    v4([
      ['10.0.0.0', 8],
      ['172.16.0.0', 12],
      ['192.168.0.0', 16],
    ]),
  ],
  ['link-local', v4([['169.254.0.0', 16]])],
  ['cgnat', v4([['100.64.0.0', 10]])],
  ['multicast', v4([['224.0.0.0', 4]])],
  [
    'reserved',
    v4([
      ['192.0.0.0', 24], // IETF protocol assignments
      ['192.0.2.0', 24], // documentation
      ['198.51.100.0', 24],
      ['203.0.113.0', 24],
      ['198.18.0.0', 15], // benchmarking
      ['240.0.0.0', 4], // reserved, broadcast
    ]),
  ],
];

const V6_CLASSES: Array<[AddressClass, BlockList]> = [
  ['metadata', v6([['fd00:ec2::254', 128]])],
  ['unspecified', v6([['::', 128]])],
  ['loopback', v6([['::1', 128]])],
  ['link-local', v6([['fe80::', 10]])],
  ['unique-local', v6([['fc00::', 7]])],
  ['private', v6([['fec0::', 10]])], // deprecated site-local
  ['multicast', v6([['ff00::', 8]])],
  [
    'reserved',
    v6([
      ['2001:db8::', 32],
      ['100::', 64],
      ['::', 96],
    ]),
  ], // documentation, discard, IPv4-compatible
];

function expandV6(address: string): number[] | null {
  let text = address.toLowerCase();
  const zone = text.indexOf('%');
  if (zone >= 0) text = text.slice(0, zone);
  // A trailing dotted IPv4 becomes two hextets.
  const dotted = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (dotted) {
    const parts = dotted[2]!.split('.').map(Number);
    if (parts.some((p) => p > 255)) return null;
    text = `${dotted[1]}${((parts[0]! << 8) | parts[1]!).toString(16)}:${((parts[2]! << 8) | parts[3]!).toString(16)}`;
  }
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const head = halves[0] ? halves[0].split(':') : [];
  const tail = halves.length === 2 && halves[1] ? halves[1].split(':') : [];
  const missing = 8 - head.length - tail.length;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return null;
  const groups = [...head, ...Array<string>(halves.length === 2 ? missing : 0).fill('0'), ...tail];
  const values = groups.map((g) => (/^[0-9a-f]{1,4}$/.test(g) ? parseInt(g, 16) : NaN));
  return values.some(Number.isNaN) ? null : values;
}

function v4FromHextets(hi: number, lo: number): string {
  return `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`;
}

/** What kind of address this is; anything but 'public' is refused unless private addresses are allowed. */
export function classifyAddress(address: string): AddressClass {
  const family = isIP(address.split('%')[0]!);
  if (family === 4) {
    for (const [cls, list] of V4_CLASSES) if (list.check(address, 'ipv4')) return cls;
    return 'public';
  }
  if (family === 6) {
    const g = expandV6(address);
    if (!g) return 'invalid';
    // IPv4 embedded in IPv6 reaches an IPv4 host: classify that host. ::ffff:a.b.c.d (mapped), 64:ff9b::/96 (NAT64),
    // 2002::/16 (6to4).
    if (g.slice(0, 5).every((x) => x === 0) && g[5] === 0xffff) return classifyAddress(v4FromHextets(g[6]!, g[7]!));
    if (g[0] === 0x64 && g[1] === 0xff9b && g.slice(2, 6).every((x) => x === 0))
      return classifyAddress(v4FromHextets(g[6]!, g[7]!));
    if (g[0] === 0x2002) return classifyAddress(v4FromHextets(g[1]!, g[2]!));
    const normalized = g.map((x) => x.toString(16)).join(':');
    for (const [cls, list] of V6_CLASSES) if (list.check(normalized, 'ipv6')) return cls;
    return 'public';
  }
  return 'invalid';
}

/**
 * Whether a delivery may connect to this address. Cloud metadata addresses are refused even when private addresses
 * are allowed: a development setting must never open the instance's credentials to a webhook URL.
 */
export function isAddressAllowed(
  address: string,
  allowPrivate: boolean,
): { allowed: true } | { allowed: false; class: AddressClass } {
  const cls = classifyAddress(address);
  if (cls === 'public') return { allowed: true };
  if (allowPrivate && cls !== 'metadata' && cls !== 'invalid') return { allowed: true };
  return { allowed: false, class: cls };
}
