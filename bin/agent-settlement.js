#!/usr/bin/env node
// Launcher for the TypeScript CLI: registers tsx in this process, then runs src/cli/verify.ts (no build step).
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../src/cli/verify.ts');
process.exitCode = await main(process.argv.slice(2));
