// What a runtime bootstrap hands out: the runtime key's scopes, the MCP launch command, the three variables and the
// configuration snippet of each agent runtime, in that runtime's own file format. Pure: no I/O.
import type { Scope } from './scopes.ts';

/** What an agent runtime needs to register agents, run them, pay through x402 and read its wallets; never ops or onboarding. */
export const RUNTIME_SCOPES: Scope[] = ['agents:write', 'runs:write', 'x402:write', 'wallets:write'];

/** The name the server goes by in every runtime's configuration. */
export const MCP_SERVER_NAME = 'agent-settlement';

/** The path of the service's own MCP endpoint (Streamable HTTP), under its base URL. */
export const MCP_HTTP_PATH = '/mcp';

export const MCP_ENV_NAMES = ['SERVICE_BASE_URL', 'SERVICE_TENANT_ID', 'SERVICE_API_KEY'] as const;
export type McpEnv = Record<(typeof MCP_ENV_NAMES)[number], string>;

export const RUNTIME_TARGETS = ['codex', 'claude', 'cursor', 'openclaw', 'openhands'] as const;
export type RuntimeTarget = (typeof RUNTIME_TARGETS)[number];

export interface McpLaunch {
  command: string;
  args: string[];
  env: McpEnv;
}

/**
 * How a runtime starts the stdio server: this very Node binary running this package's launcher by absolute path, so
 * the command works from any directory of the machine the package is installed on, and never asks a registry for
 * a package name (`npx agent-settlement` would fetch whatever is published under that name).
 */
export function mcpLaunch(env: McpEnv, where: { nodePath: string; launcherPath: string }): McpLaunch {
  return { command: where.nodePath, args: [where.launcherPath, 'mcp'], env };
}

/** The service's MCP endpoint for clients that take a URL: Streamable HTTP, the runtime key as bearer. */
export interface McpHttpConfig {
  type: 'http';
  url: string;
  headers: { Authorization: string };
}

export function mcpHttpConfig(baseUrl: string, apiKey: string): McpHttpConfig {
  return {
    type: 'http',
    url: `${baseUrl.replace(/\/$/, '')}${MCP_HTTP_PATH}`,
    headers: { Authorization: `Bearer ${apiKey}` },
  };
}

/** The `{"mcpServers": {...}}` document Claude Desktop, Claude Code (.mcp.json) and Cursor (.cursor/mcp.json) read. */
export function mcpServersJson(launch: McpLaunch): string {
  return `${JSON.stringify({ mcpServers: { [MCP_SERVER_NAME]: launch } }, null, 2)}\n`;
}

/**
 * A TOML basic string. JSON's escapes (\" \\ \n \t \uXXXX) are all valid TOML escapes; the values here (URLs, ids,
 * tokens) are printable ASCII, where the two agree exactly.
 */
function tomlString(value: string): string {
  return JSON.stringify(value);
}

function tomlInlineTable(record: Record<string, string>): string {
  return `{ ${Object.entries(record)
    .map(([k, v]) => `${k} = ${tomlString(v)}`)
    .join(', ')} }`;
}

function tomlArray(items: string[]): string {
  return `[${items.map(tomlString).join(', ')}]`;
}

/**
 * Which configuration each runtime gets: the URL where its configuration file takes a Streamable HTTP server with a
 * header (Codex: `url` + `http_headers`; Cursor: `url` + `headers`), else the stdio command (Claude Desktop reads
 * stdio servers only from its file, and the claude snippet serves Claude Code too; OpenClaw and OpenHands' config.toml
 * are given stdio, their documented form).
 */
export const RUNTIME_TRANSPORT: Record<RuntimeTarget, 'stdio' | 'http'> = {
  codex: 'http',
  claude: 'stdio',
  cursor: 'http',
  openclaw: 'stdio',
  openhands: 'stdio',
};

export interface RuntimeSnippet {
  target: RuntimeTarget;
  transport: 'stdio' | 'http';
  format: 'toml' | 'json';
  /** Where the runtime reads it from. */
  file: string;
  content: string;
}

/** The configuration snippet of one runtime, in that runtime's documented format (see RUNTIME_TRANSPORT). */
export function runtimeSnippet(target: RuntimeTarget, launch: McpLaunch, http: McpHttpConfig): RuntimeSnippet {
  const transport = RUNTIME_TRANSPORT[target];
  switch (target) {
    case 'codex':
      // Codex CLI: [mcp_servers.<name>] with url and http_headers (a Streamable HTTP server).
      return {
        target,
        transport,
        format: 'toml',
        file: '~/.codex/config.toml',
        content: [
          `[mcp_servers.${MCP_SERVER_NAME}]`,
          `url = ${tomlString(http.url)}`,
          `http_headers = ${tomlInlineTable(http.headers)}`,
          '',
        ].join('\n'),
      };
    case 'claude':
      return {
        target,
        transport,
        format: 'json',
        file: 'claude_desktop_config.json (Claude Desktop) or .mcp.json (Claude Code)',
        content: mcpServersJson(launch),
      };
    case 'cursor':
      // Cursor's mcp.json: a server with a url (and headers) is a remote one.
      return {
        target,
        transport,
        format: 'json',
        file: '.cursor/mcp.json (project) or ~/.cursor/mcp.json (global)',
        content: `${JSON.stringify({ mcpServers: { [MCP_SERVER_NAME]: { url: http.url, headers: http.headers } } }, null, 2)}\n`,
      };
    case 'openclaw':
      // OpenClaw keeps MCP server definitions under mcp.servers in its gateway configuration.
      return {
        target,
        transport,
        format: 'json',
        file: '~/.openclaw/openclaw.json',
        content: `${JSON.stringify({ mcp: { servers: { [MCP_SERVER_NAME]: launch } } }, null, 2)}\n`,
      };
    case 'openhands':
      // OpenHands reads stdio servers from the [mcp] section of config.toml (the UI's Settings > MCP writes the same).
      return {
        target,
        transport,
        format: 'toml',
        file: 'config.toml',
        content: [
          '[mcp]',
          `stdio_servers = [{ name = ${tomlString(MCP_SERVER_NAME)}, command = ${tomlString(launch.command)}, args = ${tomlArray(launch.args)}, env = ${tomlInlineTable(launch.env)} }]`,
          '',
        ].join('\n'),
      };
  }
}
