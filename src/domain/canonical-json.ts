// Canonical JSON (RFC 8785) lives in the client package: clients hash and sign with the same bytes the service checks.
export * from 'agent-settlement-client/canonical-json';
