// The MCP server: one tool per step of the service's flows, each a thin HTTP call (append_events also signs the
// events locally with the agent's key). Tool results carry structuredContent plus a short text; any failure is an
// isError result with the service's code, message, details and status. Nothing here writes to stdout.
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import packageJson from '../../package.json' with { type: 'json' };
import type { JsonValue } from '../domain/canonical-json.ts';
import { base64urlEncode, generateEd25519KeyPair, newId } from '../domain/crypto.ts';
import { signEvents } from '../domain/event-chain.ts';
import { ApiClient, ApiError, type FetchLike } from './api-client.ts';
import type { McpConfig } from './config.ts';
import { defaultKeyFilePath, KeyFile, KeyFileError, type AgentKeyStore } from './key-file.ts';
import {
  AgentId,
  EventInput,
  GateCreateInput,
  IdempotencyKey,
  KeyFilePath,
  Outputs,
  SettlementTerms,
  Sha256Hex,
  Terms,
  ToolError,
  toolOutput,
} from './schemas.ts';

/** A failure found by the MCP server itself (not by the service), reported like a service error. */
class ToolFailure extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

interface ToolOutcome {
  summary: string;
  data: Record<string, unknown>;
}

const path = (...parts: string[]) => parts.map((p) => encodeURIComponent(p)).join('/');

/** Replaces the API key, its secret and any PEM private key in every string of a value. */
function redactor(apiKey: string): <T>(value: T) => T {
  const secret = apiKey.slice(apiKey.indexOf('.') + 1);
  const pem = /-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----/g;
  const scrub = (text: string) =>
    text.replaceAll(apiKey, '[redacted]').replaceAll(secret, '[redacted]').replace(pem, '[redacted]');
  const walk = (value: unknown): unknown => {
    if (typeof value === 'string') return scrub(value);
    if (Array.isArray(value)) return value.map(walk);
    if (typeof value === 'object' && value !== null)
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, walk(v)]));
    return value;
  };
  return <T>(value: T) => walk(value) as T;
}

export interface McpServerOptions {
  /** How the tools reach the API; default: fetch over the network to config.baseUrl. */
  fetch?: FetchLike;
  /**
   * Where agents' private keys live, given the tool's `keyFile` argument. Default: local key files (the stdio server,
   * on the runtime's machine). The service's own /mcp passes a store of its own and refuses paths.
   */
  agentKeys?: (requestedKeyFile: string | undefined) => AgentKeyStore;
}

/** Local key files, one instance per path so that its writes are serialized. */
function localKeyFiles(tenantId: string): (requested: string | undefined) => AgentKeyStore {
  const keyFiles = new Map<string, KeyFile>();
  return (requested) => {
    const candidate = new KeyFile(requested ?? defaultKeyFilePath(tenantId), tenantId);
    const known = keyFiles.get(candidate.path);
    if (known) return known;
    keyFiles.set(candidate.path, candidate);
    return candidate;
  };
}

export function buildMcpServer(
  config: McpConfig,
  log: (line: string) => void = () => undefined,
  options: McpServerOptions = {},
): McpServer {
  const api = new ApiClient(config.baseUrl, config.apiKey, undefined, options.fetch);
  const redact = redactor(config.apiKey);
  const keyFile = options.agentKeys ?? localKeyFiles(config.tenantId);

  const server = new McpServer(
    { name: 'agent-settlement', version: packageJson.version },
    {
      instructions:
        'Drives the Agent Run Settlement Service: register an agent (its Ed25519 key stays in a local key file), create a run ' +
        'under terms, append signed events, finalize, verify, settle; x402 gate tools pay for tool calls. Amounts are integer minor units.',
    },
  );

  function failure(name: string, err: unknown): CallToolResult {
    let error: z.infer<typeof ToolError>;
    if (err instanceof ApiError) {
      error = { code: err.code, message: err.message };
      if (err.status !== null) error.status = err.status;
      if (err.details !== undefined) error.details = err.details;
      if (err.requestId !== undefined) error.requestId = err.requestId;
    } else if (err instanceof KeyFileError || err instanceof ToolFailure) {
      error = { code: err.code, message: err.message };
    } else {
      error = { code: 'TOOL_FAILED', message: err instanceof Error ? err.message : String(err) };
      log(`agent-settlement mcp: ${name} failed unexpectedly: ${redact(error.message)}`);
    }
    const safe = redact(error);
    const status = safe.status === undefined ? '' : ` (HTTP ${safe.status})`;
    const details = safe.details === undefined ? '' : `\ndetails: ${JSON.stringify(safe.details)}`;
    return {
      isError: true,
      content: [{ type: 'text', text: `${safe.code}${status}: ${safe.message}${details}` }],
      structuredContent: { error: safe },
    };
  }

  function tool<I extends z.ZodRawShape, O extends z.ZodRawShape>(
    name: string,
    description: string,
    input: I,
    output: O,
    handler: (args: z.infer<z.ZodObject<I>>) => Promise<ToolOutcome>,
  ): void {
    // The SDK types the callback from the concrete shape; for a generic shape TypeScript cannot relate the two.
    server.registerTool(name, { description, inputSchema: input, outputSchema: toolOutput(output) }, (async (
      args: z.infer<z.ZodObject<I>>,
    ): Promise<CallToolResult> => {
      try {
        const { summary, data } = await handler(args);
        const structured = redact(data);
        return {
          content: [{ type: 'text', text: `${redact(summary)}\n${JSON.stringify(structured)}` }],
          structuredContent: structured,
        };
      } catch (err) {
        return failure(name, err);
      }
    }) as never);
  }

  const runIdInput = { runId: z.string().min(1).max(128) };

  tool(
    'whoami',
    'Check the credentials: the tenant, key id and scopes of the API key, and the service health.',
    {},
    Outputs.whoami,
    async () => {
      const [identity, readiness] = await Promise.all([api.call('GET', '/v1/whoami'), api.send('GET', '/readyz')]);
      const { tenantId, keyId, scopes } = identity.body as { tenantId: string; keyId: string; scopes: string[] };
      if (tenantId !== config.tenantId) {
        throw new ToolFailure(
          'TENANT_MISMATCH',
          `SERVICE_API_KEY belongs to tenant ${tenantId}, but SERVICE_TENANT_ID is ${config.tenantId}`,
        );
      }
      const health = readiness.body;
      return {
        summary: `tenant ${tenantId}, key ${keyId}, scopes ${scopes.join(' ') || '(none)'}; service ${String(health.status)}`,
        data: { tenantId, keyId, scopes, serviceBaseUrl: config.baseUrl, health },
      };
    },
  );

  tool(
    'register_agent',
    'Create an Ed25519 key pair locally, register the agent with its public key, and keep the private key in the local key file.',
    {
      agentId: AgentId.optional().describe('full agent id; or give namespace and name'),
      namespace: z.string().optional(),
      name: z.string().optional(),
      displayName: z.string().max(200).optional(),
      metadata: z.record(z.string(), z.unknown()).optional(),
      keyFile: KeyFilePath,
    },
    Outputs.registerAgent,
    async (args) => {
      const file = keyFile(args.keyFile);
      await file.ensureUsable(); // before registering: a key that cannot be stored would leave an agent nobody can sign for
      const pair = generateEd25519KeyPair();
      const { keyFile: _path, ...fields } = args;
      const res = await api.call('POST', '/v1/agents', { body: { ...fields, publicKey: base64urlEncode(pair.raw) } });
      const { agentId, keyId, status, createdAt } = res.body as {
        agentId: string;
        keyId: string;
        status: string;
        createdAt: string;
      };
      if (keyId !== pair.keyId)
        throw new ToolFailure(
          'KEY_ID_MISMATCH',
          `the service derived key id ${keyId} for a key whose id is ${pair.keyId}`,
        );
      try {
        await file.save(agentId, pair.privateKey, keyId);
      } catch (err) {
        const reason = err instanceof Error ? err.message : String(err);
        throw new ToolFailure(
          'KEY_FILE_UNAVAILABLE',
          `agent ${agentId} is registered but its key could not be stored (${reason}); add a new key to it`,
        );
      }
      return {
        summary: `registered ${agentId} with key ${keyId}; private key in ${file.location}`,
        data: { agentId, keyId, status, createdAt, keyFile: file.location },
      };
    },
  );

  tool(
    'create_run',
    "Start a run of an agent under terms; with settlement terms, the amount is locked in the payer agent's escrow.",
    {
      agentId: AgentId,
      terms: Terms.optional(),
      settlement: SettlementTerms.optional(),
      idempotencyKey: IdempotencyKey,
    },
    Outputs.run,
    async ({ idempotencyKey, ...body }) => {
      const res = await api.call('POST', '/v1/runs', { body, idempotencyKey });
      return { summary: `run ${String(res.body.runId)} is ${String(res.body.status)}`, data: res.body };
    },
  );

  tool(
    'append_events',
    "Sign events with the run agent's local key, chain them after the run head, and append them as one batch.",
    {
      ...runIdInput,
      events: z.array(EventInput).min(1).max(100),
      keyFile: KeyFilePath,
    },
    Outputs.appended,
    async ({ runId, events, keyFile: requested }) => {
      const run = (await api.call('GET', `/v1/runs/${path(runId)}`)).body as {
        agentId: string;
        head: { seq: number; chainHash: string | null };
      };
      const signer = await keyFile(requested).load(run.agentId);
      const at = new Date().toISOString();
      const envelopes = signEvents(
        events.map((e) => ({
          id: e.id ?? newId('evt'),
          runId,
          type: e.type,
          at,
          payload: (e.payload ?? null) as JsonValue,
        })),
        run.head,
        signer.privateKey,
        signer.keyId,
      );
      // Without an idempotency key: a retry signs anew (new time, new head), so it could never replay the first answer.
      const res = await api.call('POST', `/v1/runs/${path(runId)}/events`, { body: { events: envelopes } });
      const head = res.body.head as { seq: number };
      return {
        summary: `${String(res.body.accepted)} events appended to ${runId}; head is seq ${head.seq}`,
        data: { ...res.body, eventIds: envelopes.map((e) => e.id) },
      };
    },
  );

  tool(
    'finalize_run',
    'Freeze the run; a worker builds its artifact and evaluates the terms (poll get_run until finalized).',
    { ...runIdInput, idempotencyKey: IdempotencyKey },
    Outputs.finalizing,
    async ({ runId, idempotencyKey }) => {
      const res = await api.call('POST', `/v1/runs/${path(runId)}/finalize`, { idempotencyKey });
      return { summary: `run ${runId} is ${String(res.body.status)}`, data: res.body };
    },
  );

  tool(
    'get_run',
    'A run with its status, verdict, artifact id, chain head and settlement terms.',
    runIdInput,
    Outputs.run,
    async ({ runId }) => {
      const res = await api.call('GET', `/v1/runs/${path(runId)}`);
      const verdict = res.body.verdict === null ? '' : `, verdict ${String(res.body.verdict)}`;
      return { summary: `run ${runId} is ${String(res.body.status)}${verdict}`, data: res.body };
    },
  );

  tool(
    'get_verification',
    'Verification of a finalized run: artifact hash, service signature, event signatures and chain.',
    runIdInput,
    Outputs.verification,
    async ({ runId }) => {
      const res = await api.call('GET', `/runs/${path(runId)}/verification`);
      return { summary: `run ${runId} ${res.body.verified === true ? 'verified' : 'NOT verified'}`, data: res.body };
    },
  );

  tool(
    'settle_run',
    'Settle a finalized run: a worker releases the escrow on pass or holds it on fail (poll get_settlement).',
    {
      ...runIdInput,
      settlement: SettlementTerms.optional().describe('only when the run was created without settlement terms'),
      idempotencyKey: IdempotencyKey,
    },
    Outputs.settleAccepted,
    async ({ runId, settlement, idempotencyKey }) => {
      const res = await api.call('POST', `/v1/runs/${path(runId)}/settle`, {
        body: settlement ? { settlement } : {},
        idempotencyKey,
      });
      return {
        summary: `settlement ${String(res.body.settlementId)} of ${runId} is ${String(res.body.status)}`,
        data: res.body,
      };
    },
  );

  tool(
    'get_settlement',
    'The settlement of a run: status, amounts released and refunded, holdback, decision and receipt.',
    runIdInput,
    Outputs.settlement,
    async ({ runId }) => {
      const res = await api.call('GET', `/runs/${path(runId)}/settlement`);
      return { summary: `settlement of ${runId} is ${String(res.body.status)}`, data: res.body };
    },
  );

  tool(
    'wallet_balance',
    'Available and escrowed balances of a wallet (an agent id or a sponsor wallet id), per currency.',
    { walletId: z.string().min(1).max(256) },
    Outputs.wallet,
    async ({ walletId }) => {
      const res = await api.call('GET', `/v1/wallets/${path(walletId)}`);
      const balances = Object.entries(res.body.balances as Record<string, { available: number; escrow: number }>)
        .map(([currency, b]) => `${currency} available ${b.available}, escrow ${b.escrow}`)
        .join('; ');
      return { summary: `wallet ${walletId}: ${balances || 'no balances'}`, data: res.body };
    },
  );

  // x402 gate (contract section 8): create -> quote -> authorize payment -> (provider serves) -> verify.
  tool(
    'gate_create',
    'Open an x402 payment gate between a payer and a payee agent; locks the amount in the payer escrow.',
    GateCreateInput,
    Outputs.gate,
    async ({ idempotencyKey, ...body }) => {
      const res = await api.call('POST', '/x402/gate/create', { body, idempotencyKey });
      return { summary: `gate ${String(res.body.gateId)} is ${String(res.body.status)}`, data: res.body };
    },
  );

  tool(
    'gate_quote',
    'Quote a gate for one request: x402 v2 payment requirements and a PAYMENT-REQUIRED header value.',
    {
      gateId: z.string().min(1),
      requestSha256: Sha256Hex,
      ttlSeconds: z.number().int().min(1).max(3600).optional().describe('default 300'),
      idempotencyKey: IdempotencyKey,
    },
    Outputs.quote,
    async ({ idempotencyKey, ...body }) => {
      const res = await api.call('POST', '/x402/gate/quote', { body, idempotencyKey });
      return {
        summary: `quote ${String(res.body.quoteId)} for gate ${body.gateId} expires ${String(res.body.expiresAt)}`,
        data: res.body,
      };
    },
  );

  tool(
    'gate_authorize_payment',
    'Authorize the quoted payment: policy checks, escrow reserve, and a signed payment token for the provider.',
    {
      gateId: z.string().min(1),
      quoteId: z.string().min(1),
      requestSha256: Sha256Hex,
      walletDecisionToken: z.string().optional().describe('required when the gate has a sponsor wallet'),
      escalationOverrideToken: z.string().optional().describe('from an approved escalation'),
      idempotencyKey: IdempotencyKey,
    },
    Outputs.authorization,
    async ({ idempotencyKey, ...body }) => {
      const res = await api.call('POST', '/x402/gate/authorize-payment', { body, idempotencyKey });
      return {
        summary: `payment for gate ${body.gateId} authorized (${String(res.body.authorizationRef)}), token expires ${String(res.body.expiresAt)}`,
        data: res.body,
      };
    },
  );

  tool(
    'gate_verify',
    "Submit the provider's response evidence; the service releases or refunds the payment (completed false: poll gate_get).",
    {
      gateId: z.string().min(1),
      evidence: z.strictObject({ responseSha256: Sha256Hex, providerSignature: z.string().optional() }),
      verificationStatus: z.string().optional(),
      amount: z
        .number()
        .int()
        .min(0)
        .optional()
        .describe(
          'metered: what the call cost (minor units, at most the gate amount; default all of it); the rest goes back to the payer',
        ),
      idempotencyKey: IdempotencyKey,
    },
    Outputs.gateVerification,
    async ({ idempotencyKey, ...body }) => {
      const res = await api.call('POST', '/x402/gate/verify', { body, idempotencyKey });
      const completed = res.status === 200;
      return {
        summary: `gate ${body.gateId}: ${completed ? 'decided' : 'decision pending'}`,
        data: { ...res.body, completed, httpStatus: res.status },
      };
    },
  );

  tool(
    'gate_get',
    'An x402 gate with its live quote, authorization, decision and receipt.',
    { gateId: z.string().min(1) },
    Outputs.gate,
    async ({ gateId }) => {
      const res = await api.call('GET', `/x402/gate/${path(gateId)}`);
      return { summary: `gate ${gateId} is ${String(res.body.status)}`, data: res.body };
    },
  );

  return server;
}
