#!/usr/bin/env node
// Launcher for the TypeScript CLI: registers tsx in this process, then runs the command (no build step).
// `agent-settlement mcp` serves MCP on stdio; anything else goes to the offline verifier (`verify ...`, help).
import { register } from 'tsx/esm/api';

register();
if (process.argv[2] === 'mcp') {
  const { main } = await import('../src/mcp/main.ts');
  await main();
} else {
  const { main } = await import('../src/cli/verify.ts');
  process.exitCode = await main(process.argv.slice(2));
}
