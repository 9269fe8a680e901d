import { createPublicKey, generateKeyPairSync, sign as opensslSign, verify as opensslVerify } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  base64urlDecode,
  base64urlEncode,
  ED25519_VERIFIER,
  EncodingError,
  generateEd25519KeyPair,
  hexToBytes,
  ID_RANDOM_LENGTH,
  jwkToRaw,
  keyIdFor,
  KeyFormatError,
  newId,
  parsePrivateKey,
  parsePublicKey,
  publicKeyOf,
  publicKeyToPem,
  rawToJwk,
  sha256Hex,
  signBytes,
  signHexDigest,
  verifyBytes,
  verifyHexDigest,
} from '../../src/domain/crypto.ts';

// RFC 8032 section 7.1, TEST 1 (empty message).
const RFC8032 = {
  seed: '9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60',
  pub: 'd75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a',
  sig: 'e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b',
};

function reasonOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KeyFormatError);
    return (err as KeyFormatError).reason;
  }
  throw new Error('expected a KeyFormatError');
}

describe('sha256Hex', () => {
  it('hashes strings as UTF-8 and bytes as given', () => {
    expect(sha256Hex('abc')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    expect(sha256Hex(new Uint8Array([0x61, 0x62, 0x63]))).toBe(sha256Hex('abc'));
    expect(sha256Hex('é')).toBe(sha256Hex(Buffer.from([0xc3, 0xa9])));
  });
});

describe('base64url and hex', () => {
  it('round-trips without padding', () => {
    const bytes = new Uint8Array([0xfb, 0xff, 0x00, 0x3e]);
    expect(base64urlEncode(bytes)).toBe('-_8APg');
    expect([...base64urlDecode('-_8APg')]).toEqual([...bytes]);
  });

  it('refuses padding, the standard alphabet, junk and non-canonical trailing bits', () => {
    for (const bad of ['-_8APg==', '+/8APg', '-_8A Pg', 'QR', 'A']) {
      expect(() => base64urlDecode(bad), bad).toThrow(EncodingError);
    }
    expect(base64urlDecode('QQ').toString()).toBe('A');
  });

  it('decodes only lowercase, even-length hex', () => {
    expect([...hexToBytes('00ff')]).toEqual([0, 255]);
    for (const bad of ['0', '00FF', 'zz']) expect(() => hexToBytes(bad)).toThrow(EncodingError);
  });
});

describe('Ed25519 keys', () => {
  const pubRaw = Buffer.from(RFC8032.pub, 'hex');

  it('keyIdFor is "key_" + the first 24 hex of sha256(raw)', () => {
    expect(keyIdFor(pubRaw)).toBe(`key_${sha256Hex(pubRaw).slice(0, 24)}`);
    expect(keyIdFor(pubRaw)).toMatch(/^key_[0-9a-f]{24}$/);
  });

  it('parses base64url of the raw 32 bytes and SPKI PEM to the same key', () => {
    const fromRaw = parsePublicKey(base64urlEncode(pubRaw));
    expect(fromRaw.raw.equals(pubRaw)).toBe(true);
    expect(fromRaw.keyId).toBe(keyIdFor(pubRaw));
    const pem = publicKeyToPem(fromRaw.keyObject);
    expect(pem).toMatch(/^-----BEGIN PUBLIC KEY-----/);
    const fromPem = parsePublicKey(pem);
    expect(fromPem.raw.equals(pubRaw)).toBe(true);
    expect(fromPem.keyId).toBe(fromRaw.keyId);
    expect(parsePublicKey(`\n  ${pem}\n`).keyId).toBe(fromRaw.keyId);
  });

  it('rejects keys that are not Ed25519 public keys', () => {
    const rsa = generateKeyPairSync('rsa', { modulusLength: 1024 });
    const x25519 = generateKeyPairSync('x25519');
    expect(reasonOf(() => parsePublicKey(rsa.publicKey.export({ type: 'spki', format: 'pem' }).toString()))).toBe(
      'NOT_ED25519',
    );
    expect(reasonOf(() => parsePublicKey(x25519.publicKey.export({ type: 'spki', format: 'pem' }).toString()))).toBe(
      'NOT_ED25519',
    );
    const ed = generateEd25519KeyPair();
    // A private key PEM must not be accepted as "the public key" even though node could derive one from it.
    expect(reasonOf(() => parsePublicKey(ed.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()))).toBe(
      'NOT_PUBLIC',
    );
    expect(reasonOf(() => parsePublicKey(base64urlEncode(Buffer.alloc(31))))).toBe('MALFORMED');
    expect(reasonOf(() => parsePublicKey(base64urlEncode(Buffer.alloc(33))))).toBe('MALFORMED');
    expect(reasonOf(() => parsePublicKey('not a key!'))).toBe('MALFORMED');
    expect(reasonOf(() => parsePublicKey('-----BEGIN PUBLIC KEY-----\n!!!\n-----END PUBLIC KEY-----'))).toBe(
      'MALFORMED',
    );
    expect(reasonOf(() => parsePublicKey('-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----'))).toBe(
      'NOT_PUBLIC',
    );
    expect(reasonOf(() => parsePublicKey(''))).toBe('MALFORMED');
  });

  it('parses private keys from the 32-byte seed and PKCS#8 PEM', () => {
    const fromSeed = parsePrivateKey(base64urlEncode(Buffer.from(RFC8032.seed, 'hex')));
    expect(publicKeyOf(fromSeed).raw.toString('hex')).toBe(RFC8032.pub);
    const pem = fromSeed.export({ type: 'pkcs8', format: 'pem' }).toString();
    expect(publicKeyOf(parsePrivateKey(pem)).raw.toString('hex')).toBe(RFC8032.pub);
    const rsa = generateKeyPairSync('rsa', { modulusLength: 1024 });
    expect(reasonOf(() => parsePrivateKey(rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()))).toBe(
      'NOT_ED25519',
    );
    expect(reasonOf(() => parsePrivateKey(publicKeyToPem(publicKeyOf(fromSeed).keyObject)))).toBe('NOT_PRIVATE');
  });
});

describe('Ed25519 signatures', () => {
  it('reproduces the RFC 8032 test vector', () => {
    const priv = parsePrivateKey(base64urlEncode(Buffer.from(RFC8032.seed, 'hex')));
    const sig = signBytes(priv, new Uint8Array(0));
    expect(sig.toString('hex')).toBe(RFC8032.sig);
    const pub = parsePublicKey(base64urlEncode(Buffer.from(RFC8032.pub, 'hex'))).keyObject;
    expect(verifyBytes(pub, new Uint8Array(0), sig)).toBe(true);
    expect(verifyBytes(pub, new Uint8Array([0]), sig)).toBe(false);
  });

  it('signs hex digests over their bytes and refuses tampering', () => {
    const { privateKey, publicKey } = generateEd25519KeyPair();
    const digest = sha256Hex('hello');
    const sig = signHexDigest(privateKey, digest);
    expect(base64urlDecode(sig)).toHaveLength(64);
    expect(verifyBytes(publicKey, Buffer.from(digest, 'hex'), base64urlDecode(sig))).toBe(true);
    expect(verifyHexDigest(publicKey, digest, sig)).toBe(true);
    expect(verifyHexDigest(publicKey, sha256Hex('hellO'), sig)).toBe(false);
    expect(verifyHexDigest(generateEd25519KeyPair().publicKey, digest, sig)).toBe(false);
    // Malformed signatures are a "no", never an exception.
    expect(verifyHexDigest(publicKey, digest, `${sig}A`)).toBe(false);
    expect(verifyHexDigest(publicKey, digest, sig.slice(0, -2))).toBe(false);
    expect(verifyHexDigest(publicKey, digest, '')).toBe(false);
    expect(verifyHexDigest(publicKey, digest.toUpperCase(), sig)).toBe(false);
  });

  it('signs with libsodium exactly what OpenSSL signs', () => {
    // Ed25519 is deterministic: receipts and tokens signed on the fast path are the same bytes any verifier expects.
    for (const size of [0, 32, 600, 5_000]) {
      const { privateKey, publicKey } = generateEd25519KeyPair();
      const message = Buffer.alloc(size, size % 251);
      const signature = signBytes(privateKey, message);
      expect(signature.equals(opensslSign(null, message, privateKey))).toBe(true);
      expect(signBytes(privateKey, message).equals(signature)).toBe(true); // the cached key signs the same again
      expect(opensslVerify(null, message, publicKey, signature)).toBe(true);
    }
  });

  it('verifies with libsodium, agreeing with OpenSSL on valid, tampered and non-canonical signatures', () => {
    // The fast path is the point: were the binary to stop loading, appends would silently get 2.5x dearer.
    expect(ED25519_VERIFIER).toBe('libsodium');
    const { privateKey, publicKey } = generateEd25519KeyPair();
    const other = generateEd25519KeyPair().publicKey;
    const message = Buffer.from(sha256Hex('event'), 'hex');
    const good = signBytes(privateKey, message);
    const flipped = (buf: Buffer, at: number) =>
      Buffer.concat([buf.subarray(0, at), Buffer.from([buf[at]! ^ 1]), buf.subarray(at + 1)]);
    // S + L: the same signature with a non-canonical scalar, which RFC 8032 says to refuse.
    const L = 2n ** 252n + 27742317777372353535851937790883648493n;
    const s = BigInt(`0x${Buffer.from(good.subarray(32)).reverse().toString('hex')}`) + L;
    const sPlusL = Buffer.concat([
      good.subarray(0, 32),
      Buffer.from(s.toString(16).padStart(64, '0'), 'hex').reverse(),
    ]);
    const cases: Array<[string, Buffer, Buffer, typeof publicKey]> = [
      ['valid', message, good, publicKey],
      ['tampered message', flipped(message, 3), good, publicKey],
      ['tampered R', message, flipped(good, 5), publicKey],
      ['tampered S', message, flipped(good, 40), publicKey],
      ['another key', message, good, other],
      ['non-canonical S', message, sPlusL, publicKey],
    ];
    const answers = cases.map(([name, m, sig, key]) => [
      name,
      verifyBytes(key, m, sig),
      opensslVerify(null, m, key, sig),
    ]);
    expect(answers).toEqual(cases.map(([name], i) => [name, i === 0, i === 0]));
  });
});

describe('JWK', () => {
  it('converts raw keys to OKP/Ed25519 JWKs and back', () => {
    const { raw, keyId, publicKey } = generateEd25519KeyPair();
    const jwk = rawToJwk(raw);
    expect(jwk).toEqual({ kty: 'OKP', crv: 'Ed25519', x: base64urlEncode(raw), kid: keyId, alg: 'EdDSA', use: 'sig' });
    expect(jwkToRaw(jwk).equals(raw)).toBe(true);
    // Node's own JWK export agrees on "x".
    expect(publicKey.export({ format: 'jwk' }).x).toBe(jwk.x);
    expect(rawToJwk(raw, 'svc-1').kid).toBe('svc-1');
    expect(createPublicKey({ key: { ...jwk }, format: 'jwk' }).asymmetricKeyType).toBe('ed25519');
  });

  it('refuses non-Ed25519, private and malformed JWKs', () => {
    const { raw } = generateEd25519KeyPair();
    const jwk = rawToJwk(raw);
    expect(reasonOf(() => jwkToRaw({ ...jwk, crv: 'X25519' }))).toBe('NOT_ED25519');
    expect(reasonOf(() => jwkToRaw({ ...jwk, kty: 'EC' }))).toBe('NOT_ED25519');
    expect(reasonOf(() => jwkToRaw({ ...jwk, d: jwk.x }))).toBe('NOT_PUBLIC');
    expect(reasonOf(() => jwkToRaw({ ...jwk, x: jwk.x.slice(1) }))).toBe('MALFORMED');
    expect(reasonOf(() => jwkToRaw(null))).toBe('MALFORMED');
    expect(reasonOf(() => rawToJwk(raw.subarray(1)))).toBe('MALFORMED');
  });
});

describe('newId', () => {
  it('is prefix + "_" + 24 random alphanumerics, never repeating', () => {
    const ids = Array.from({ length: 2000 }, () => newId('evt'));
    for (const id of ids) expect(id).toMatch(new RegExp(`^evt_[A-Za-z0-9]{${ID_RANDOM_LENGTH}}$`));
    expect(new Set(ids).size).toBe(ids.length);
    // Every alphabet position gets used (guards against a biased or truncated mapping).
    const chars = new Set(ids.join('').replaceAll('evt_', ''));
    expect(chars.size).toBe(62);
  });
});
