// Run events' hash chain: the format, signing and verification live in the client package (agents sign with it, the
// CLI verifies with it); the attestation, the service's own MAC over what it verified at append, lives here.
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { EventEnvelope } from 'agent-settlement-client/event-chain';
// Ed25519 on libsodium for the package's verification (see crypto.ts).
import './crypto.ts';

export * from 'agent-settlement-client/event-chain';

// ---------------------------------------------------------------------------------------------------------------
// Attestation: "these signatures were verified at append"

/**
 * The service's MAC over a verified batch: run, and every event's seq, id, signer, chainHash and signature. Stored
 * with the batch, it lets a later full-chain check (finalize, public verify) skip the Ed25519 checks of exactly
 * these events; whoever cannot produce it (storage corruption, a write around the service) gets a full check.
 * Payloads are bound through chainHash, which the full-chain check recomputes. The artifact does not change and
 * anyone can still verify it offline from the artifact and the JWKS.
 */
export function batchAttestation(
  key: Uint8Array,
  runId: string,
  events: ReadonlyArray<Pick<EventEnvelope, 'seq' | 'id' | 'signerKeyId' | 'chainHash' | 'signature'>>,
): string {
  const mac = createHmac('sha256', key).update(`run-batch-v1\n${runId}\n`);
  for (const e of events) mac.update(`${e.seq}\n${e.id}\n${e.signerKeyId}\n${e.chainHash}\n${e.signature}\n`);
  return mac.digest('base64url');
}

export function attestationHolds(
  key: Uint8Array,
  runId: string,
  events: Parameters<typeof batchAttestation>[2],
  attestation: string,
): boolean {
  const expected = Buffer.from(batchAttestation(key, runId, events));
  const given = Buffer.from(attestation);
  return expected.length === given.length && timingSafeEqual(expected, given);
}
