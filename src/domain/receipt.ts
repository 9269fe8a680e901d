// Settlement receipts live in the client package (sign and offline verify), so the service and every verifier run the
// same code.
// Ed25519 on libsodium for the package's signing and verification (see crypto.ts).
import './crypto.ts';

export * from 'agent-settlement-client/receipt';
