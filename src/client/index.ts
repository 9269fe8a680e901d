// agent-settlement/client: a typed client for the Agent Run Settlement Service.
//
//   import { createSettlementClient } from 'agent-settlement/client';
//   const client = createSettlementClient({ baseUrl: 'http://127.0.0.1:3000', apiKey: process.env.SETTLEMENT_API_KEY });
//   const agent = await client.createAgent({ name: 'summarizer' });
//   const run = await client.createRun({ body: { agentId: agent.agentId } });
//   await client.appendEvents(await client.eventSigner(run.runId, agent), [{ type: 'metric', payload: { name: 'accuracy', value: 0.94 } }]);
//
// See README "Client" and examples/quick-start.ts.
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
export { verifyArtifact, type ArtifactVerification } from '../domain/artifact.ts';
export { verifyReceipt, type ReceiptVerification } from '../domain/receipt.ts';
export {
  verifyWebhook,
  WebhookVerificationError,
  type VerifyWebhookOptions,
  type WebhookEvent,
  type WebhookHeaders,
  type WebhookSecret,
} from '../webhooks/verify.ts';
export type { components, operations, paths } from './generated/openapi.ts';
