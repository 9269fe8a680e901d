// The MCP server's whole configuration: exactly the three variables of the runtime bootstrap's `mcp.env`
// (contract section 10). It is a client of the HTTP API, so none of the service's own settings apply.

export interface McpConfig {
  /** Base URL of the service, e.g. https://settlement.example.com (a path prefix is kept). */
  baseUrl: string;
  tenantId: string;
  /** Tenant API key `sk_<keyId>.<secret>`; sent only as the Authorization header, never shown. */
  apiKey: string;
}

export class McpConfigError extends Error {
  constructor(variable: string, problem: string) {
    super(`configuration: ${variable} ${problem}`);
    this.name = 'McpConfigError';
  }
}

// The tenant id names the default key file, so it must be a plain file name.
const TENANT_ID = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;
const API_KEY = /^sk_[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;

function required(env: Record<string, string | undefined>, name: string): string {
  const value = env[name]?.trim();
  if (!value) throw new McpConfigError(name, 'is required');
  return value;
}

export function mcpConfigFrom(env: Record<string, string | undefined>): McpConfig {
  const baseUrl = required(env, 'SERVICE_BASE_URL');
  let parsed: URL;
  try {
    parsed = new URL(baseUrl);
  } catch {
    throw new McpConfigError('SERVICE_BASE_URL', 'is not a valid URL');
  }
  if (parsed.protocol !== 'https:' && parsed.protocol !== 'http:') {
    throw new McpConfigError('SERVICE_BASE_URL', `must use http or https, got ${parsed.protocol}`);
  }
  const tenantId = required(env, 'SERVICE_TENANT_ID');
  if (!TENANT_ID.test(tenantId))
    throw new McpConfigError('SERVICE_TENANT_ID', 'must be 1-128 characters of [A-Za-z0-9._-]');
  const apiKey = required(env, 'SERVICE_API_KEY');
  // The value itself never appears in the message: it is a credential.
  if (!API_KEY.test(apiKey))
    throw new McpConfigError('SERVICE_API_KEY', 'must be a tenant API key of the form sk_<keyId>.<secret>');
  return { baseUrl, tenantId, apiKey };
}
