import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Collection, Db } from 'mongodb';
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

const TOKEN_RE = /^sk_(key_[A-Za-z0-9_-]{10,64})\.([A-Za-z0-9_-]{43,128})$/;

function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

export function parseToken(token: string): { keyId: string; secret: string } | null {
  const match = TOKEN_RE.exec(token);
  return match ? { keyId: match[1]!, secret: match[2]! } : null;
}

export class ApiKeyStore {
  private readonly keys: Collection<ApiKeyDoc>;

  constructor(db: Db) {
    this.keys = db.collection<ApiKeyDoc>('api_keys');
  }

  async issue(input: { tenantId: string; scopes: Scope[]; description?: string | null; expiresAt?: Date | null }): Promise<IssuedKey> {
    const secret = randomBytes(32).toString('base64url');
    const key: ApiKeyDoc = {
      _id: newId('key'),
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

  /** The key a bearer token names, if the token is well-formed, its secret matches, and the key is live. */
  async authenticate(token: string, now = new Date()): Promise<ApiKeyDoc | null> {
    const parsed = parseToken(token);
    if (!parsed) return null;
    const key = await this.keys.findOne({ _id: parsed.keyId });
    if (!key) return null;
    const presented = Buffer.from(hashSecret(parsed.secret), 'hex');
    const stored = Buffer.from(key.secretHash, 'hex');
    if (presented.length !== stored.length || !timingSafeEqual(presented, stored)) return null;
    if (key.status !== 'active') return null;
    if (key.expiresAt && key.expiresAt.getTime() <= now.getTime()) return null;
    return key;
  }

  get(keyId: string): Promise<ApiKeyDoc | null> {
    return this.keys.findOne({ _id: keyId });
  }

  list(filter: { tenantId?: string }, limit: number): Promise<ApiKeyDoc[]> {
    return this.keys
      .find(filter.tenantId ? { tenantId: filter.tenantId } : {})
      .sort({ createdAt: -1 })
      .limit(limit)
      .toArray();
  }

  /** Revokes a key; revoking an already revoked key keeps its first revocation time. */
  async revoke(keyId: string, now = new Date()): Promise<ApiKeyDoc | null> {
    await this.keys.updateOne({ _id: keyId, status: 'active' }, { $set: { status: 'revoked', revokedAt: now } });
    return this.keys.findOne({ _id: keyId });
  }

  /**
   * Issues a successor with the same tenant, scopes and description. The old key keeps working for
   * `gracePeriodSeconds` (0 = revoked now) so callers can roll the new token out without downtime.
   */
  async rotate(keyId: string, gracePeriodSeconds: number, now = new Date()): Promise<{ issued: IssuedKey; old: ApiKeyDoc } | null> {
    const old = await this.keys.findOne({ _id: keyId, status: 'active' });
    if (!old) return null;
    const issued = await this.issue({
      tenantId: old.tenantId,
      scopes: old.scopes,
      description: old.description,
      expiresAt: old.expiresAt,
    });
    const graceEnds = new Date(now.getTime() + gracePeriodSeconds * 1000);
    const update =
      gracePeriodSeconds === 0
        ? { status: 'revoked' as const, revokedAt: now, rotatedTo: issued.key._id }
        : {
            expiresAt: old.expiresAt && old.expiresAt < graceEnds ? old.expiresAt : graceEnds,
            rotatedTo: issued.key._id,
          };
    const updated = await this.keys.findOneAndUpdate({ _id: keyId }, { $set: update }, { returnDocument: 'after' });
    return { issued, old: updated ?? old };
  }
}
