// Hashing, Ed25519 keys and signatures, base64url and id helpers, on node:crypto alone (OpenSSL): what the client
// signs with and what the offline verifiers check with. A process may put a faster Ed25519 under the same functions
// (useEd25519Provider; the service installs libsodium).
import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  randomFillSync,
  sign as nodeSign,
  verify as nodeVerify,
} from 'node:crypto';
import type { KeyObject } from 'node:crypto';

export type KeyErrorReason = 'MALFORMED' | 'NOT_ED25519' | 'NOT_PUBLIC' | 'NOT_PRIVATE';

/** Thrown for any key that cannot be used as an Ed25519 public (or private) key. */
export class KeyFormatError extends Error {
  readonly code = 'INVALID_KEY';
  constructor(
    readonly reason: KeyErrorReason,
    message: string,
  ) {
    super(message);
    this.name = 'KeyFormatError';
  }
}

/** Thrown when a hex or base64url string is not in its strict canonical form. */
export class EncodingError extends Error {
  readonly code = 'INVALID_ENCODING';
  constructor(message: string) {
    super(message);
    this.name = 'EncodingError';
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Hashing and encodings

/** Lowercase hex SHA-256. Strings are hashed as their UTF-8 bytes. */
export function sha256Hex(data: string | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** base64url without padding (RFC 4648 section 5). */
export function base64urlEncode(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64url');
}

const BASE64URL = /^[A-Za-z0-9_-]*$/;

/**
 * Strict base64url decode: only the URL-safe alphabet, no padding, and the canonical encoding of its bytes.
 * Buffer.from(s, 'base64url') alone skips junk characters and accepts non-zero trailing bits, which would let
 * several strings denote the same signature or key.
 */
export function base64urlDecode(s: string): Buffer {
  if (!BASE64URL.test(s) || s.length % 4 === 1) {
    throw new EncodingError('not base64url (URL-safe alphabet, no padding)');
  }
  const bytes = Buffer.from(s, 'base64url');
  if (bytes.toString('base64url') !== s) throw new EncodingError('non-canonical base64url');
  return bytes;
}

const HEX = /^(?:[0-9a-f]{2})*$/;

/** Strict lowercase hex decode (the form sha256Hex produces). */
export function hexToBytes(hex: string): Buffer {
  if (!HEX.test(hex)) throw new EncodingError('not lowercase hex with an even number of digits');
  return Buffer.from(hex, 'hex');
}

/** True for a lowercase 64-digit hex string, the form of every hash in this service. */
export function isSha256Hex(s: unknown): s is string {
  return typeof s === 'string' && /^[0-9a-f]{64}$/.test(s);
}

// ---------------------------------------------------------------------------------------------------------------
// Ed25519 keys

export const ED25519_PUBLIC_KEY_BYTES = 32;
export const ED25519_SIGNATURE_BYTES = 64;

// DER prefixes of the SPKI / PKCS#8 wrappers around a raw Ed25519 key (RFC 8410), used to import raw bytes.
const SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');
const PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

export interface ParsedPublicKey {
  keyObject: KeyObject;
  /** The 32 raw public key bytes. */
  raw: Buffer;
  /** keyIdFor(raw). */
  keyId: string;
}

/** `"key_" + first 24 hex of sha256(raw public key bytes)` (contract section 5). */
export function keyIdFor(rawPublicKey: Uint8Array): string {
  return `key_${sha256Hex(rawPublicKey).slice(0, 24)}`;
}

/** Import 32 raw bytes as an Ed25519 public KeyObject. */
export function publicKeyFromRaw(raw: Uint8Array): KeyObject {
  if (raw.byteLength !== ED25519_PUBLIC_KEY_BYTES) {
    throw new KeyFormatError(
      'MALFORMED',
      `an Ed25519 public key has ${ED25519_PUBLIC_KEY_BYTES} bytes, got ${raw.byteLength}`,
    );
  }
  try {
    return createPublicKey({ key: Buffer.concat([SPKI_PREFIX, raw]), format: 'der', type: 'spki' });
  } catch {
    throw new KeyFormatError('MALFORMED', 'not a valid Ed25519 public key');
  }
}

/** The 32 raw bytes of an Ed25519 public KeyObject. */
export function rawPublicKey(key: KeyObject): Buffer {
  if (key.type !== 'public') throw new KeyFormatError('NOT_PUBLIC', `expected a public key, got a ${key.type} key`);
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new KeyFormatError('NOT_ED25519', `expected an Ed25519 key, got ${key.asymmetricKeyType ?? 'unknown'}`);
  }
  // The SPKI DER of an Ed25519 key is the fixed 12-byte prefix followed by the raw key.
  return key.export({ format: 'der', type: 'spki' }).subarray(SPKI_PREFIX.length);
}

/**
 * Parse an agent's public key as the contract allows it: SPKI PEM ("-----BEGIN PUBLIC KEY-----") or base64url of the
 * raw 32 bytes. Anything else, including private keys, certificates and non-Ed25519 keys, throws KeyFormatError.
 */
export function parsePublicKey(input: string): ParsedPublicKey {
  if (typeof input !== 'string') throw new KeyFormatError('MALFORMED', 'public key must be a string');
  const text = input.trim();
  let keyObject: KeyObject;
  if (text.startsWith('-----BEGIN')) {
    // createPublicKey would happily derive a public key from a private key PEM; only a SPKI block is a public key.
    if (!text.startsWith('-----BEGIN PUBLIC KEY-----')) {
      throw new KeyFormatError('NOT_PUBLIC', 'PEM must be a "PUBLIC KEY" (SPKI) block');
    }
    if (!/^-----BEGIN PUBLIC KEY-----\r?\n[A-Za-z0-9+/=\r\n]+-----END PUBLIC KEY-----$/.test(text)) {
      throw new KeyFormatError('MALFORMED', 'PEM must be a single well-formed "PUBLIC KEY" block');
    }
    try {
      keyObject = createPublicKey({ key: text, format: 'pem' });
    } catch {
      throw new KeyFormatError('MALFORMED', 'unreadable SPKI PEM');
    }
  } else {
    let raw: Buffer;
    try {
      raw = base64urlDecode(text);
    } catch {
      throw new KeyFormatError('MALFORMED', 'public key is neither SPKI PEM nor base64url of 32 raw bytes');
    }
    keyObject = publicKeyFromRaw(raw);
  }
  const raw = rawPublicKey(keyObject);
  return { keyObject, raw, keyId: keyIdFor(raw) };
}

/**
 * Parse an Ed25519 private key: PKCS#8 PEM ("-----BEGIN PRIVATE KEY-----") or base64url of the 32-byte seed.
 * Meant for configuration (the service signing key) and test clients.
 */
export function parsePrivateKey(input: string): KeyObject {
  const text = input.trim();
  let key: KeyObject;
  try {
    if (text.startsWith('-----BEGIN')) {
      if (!/^-----BEGIN PRIVATE KEY-----/.test(text)) {
        throw new KeyFormatError('NOT_PRIVATE', 'PEM must be an unencrypted PKCS#8 "PRIVATE KEY" block');
      }
      key = createPrivateKey({ key: text, format: 'pem' });
    } else {
      const seed = base64urlDecode(text);
      if (seed.length !== 32) throw new KeyFormatError('MALFORMED', 'an Ed25519 seed has 32 bytes');
      key = createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, seed]), format: 'der', type: 'pkcs8' });
    }
  } catch (err) {
    if (err instanceof KeyFormatError) throw err;
    throw new KeyFormatError('MALFORMED', 'unreadable Ed25519 private key');
  }
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new KeyFormatError('NOT_ED25519', `expected an Ed25519 key, got ${key.asymmetricKeyType ?? 'unknown'}`);
  }
  return key;
}

/** The public half of a private KeyObject, parsed like any public key. */
export function publicKeyOf(privateKey: KeyObject): ParsedPublicKey {
  const keyObject = createPublicKey(privateKey);
  const raw = rawPublicKey(keyObject);
  return { keyObject, raw, keyId: keyIdFor(raw) };
}

export interface Ed25519KeyPair extends ParsedPublicKey {
  privateKey: KeyObject;
  publicKey: KeyObject;
}

/** A fresh Ed25519 key pair with its raw public bytes and keyId. */
export function generateEd25519KeyPair(): Ed25519KeyPair {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const raw = rawPublicKey(publicKey);
  return { privateKey, publicKey, keyObject: publicKey, raw, keyId: keyIdFor(raw) };
}

/** PEM encodings, e.g. to persist a generated dev key or to register an agent key in SPKI form. */
export function privateKeyToPem(key: KeyObject): string {
  return key.export({ format: 'pem', type: 'pkcs8' }).toString();
}
export function publicKeyToPem(key: KeyObject): string {
  return key.export({ format: 'pem', type: 'spki' }).toString();
}

// ---------------------------------------------------------------------------------------------------------------
// JWK (RFC 8037: OKP / Ed25519)

export interface Ed25519Jwk {
  kty: 'OKP';
  crv: 'Ed25519';
  x: string;
  kid?: string;
  alg?: 'EdDSA';
  use?: 'sig';
}

/** Public JWK for raw key bytes; `kid` defaults to keyIdFor(raw). */
export function rawToJwk(raw: Uint8Array, kid: string = keyIdFor(raw)): Ed25519Jwk {
  if (raw.byteLength !== ED25519_PUBLIC_KEY_BYTES) {
    throw new KeyFormatError('MALFORMED', `an Ed25519 public key has ${ED25519_PUBLIC_KEY_BYTES} bytes`);
  }
  return { kty: 'OKP', crv: 'Ed25519', x: base64urlEncode(raw), kid, alg: 'EdDSA', use: 'sig' };
}

/** Raw public key bytes of an OKP/Ed25519 JWK; throws KeyFormatError for anything else (including private JWKs). */
export function jwkToRaw(jwk: unknown): Buffer {
  if (typeof jwk !== 'object' || jwk === null) throw new KeyFormatError('MALFORMED', 'JWK must be an object');
  const k = jwk as Record<string, unknown>;
  if (k.kty !== 'OKP' || k.crv !== 'Ed25519') throw new KeyFormatError('NOT_ED25519', 'JWK is not OKP/Ed25519');
  if ('d' in k) throw new KeyFormatError('NOT_PUBLIC', 'JWK carries private key material');
  if (typeof k.x !== 'string') throw new KeyFormatError('MALFORMED', 'JWK has no "x"');
  let raw: Buffer;
  try {
    raw = base64urlDecode(k.x);
  } catch {
    throw new KeyFormatError('MALFORMED', 'JWK "x" is not base64url');
  }
  if (raw.length !== ED25519_PUBLIC_KEY_BYTES) {
    throw new KeyFormatError('MALFORMED', `JWK "x" must hold ${ED25519_PUBLIC_KEY_BYTES} bytes`);
  }
  return raw;
}

// ---------------------------------------------------------------------------------------------------------------
// Signatures

/**
 * Where Ed25519 signatures are made and checked. The default is node:crypto (OpenSSL). A provider must sign byte for
 * byte what OpenSSL signs (Ed25519 is deterministic, RFC 8032) and accept no signature OpenSSL refuses.
 */
export interface Ed25519Provider {
  readonly name: string;
  sign(privateKey: KeyObject, data: Uint8Array): Buffer;
  verify(publicKey: KeyObject, data: Uint8Array, signature: Uint8Array): boolean;
}

export const OPENSSL_ED25519: Ed25519Provider = {
  name: 'openssl',
  sign: (privateKey, data) => nodeSign(null, data, privateKey),
  verify: (publicKey, data, signature) => nodeVerify(null, data, publicKey, signature),
};

let ed25519: Ed25519Provider = OPENSSL_ED25519;

/** Puts another Ed25519 implementation under signBytes and verifyBytes for this copy of the module. */
export function useEd25519Provider(provider: Ed25519Provider): void {
  ed25519 = provider;
}

/** The name of the Ed25519 provider in use ('openssl' unless a process installed another). */
export function ed25519ProviderName(): string {
  return ed25519.name;
}

/** Ed25519 signature (64 bytes) of `data`. */
export function signBytes(privateKey: KeyObject, data: Uint8Array): Buffer {
  return ed25519.sign(privateKey, data);
}

/** Ed25519 verification; false (never a throw) for a wrong-length or otherwise unusable signature. */
export function verifyBytes(publicKey: KeyObject, data: Uint8Array, signature: Uint8Array): boolean {
  if (signature.byteLength !== ED25519_SIGNATURE_BYTES) return false;
  try {
    return ed25519.verify(publicKey, data, signature);
  } catch {
    return false;
  }
}

/** base64url Ed25519 signature over the bytes of a hex digest (how events and artifacts are signed). */
export function signHexDigest(privateKey: KeyObject, hex: string): string {
  return base64urlEncode(signBytes(privateKey, hexToBytes(hex)));
}

/** Verify a base64url signature over the bytes of a hex digest; malformed input yields false. */
export function verifyHexDigest(publicKey: KeyObject, hex: string, signatureB64url: string): boolean {
  let digest: Buffer;
  let sig: Buffer;
  try {
    digest = hexToBytes(hex);
    sig = base64urlDecode(signatureB64url);
  } catch {
    return false;
  }
  return verifyBytes(publicKey, digest, sig);
}

// ---------------------------------------------------------------------------------------------------------------
// Ids

/**
 * Random bytes for ids, drawn from the CSPRNG 4 KiB at a time (as node's randomUUID does): a call per id cost
 * ~25 µs here, and a paid call makes three ids. Each byte is handed out once.
 */
const randomPool = Buffer.alloc(4096);
let randomPoolNext = randomPool.length;
function randomByte(): number {
  if (randomPoolNext === randomPool.length) {
    randomFillSync(randomPool);
    randomPoolNext = 0;
  }
  return randomPool[randomPoolNext++]!;
}

/** The characters of an id's random part. */
export const ID_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
/** 24 alphanumeric characters = ~143 bits of entropy. */
export const ID_RANDOM_LENGTH = 24;

/**
 * `prefix + "_" + 24 random alphanumerics` from the CSPRNG. Alphanumeric (not base64url) so the random
 * part never contains "_" or "-" and ids stay easy to select and split on the first "_".
 */
export function newId(prefix: string): string {
  let out = '';
  while (out.length < ID_RANDOM_LENGTH) {
    const byte = randomByte();
    // Rejection sampling: 248 = 4 * 62, so accepted bytes map uniformly onto the alphabet.
    if (byte < 248) out += ID_ALPHABET[byte % 62];
  }
  return `${prefix}_${out}`;
}
