import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Collection, Db } from 'mongodb';
import { insertFirst } from './mongo.ts';
import { newId } from '../domain/crypto.ts';
import type { Scope } from '../domain/scopes.ts';

export interface ApiKeyDoc {
  _id: string;
  tenantId: string;
  scopes: Scope[];
  description: string | null;
  /** sha256 of the secret; the secret itself is shown once and never stored. */
  secretHash: string;
  status: 'active' | 'revoked';
  expiresAt: Date | null;
  createdAt: Date;
  revokedAt: Date | null;
  rotatedTo: string | null;
}

export interface IssuedKey {
  key: ApiKeyDoc;
  token: string;
}

// API key ids are `ak_…`, apart from agent key ids (`key_` + a public key's hash, contract section 5); keys issued
// before that carry `key_…` ids and keep working.
const TOKEN_RE = /^sk_((?:ak|key)_[A-Za-z0-9_-]{10,64})\.([A-Za-z0-9_-]{43,128})$/;
export const API_KEY_ID_PREFIX = 'ak';

function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

export function parseToken(token: string): { keyId: string; secret: string } | null {
  const match = TOKEN_RE.exec(token);
  return match ? { keyId: match[1]!, secret: match[2]! } : null;
}

/** A resolved key (ApiKeyStore.get) accepts this secret now: it matches in constant time, and the key is live. */
export function isLiveKey(key: ApiKeyDoc, secret: string, now: Date): boolean {
  const presented = Buffer.from(hashSecret(secret), 'hex');
  const expected = Buffer.from(key.secretHash, 'hex');
  if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) return false;
  return isActiveKey(key, now);
}

/** A resolved key is neither revoked nor expired (what a console session signed in with a key re-checks each time). */
export function isActiveKey(key: ApiKeyDoc, now: Date): boolean {
  if (key.status !== 'active') return false;
  return !key.expiresAt || key.expiresAt.getTime() > now.getTime();
}

/**
 * When a key stops working, recorded by insert (revoke: now; rotate: when the grace ends). On FerretDB an update
 * of the key document can be lost to a concurrent one, which could bring a revoked key back; an insert cannot.
 */
interface KeyEndDoc {
  _id: string;
  keyId: string;
  kind: 'revoke' | 'rotate';
  effectiveAt: Date;
  rotatedTo: string | null;
}

export class ApiKeyStore {
  private readonly keys: Collection<ApiKeyDoc>;
  private readonly ends: Collection<KeyEndDoc>;

  constructor(db: Db) {
    this.keys = db.collection<ApiKeyDoc>('api_keys');
    this.ends = db.collection<KeyEndDoc>('api_key_ends');
  }

  /**
   * `secret` may be given (>= 32 bytes of key material, base64url) by a caller that must be able to present the same
   * token again after a crash without ever storing it (the first paid call derives it from the service's secret).
   */
  async issue(input: {
    id?: string;
    secret?: string;
    tenantId: string;
    scopes: Scope[];
    description?: string | null;
    expiresAt?: Date | null;
  }): Promise<IssuedKey> {
    const secret = input.secret ?? randomBytes(32).toString('base64url');
    if (!/^[A-Za-z0-9_-]{43,128}$/.test(secret)) throw new Error('an API key secret is 43-128 base64url characters');
    const key: ApiKeyDoc = {
      _id: input.id ?? newId(API_KEY_ID_PREFIX),
      tenantId: input.tenantId,
      scopes: [...new Set(input.scopes)],
      description: input.description ?? null,
      secretHash: hashSecret(secret),
      status: 'active',
      expiresAt: input.expiresAt ?? null,
      createdAt: new Date(),
      revokedAt: null,
      rotatedTo: null,
    };
    await this.keys.insertOne(key);
    return { key, token: `sk_${key._id}.${secret}` };
  }

  /** What revoke and rotate recorded for a key: the times from which it stops working. */
  private async endsOf(keyId: string): Promise<{ revokedAt: Date | null; rotation: KeyEndDoc | null }> {
    const [revoked, rotation] = await Promise.all([
      this.ends.findOne({ _id: `${keyId}#revoke` }),
      this.ends.findOne({ _id: `${keyId}#rotate` }),
    ]);
    return { revokedAt: revoked?.effectiveAt ?? null, rotation };
  }

  /** The key as its records say: revoked once a revocation is recorded, expiring when a rotation's grace ends. */
  private async resolve(key: ApiKeyDoc, now = new Date()): Promise<ApiKeyDoc> {
    const { revokedAt, rotation } = await this.endsOf(key._id);
    const rotationEnds = rotation?.effectiveAt ?? null;
    const endedByRotation = rotationEnds !== null && rotationEnds.getTime() <= now.getTime();
    const revoked = key.status === 'revoked' || revokedAt !== null || endedByRotation;
    const expiresAt =
      rotationEnds && !endedByRotation && (!key.expiresAt || rotationEnds < key.expiresAt)
        ? rotationEnds
        : key.expiresAt;
    return {
      ...key,
      status: revoked ? 'revoked' : 'active',
      revokedAt: key.revokedAt ?? revokedAt ?? (endedByRotation ? rotationEnds : null),
      expiresAt,
      rotatedTo: key.rotatedTo ?? rotation?.rotatedTo ?? null,
    };
  }

  /** The key as its records say (secret hash included, for isLiveKey). */
  async get(keyId: string): Promise<ApiKeyDoc | null> {
    const key = await this.keys.findOne({ _id: keyId });
    return key && this.resolve(key);
  }

  async list(filter: { tenantId?: string }, limit: number): Promise<ApiKeyDoc[]> {
    const keys = await this.keys
      .find(filter.tenantId ? { tenantId: filter.tenantId } : {})
      .sort({ createdAt: -1 })
      .limit(limit)
      .toArray();
    return Promise.all(keys.map((k) => this.resolve(k)));
  }

  /** Revokes a key now; revoking an already revoked key keeps its first revocation time. */
  async revoke(keyId: string, now = new Date()): Promise<ApiKeyDoc | null> {
    const key = await this.keys.findOne({ _id: keyId });
    if (!key) return null;
    await insertFirst(this.ends, { _id: `${keyId}#revoke`, keyId, kind: 'revoke', effectiveAt: now, rotatedTo: null }); // first revocation stands
    if (key.status === 'active')
      await this.keys.updateOne({ _id: keyId }, { $set: { status: 'revoked', revokedAt: now } }); // cache
    return this.get(keyId);
  }

  /**
   * Issues a successor with the same tenant, scopes and description. The old key keeps working for
   * `gracePeriodSeconds` (0 = revoked now) so callers can roll the new token out without downtime. A key is
   * rotated once: the rotation is claimed by insert before the successor is issued. null when there is no such key;
   * `refused` (with the key as it stands) when it is revoked, expired or already rotated.
   */
  async rotate(
    keyId: string,
    gracePeriodSeconds: number,
    now = new Date(),
  ): Promise<{ issued: IssuedKey; old: ApiKeyDoc } | { refused: ApiKeyDoc } | null> {
    const stored = await this.keys.findOne({ _id: keyId });
    if (!stored) return null;
    const old = await this.resolve(stored, now);
    if (old.status !== 'active' || old.rotatedTo) return { refused: old };
    const graceEnds = new Date(now.getTime() + gracePeriodSeconds * 1000);
    const effectiveAt = old.expiresAt && old.expiresAt < graceEnds ? old.expiresAt : graceEnds;
    const successorId = newId(API_KEY_ID_PREFIX);
    const claimed = await insertFirst(this.ends, {
      _id: `${keyId}#rotate`,
      keyId,
      kind: 'rotate',
      effectiveAt,
      rotatedTo: successorId,
    });
    if (!claimed) return { refused: await this.resolve(stored, now) }; // rotated concurrently: that rotation stands
    const issued = await this.issue({
      id: successorId,
      tenantId: old.tenantId,
      scopes: old.scopes,
      description: old.description,
      expiresAt: old.expiresAt,
    });
    await this.keys.updateOne({ _id: keyId }, { $set: { rotatedTo: successorId } }); // cache
    return { issued, old: await this.resolve(stored, now) };
  }
}
