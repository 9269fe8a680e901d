// Price schedules, usage and its priced amount live in the client package, beside the artifact that records them, so
// the service and every offline verifier compute the same amount.
export * from 'agent-settlement-client/pricing';
