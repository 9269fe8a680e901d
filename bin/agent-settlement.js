#!/usr/bin/env node
// Launcher for the TypeScript CLI: registers tsx in this process, then runs the command (no build step).
// `agent-settlement mcp` serves MCP on stdio, `agent-settlement verify …` is the offline verifier; no command or
// `--help` lists every command.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { register } from 'tsx/esm/api';

// This checkout's tsconfig, wherever the command runs from: its paths point the service at the client package's
// source. An image without it (the Dockerfile's) resolves the package to its compiled dist instead.
const tsconfig = fileURLToPath(new URL('../tsconfig.json', import.meta.url));
const registerTsx = () => register(existsSync(tsconfig) ? { tsconfig } : {});

const HELP = `agent-settlement: the Agent Run Settlement Service's command line

Usage: agent-settlement verify <artifact.json | statement.json> --jwks <file|url> [--json]
         check a run artifact or a payment session's statement offline, against the service's JWKS
         (agent-settlement verify --help: every check and the exit codes)
       agent-settlement mcp
         serve the service's MCP tools on stdio (an MCP client starts it); reads SERVICE_BASE_URL,
         SERVICE_TENANT_ID and SERVICE_API_KEY from the environment (agent-settlement mcp --help)
       agent-settlement help | --help | -h
         this text

The service itself runs from the checkout: npm start, or node --import tsx src/main.ts --help.`;

const MCP_HELP = `Usage: agent-settlement mcp

Serves the service's MCP tools over stdio (JSON-RPC on stdin/stdout, diagnostics on stderr); an MCP client
(codex, claude, cursor, …) starts it with the configuration runtime-bootstrap returns. Environment:
  SERVICE_BASE_URL   the service, e.g. http://127.0.0.1:3000
  SERVICE_TENANT_ID  the tenant (ten_…)
  SERVICE_API_KEY    a tenant API key (sk_…)
Exit status 2 when one is missing or malformed.`;

const [command, ...rest] = process.argv.slice(2);
const asksForHelp = (arg) => arg === '--help' || arg === '-h' || arg === 'help';

if (command === undefined || asksForHelp(command)) {
  process.stdout.write(`${HELP}\n`);
} else if (command === 'mcp') {
  if (rest.some(asksForHelp)) process.stdout.write(`${MCP_HELP}\n`);
  else {
    registerTsx();
    const { main } = await import('../src/mcp/main.ts');
    await main();
  }
} else if (command === 'verify') {
  registerTsx();
  const { main } = await import('../src/cli/verify.ts');
  process.exitCode = await main(process.argv.slice(2));
} else {
  process.stderr.write(`agent-settlement: unknown command "${command}"\n\n${HELP}\n`);
  process.exitCode = 2;
}
