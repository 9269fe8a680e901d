// Register → run → signed events → finalize → settle → verify, with the agent-settlement-client package only.
//   SETTLEMENT_URL=http://127.0.0.1:3000 SETTLEMENT_ADMIN_KEY=$(cat .data/admin-key) node --import tsx examples/quick-start.ts
import { createSettlementClient } from 'agent-settlement-client';

const baseUrl = process.env.SETTLEMENT_URL ?? 'http://127.0.0.1:3000';
// The admin key sets up a tenant, its API key and money; everything after it is what a tenant does with its own key.
const admin = createSettlementClient({ baseUrl, apiKey: process.env.SETTLEMENT_ADMIN_KEY });
const tenant = await admin.createTenant({ body: { name: 'quick-start' } });
const { token } = await admin.issueApiKey({
  body: { tenantId: tenant.tenantId, scopes: ['agents:write', 'runs:write'] },
});
const client = createSettlementClient({ baseUrl, apiKey: token });

// Two agents: a buyer who pays, a worker who does the run and signs its events (each gets its own Ed25519 key).
const buyer = await client.createAgent({ name: 'buyer' });
const worker = await client.createAgent({ name: 'summarizer' });
await admin.creditWallet({ params: { path: { walletId: buyer.agentId } }, body: { amount: 10_000, currency: 'USD' } });

// The run's terms and price: 25.00 USD locked in the buyer's escrow now, paid if the worker meets the terms.
const run = await client.createRun({
  body: {
    agentId: worker.agentId,
    terms: { accuracy: { min: 0.9 }, latencyP95: { max: 800 } },
    settlement: { payerAgentId: buyer.agentId, amount: 2_500, currency: 'USD' },
  },
});

// The worker reports what happened: hash-chained, signed events (the signer does the contract's rules).
const signer = await client.eventSigner(run.runId, worker);
await client.appendEvents(signer, [
  { type: 'tool_call', payload: { tool: 'search', query: 'settlement' } },
  { type: 'sample', payload: { latencyMs: 420, correct: true } },
  { type: 'sample', payload: { latencyMs: 610, correct: true } },
]);
await client.appendEvents(signer, [{ type: 'metric', payload: { name: 'accuracy', value: 0.96 } }]);

// Finalize: a worker builds the signed artifact and evaluates the terms.
await client.finalizeRun({ params: { path: { runId: run.runId } } });
const finalized = await client.waitForFinalized(run.runId);
console.log(`run ${run.runId}: ${finalized.status}, verdict ${finalized.verdict}, ${finalized.head.seq} events`);

// Settle: the verdict decides who gets the escrow.
await client.settleRun({ params: { path: { runId: run.runId } } });
const settlement = await client.waitForSettlement(run.runId);
console.log(
  `settlement ${settlement.settlementId}: ${settlement.status}, released ${settlement.releasedAmount} ${settlement.currency}`,
);

// Verify here, not by asking the service: the artifact's hashes and signatures, and the receipt, against its JWKS.
const artifact = await client.verifyArtifactLocally(finalized.artifactId!);
const receipt = await client.verifyReceiptLocally(run.runId);
console.log(
  `artifact ${artifact.artifact.artifactId}: ${artifact.verified ? 'verified' : `NOT verified ${artifact.failures.join('; ')}`}`,
);
console.log(
  `receipt ${settlement.receipt?.receiptHash}: ${receipt.verified ? 'verified' : `NOT verified ${receipt.failures.join('; ')}`}`,
);
process.exitCode = artifact.verified && receipt.verified ? 0 : 1;
