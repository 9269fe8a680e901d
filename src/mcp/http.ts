// The service's own MCP endpoint (/mcp, Streamable HTTP, stateless): each POST gets a fresh server with the same
// tools as `agent-settlement mcp`, acting with the caller's API key. Stateless, because any API process behind the
// one URL may take any request: nothing of a session lives in a process. The tools reach the API through the fetch
// the route hands in (in process), so every tool call passes the same authentication, scope, tenant, rate-limit and
// idempotency checks as the HTTP route it calls.
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js';
import { parsePrivateKey, privateKeyToPem, publicKeyOf } from '../domain/crypto.ts';
import type { Runtime } from '../runtime.ts';
import { keepMcpAgentKey, mcpAgentKey } from '../services/mcp-agent-keys.ts';
import type { FetchLike } from './api-client.ts';
import { KeyFileError, type AgentKeyStore } from './key-file.ts';
import { buildMcpServer } from './server.ts';

export interface McpCaller {
  tenantId: string;
  /** The bearer the caller presented; the tools send it on, so they can do exactly what the key may. */
  apiKey: string;
}

const SERVICE_KEY_STORE = 'sealed in the service (/mcp)';

/**
 * Agents registered through /mcp keep their signing key in the service (see services/mcp-agent-keys.ts). A path
 * argument would name a file on the service's machine, so it is refused.
 */
function serviceKeyStore(runtime: Runtime, tenantId: string): (requested: string | undefined) => AgentKeyStore {
  const store: AgentKeyStore = {
    location: SERVICE_KEY_STORE,
    async ensureUsable() {},
    async save(agentId, privateKey, keyId) {
      if (!(await keepMcpAgentKey(runtime, tenantId, agentId, keyId, privateKeyToPem(privateKey)))) {
        throw new KeyFileError('KEY_FILE_UNAVAILABLE', `agent ${agentId} already has a key in the service`);
      }
    },
    async load(agentId) {
      const kept = await mcpAgentKey(runtime, tenantId, agentId);
      if (!kept)
        throw new KeyFileError(
          'AGENT_KEY_NOT_FOUND',
          `no private key for agent ${agentId} in the service; register the agent with register_agent through /mcp first`,
        );
      const privateKey = parsePrivateKey(kept.privateKeyPem);
      if (publicKeyOf(privateKey).keyId !== kept.keyId)
        throw new KeyFileError(
          'KEY_FILE_INVALID',
          `the kept key of agent ${agentId} does not match its keyId ${kept.keyId}`,
        );
      return { keyId: kept.keyId, privateKey };
    },
  };
  return (requested) => {
    if (requested !== undefined) {
      throw new KeyFileError(
        'KEY_FILE_NOT_SUPPORTED',
        "keyFile is for the stdio server (agent-settlement mcp); through /mcp the service keeps agents' keys itself",
      );
    }
    return store;
  };
}

/** Answers one MCP POST (a JSON-RPC message or batch) with a JSON response, then drops the server. */
export async function answerMcpRequest(
  runtime: Runtime,
  caller: McpCaller,
  request: Request,
  parsedBody: unknown,
  apiFetch: FetchLike,
): Promise<Response> {
  const server = buildMcpServer(
    { baseUrl: runtime.config.publicBaseUrl, tenantId: caller.tenantId, apiKey: caller.apiKey },
    (line) => runtime.logger.warn({ tenantId: caller.tenantId }, line),
    { fetch: apiFetch, agentKeys: serviceKeyStore(runtime, caller.tenantId) },
  );
  const transport = new WebStandardStreamableHTTPServerTransport({
    sessionIdGenerator: undefined,
    enableJsonResponse: true,
  });
  try {
    await server.connect(transport);
    return await transport.handleRequest(request, { parsedBody });
  } finally {
    await server.close().catch(() => undefined);
  }
}
