import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { KeyObject } from 'node:crypto';
import type { Config } from './config.ts';
import {
  generateEd25519KeyPair,
  parsePrivateKey,
  parsePublicKey,
  privateKeyToPem,
  publicKeyOf,
  rawToJwk,
  type Ed25519Jwk,
} from './domain/crypto.ts';

/** The service's Ed25519 signing keys: one active (signs artifacts, receipts, tokens), the rest published only. */
export interface ServiceKeyRing {
  active: { keyId: string; privateKey: KeyObject };
  jwks: { keys: Array<Ed25519Jwk & { use: 'sig'; alg: 'EdDSA'; status: 'active' | 'retired' }> };
}

function readKeyMaterial(value: string): string {
  return value.includes('-----BEGIN') ? value : readFileSync(value, 'utf8');
}

/**
 * Without a configured key (development, tests), a key is generated once into `keyFile`; every process on the
 * machine then signs with the same key. The exclusive create makes two processes starting together agree.
 */
function developmentKey(keyFile: string): string {
  try {
    return readFileSync(keyFile, 'utf8');
  } catch {
    mkdirSync(dirname(keyFile), { recursive: true });
    try {
      writeFileSync(keyFile, privateKeyToPem(generateEd25519KeyPair().privateKey), { flag: 'wx', mode: 0o600 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    return readFileSync(keyFile, 'utf8');
  }
}

function publicJwk(material: string) {
  // A retired entry may be a private key (kept from before the rotation) or just its public half.
  try {
    return publicKeyOf(parsePrivateKey(material));
  } catch {
    return parsePublicKey(material.trim());
  }
}

export function loadServiceKeys(config: Config): ServiceKeyRing {
  const activePem = config.signing.activeKey
    ? readKeyMaterial(config.signing.activeKey)
    : developmentKey(config.signing.keyFile);
  const privateKey = parsePrivateKey(activePem);
  const active = publicKeyOf(privateKey);
  const keys: ServiceKeyRing['jwks']['keys'] = [
    { ...rawToJwk(active.raw, active.keyId), use: 'sig', alg: 'EdDSA', status: 'active' },
  ];
  for (const retired of config.signing.retiredKeys) {
    const key = publicJwk(readKeyMaterial(retired));
    if (keys.some((k) => k.kid === key.keyId)) continue;
    keys.push({ ...rawToJwk(key.raw, key.keyId), use: 'sig', alg: 'EdDSA', status: 'retired' });
  }
  return { active: { keyId: active.keyId, privateKey }, jwks: { keys } };
}
