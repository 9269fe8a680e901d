// What a runtime bootstrap hands out: the runtime key's scopes, the MCP launch command, the three variables and the
// configuration snippet of each agent runtime, in that runtime's own file format. Pure: no I/O.
import type { Scope } from './scopes.ts';

/** What an agent runtime needs to register agents, run them, pay through x402 and read its wallets; never ops or onboarding. */
export const RUNTIME_SCOPES: Scope[] = ['agents:write', 'runs:write', 'x402:write', 'wallets:write'];

/** The name the server goes by in every runtime's configuration. */
export const MCP_SERVER_NAME = 'agent-settlement';

/** How a runtime starts the MCP server: the package's bin (package.json), command `mcp`. */
export const MCP_LAUNCH = { command: 'npx', args: ['agent-settlement', 'mcp'] } as const;

export const MCP_ENV_NAMES = ['SERVICE_BASE_URL', 'SERVICE_TENANT_ID', 'SERVICE_API_KEY'] as const;
export type McpEnv = Record<(typeof MCP_ENV_NAMES)[number], string>;

export const RUNTIME_TARGETS = ['codex', 'claude', 'cursor', 'openclaw', 'openhands'] as const;
export type RuntimeTarget = (typeof RUNTIME_TARGETS)[number];

export interface McpLaunch {
  command: string;
  args: string[];
  env: McpEnv;
}

export function mcpLaunch(env: McpEnv): McpLaunch {
  return { command: MCP_LAUNCH.command, args: [...MCP_LAUNCH.args], env };
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
  return `{ ${Object.entries(record).map(([k, v]) => `${k} = ${tomlString(v)}`).join(', ')} }`;
}

function tomlArray(items: string[]): string {
  return `[${items.map(tomlString).join(', ')}]`;
}

export interface RuntimeSnippet {
  target: RuntimeTarget;
  format: 'toml' | 'json';
  /** Where the runtime reads it from. */
  file: string;
  content: string;
}

/** The configuration snippet of one runtime, in that runtime's documented format. */
export function runtimeSnippet(target: RuntimeTarget, launch: McpLaunch): RuntimeSnippet {
  switch (target) {
    case 'codex':
      // Codex CLI: [mcp_servers.<name>] with command, args and an env table.
      return {
        target,
        format: 'toml',
        file: '~/.codex/config.toml',
        content: [`[mcp_servers.${MCP_SERVER_NAME}]`, `command = ${tomlString(launch.command)}`, `args = ${tomlArray(launch.args)}`, `env = ${tomlInlineTable(launch.env)}`, ''].join('\n'),
      };
    case 'claude':
      return { target, format: 'json', file: 'claude_desktop_config.json (Claude Desktop) or .mcp.json (Claude Code)', content: mcpServersJson(launch) };
    case 'cursor':
      return { target, format: 'json', file: '.cursor/mcp.json (project) or ~/.cursor/mcp.json (global)', content: mcpServersJson(launch) };
    case 'openclaw':
      // OpenClaw keeps MCP server definitions under mcp.servers in its gateway configuration.
      return { target, format: 'json', file: '~/.openclaw/openclaw.json', content: `${JSON.stringify({ mcp: { servers: { [MCP_SERVER_NAME]: launch } } }, null, 2)}\n` };
    case 'openhands':
      // OpenHands reads stdio servers from the [mcp] section of config.toml (the UI's Settings > MCP writes the same).
      return {
        target,
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
