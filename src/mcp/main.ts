// `agent-settlement mcp`: the MCP server on stdio. stdout carries the protocol only; diagnostics go to stderr and
// never name a secret.
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { mcpConfigFrom, McpConfigError } from './config.ts';
import { buildMcpServer } from './server.ts';

const EXIT_CONFIG = 2;

const logToStderr = (line: string) => {
  process.stderr.write(`${line}\n`);
};

/** Serves until the client closes stdin. A bad configuration stops the process before it speaks the protocol. */
export async function main(env: Record<string, string | undefined> = process.env): Promise<void> {
  let config;
  try {
    config = mcpConfigFrom(env);
  } catch (err) {
    if (!(err instanceof McpConfigError)) throw err;
    logToStderr(`agent-settlement mcp: ${err.message}`);
    process.exitCode = EXIT_CONFIG;
    return;
  }
  const server = buildMcpServer(config, logToStderr);
  await server.connect(new StdioServerTransport());
}
