// The receiver helper lives in the client package (`agent-settlement-client/webhooks`); the service's own export
// (`agent-settlement/webhooks`) answers with the same code.
export * from 'agent-settlement-client/webhooks';
