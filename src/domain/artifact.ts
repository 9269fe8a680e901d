// RunArtifact.v1 lives in the client package (build, hash, sign, offline verify), so the service and every verifier
// run the same code.
// Ed25519 on libsodium for the package's signing and verification (see crypto.ts).
import './crypto.ts';

export * from 'agent-settlement-client/artifact';
