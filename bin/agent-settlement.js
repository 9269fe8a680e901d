#!/usr/bin/env node
// Launcher for the TypeScript CLI: registers tsx in this process, then runs the command (no build step).
// `agent-settlement mcp` serves MCP on stdio; anything else goes to the offline verifier (`verify ...`, help).
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { register } from 'tsx/esm/api';

// This checkout's tsconfig, wherever the command runs from: its paths point the service at the client package's
// source. An image without it (the Dockerfile's) resolves the package to its compiled dist instead.
const tsconfig = fileURLToPath(new URL('../tsconfig.json', import.meta.url));
register(existsSync(tsconfig) ? { tsconfig } : {});
if (process.argv[2] === 'mcp') {
  const { main } = await import('../src/mcp/main.ts');
  await main();
} else {
  const { main } = await import('../src/cli/verify.ts');
  process.exitCode = await main(process.argv.slice(2));
}
