// The service's crypto: everything the client package has (hashing, encodings, Ed25519 keys and signatures, ids),
// with libsodium under its Ed25519 where the binary loads, plus what only the service does (admin-key matching,
// idempotent ids, encryption at rest).
import { createRequire } from 'node:module';
import { createCipheriv, createDecipheriv, createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { KeyObject } from 'node:crypto';
import {
  ED25519_SIGNATURE_BYTES,
  ID_ALPHABET,
  ID_RANDOM_LENGTH,
  OPENSSL_ED25519,
  rawPublicKey,
  useEd25519Provider,
  type Ed25519Provider,
} from 'agent-settlement-client/crypto';

export * from 'agent-settlement-client/crypto';

/**
 * A check of a presented secret against one known in advance (the admin key), in constant time whatever the
 * lengths: both sides are compared as SHA-256 digests, the known one computed once.
 */
export function secretMatcher(expected: string): (presented: string) => boolean {
  const expectedDigest = createHash('sha256').update(expected).digest();
  return (presented) => timingSafeEqual(createHash('sha256').update(presented).digest(), expectedDigest);
}

// ---------------------------------------------------------------------------------------------------------------
// Ed25519 on libsodium

interface Sodium {
  crypto_sign_verify_detached(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean;
  crypto_sign_detached(signature: Uint8Array, message: Uint8Array, secretKey: Uint8Array): void;
}

/**
 * libsodium (sodium-native), when its prebuilt binary loads on this platform. Ed25519 signatures are deterministic
 * (RFC 8032), so it signs byte for byte what OpenSSL would, in about half the time here (19 against 36 µs; every
 * receipt and payment token is signed on the request's path).
 */
const sodium: Sodium | null = (() => {
  try {
    return createRequire(import.meta.url)('sodium-native') as Sodium;
  } catch {
    return null;
  }
})();

/** libsodium's form (seed, then public key) of the private KeyObjects already used to sign, which hold the same bytes. */
const secretKeys = new WeakMap<KeyObject, Buffer>();

function cachedSecretKey(privateKey: KeyObject): Buffer {
  let secretKey = secretKeys.get(privateKey);
  if (!secretKey) {
    const jwk = privateKey.export({ format: 'jwk' });
    secretKey = Buffer.concat([Buffer.from(jwk.d!, 'base64url'), Buffer.from(jwk.x!, 'base64url')]);
    secretKeys.set(privateKey, secretKey);
  }
  return secretKey;
}

/** Raw bytes of the public KeyObjects already seen (agents' keys are cached KeyObjects, so this stays small). */
const rawPublicKeys = new WeakMap<KeyObject, Buffer>();

function cachedRawPublicKey(publicKey: KeyObject): Buffer {
  let raw = rawPublicKeys.get(publicKey);
  if (!raw) {
    raw = rawPublicKey(publicKey);
    rawPublicKeys.set(publicKey, raw);
  }
  return raw;
}

/**
 * Every event is verified one by one at append, and here OpenSSL's verify costs ~170 µs a signature against
 * libsodium's ~70 µs (most of the CPU of a 100-event batch). libsodium accepts a subset of what OpenSSL accepts (it
 * also refuses small-order keys and non-canonical encodings), so whatever this service accepts, any stock verifier
 * (the client package's included) accepts too.
 */
function sodiumEd25519(sodium: Sodium): Ed25519Provider {
  return {
    name: 'libsodium',
    sign(privateKey, data) {
      if (privateKey.type !== 'private' || privateKey.asymmetricKeyType !== 'ed25519')
        return OPENSSL_ED25519.sign(privateKey, data);
      const signature = Buffer.alloc(ED25519_SIGNATURE_BYTES);
      sodium.crypto_sign_detached(signature, data, cachedSecretKey(privateKey));
      return signature;
    },
    verify(publicKey, data, signature) {
      if (publicKey.type !== 'public' || publicKey.asymmetricKeyType !== 'ed25519')
        return OPENSSL_ED25519.verify(publicKey, data, signature);
      return sodium.crypto_sign_verify_detached(signature, data, cachedRawPublicKey(publicKey));
    },
  };
}

// Installed when this module loads: every service module that signs or verifies imports it (directly, or through
// the domain modules that re-export the client package's), so the package's functions run on libsodium here.
if (sodium) useEd25519Provider(sodiumEd25519(sodium));

/** Which library verifies Ed25519 signatures in this process ('libsodium', or 'openssl' where it cannot load). */
export const ED25519_VERIFIER: 'libsodium' | 'openssl' = sodium ? 'libsodium' : 'openssl';

// ---------------------------------------------------------------------------------------------------------------
// Ids

/**
 * An id of newId's shape derived from a client's idempotency scope (credential, route and Idempotency-Key): a create
 * retried after a crash or a 5xx (which frees the key) makes the same object again instead of a second one.
 */
export function idFromIdempotency(prefix: string, scope: string): string {
  const digest = createHash('sha256').update(`idempotent-id:${prefix}:${scope}`).digest();
  let out = '';
  for (let i = 0; out.length < ID_RANDOM_LENGTH; i++) out += ID_ALPHABET[digest[i % digest.length]! % 62];
  return `${prefix}_${out}`;
}

// ---------------------------------------------------------------------------------------------------------------
// Encryption at rest: AES-256-GCM, bound to a context (AAD: an endpoint id, a Redis key) so a ciphertext cannot be
// moved to another record.

const ENC_VERSION = 'v1';

export function encryptAtRest(key: Buffer, plaintext: string, context: string): string {
  if (key.length !== 32) throw new Error('encryption key must be 32 bytes');
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(Buffer.from(context, 'utf8'));
  const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
  return [
    ENC_VERSION,
    iv.toString('base64url'),
    cipher.getAuthTag().toString('base64url'),
    ciphertext.toString('base64url'),
  ].join('.');
}

/** Throws when the ciphertext was altered, belongs to another context, or the key is wrong. */
export function decryptAtRest(key: Buffer, sealed: string, context: string): string {
  const [version, iv, tag, ciphertext] = sealed.split('.');
  if (version !== ENC_VERSION || !iv || !tag || ciphertext === undefined) throw new Error('unreadable sealed value');
  const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(iv, 'base64url'));
  decipher.setAAD(Buffer.from(context, 'utf8'));
  decipher.setAuthTag(Buffer.from(tag, 'base64url'));
  return Buffer.concat([decipher.update(Buffer.from(ciphertext, 'base64url')), decipher.final()]).toString('utf8');
}
