// agent-settlement-client: a typed client for the Agent Run Settlement Service, its event signer and its offline
// verifiers. Compiled to ESM and CommonJS with types; depends on openapi-fetch and node:crypto only.
//
//   import { createSettlementClient } from 'agent-settlement-client';   // or require('agent-settlement-client')
//   const client = createSettlementClient({ baseUrl: 'http://127.0.0.1:3000', apiKey: process.env.SETTLEMENT_API_KEY });
//   const agent = await client.createAgent({ name: 'summarizer' });
//   const run = await client.createRun({ body: { agentId: agent.agentId } });
//   await client.appendEvents(await client.eventSigner(run.runId, agent), [{ type: 'metric', payload: { name: 'accuracy', value: 0.94 } }]);
//
// See the service's README "Client" and examples/quick-start.ts.
export {
  createSettlementClient,
  type Artifact,
  type CallOptions,
  type Jwks,
  type OperationCall,
  type OperationId,
  type OperationMethods,
  type OperationResult,
  type RegisteredAgent,
  type Run,
  type RunSettlement,
  type SettlementClient,
  type SettlementClientOptions,
  type WaitOptions,
} from './client.ts';
export { SettlementApiError, type ApiErrorBody } from './errors.ts';
export {
  RunEventSigner,
  agentKeyPairFromPrivateKey,
  exportAgentPrivateKey,
  generateAgentKeyPair,
  type AgentKeyPair,
  type ChainHead,
  type EventEnvelope,
  type EventInput,
  type JsonValue,
} from './signer.ts';
export { retryingFetch, type FetchLike, type RetryOptions } from './transport.ts';
// Offline verification: the checks the service itself runs, here for anyone holding the document and the JWKS.
export { ARTIFACT_CHECKS, verifyArtifact, type ArtifactCheck, type ArtifactVerification } from './artifact.ts';
export { verifyReceipt, type ReceiptCheck, type ReceiptVerification } from './receipt.ts';
export {
  checkPricedUsage,
  collectUsage,
  parsePriceSchedule,
  priceUsage,
  pricedCapture,
  pricedUsage,
  pricingProblems,
  pricingSha256,
  PricingError,
  type MetricPrice,
  type PriceSchedule,
  type PricedUsage,
  type Usage,
} from './pricing.ts';
export { STATEMENT_CHECKS, verifyStatement, type StatementCheck, type StatementVerification } from './statement.ts';
export {
  priceUsageRecord,
  signUsageRecord,
  usageDigest,
  usageProblem,
  usageSignatureValid,
  USAGE_RECORD_SCHEMA,
  type UsageProblem,
  type UsageRecord,
  type UsageSignature,
  type WitnessedUsage,
} from './usage.ts';
export {
  verifyWebhook,
  WebhookVerificationError,
  type VerifyWebhookOptions,
  type WebhookEvent,
  type WebhookHeaders,
  type WebhookSecret,
  type WebhookVerificationErrorCode,
} from './webhooks.ts';
export type { components, operations, paths } from './generated/openapi.ts';
