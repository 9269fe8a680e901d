// Witnessed usage lives in the client package, beside the statement verifier that checks it, so the service and every
// offline verifier digest, check and price a usage record the same way.
export * from 'agent-settlement-client/usage';
