// Terms and their evaluation live in the client package, beside the artifact format that records the verdict.
export * from 'agent-settlement-client/terms';
