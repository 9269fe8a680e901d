import { randomBytes } from 'node:crypto';
import { expect, it } from 'vitest';
import {
  ed25519ProviderName,
  generateEd25519KeyPair,
  OPENSSL_ED25519,
  signBytes,
  verifyBytes,
} from 'agent-settlement-client/crypto';
import { verifyEventBatch } from '../../src/domain/event-chain.ts';

// The client package signs and verifies with node:crypto; the service puts libsodium under the very same functions
// when its domain modules load (src/domain/crypto.ts), so appends verify at libsodium's speed and strictness.
it("the service's domain modules run the client package's Ed25519 on libsodium, signing what OpenSSL signs", () => {
  expect(typeof verifyEventBatch).toBe('function');
  expect(ed25519ProviderName()).toBe('libsodium');

  const { privateKey, publicKey } = generateEd25519KeyPair();
  const data = randomBytes(32);
  const signature = signBytes(privateKey, data);
  // Ed25519 is deterministic: libsodium's signature is OpenSSL's, byte for byte, and each verifies the other's.
  expect(signature.equals(OPENSSL_ED25519.sign(privateKey, data))).toBe(true);
  expect(OPENSSL_ED25519.verify(publicKey, data, signature)).toBe(true);
  expect(verifyBytes(publicKey, data, signature)).toBe(true);
  const altered = Buffer.from(signature);
  altered[0] = altered[0]! ^ 1;
  expect(verifyBytes(publicKey, data, altered)).toBe(false);
  expect(verifyBytes(publicKey, data, signature.subarray(1))).toBe(false);
});
