// Drives an MCP server the way an agent runtime does: spawns it on stdio (or connects to its URL over Streamable
// HTTP), then `initialize`, `tools/list` and one real tool call, within a time limit. A spawned process never
// outlives the probe: it is killed on timeout and always stopped (and, if need be, killed) before the probe returns.
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { SmokeTestOutcome } from '../store/onboarding.ts';

export type SmokeStep = 'spawn' | 'initialize' | 'tools/list' | 'tools/call' | 'timeout';

/** A stdio server to spawn, or a Streamable HTTP server to connect to. */
export type ProbeServer =
  | {
      command: string;
      args: string[];
      /** The server's variables; the child gets these plus the SDK's safe defaults (PATH, HOME…), nothing else of ours. */
      env: Record<string, string>;
    }
  | { url: string; headers: Record<string, string> };

export interface ProbeInput {
  server: ProbeServer;
  timeoutMs: number;
  /** The tool to call; it must succeed. */
  tool: string;
  /** Values that must never appear in what the probe reports (the API key). */
  secrets: string[];
}

class StepFailure extends Error {
  constructor(
    readonly step: SmokeStep,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

const STDERR_TAIL = 2_000;

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export async function probeMcpServer(input: ProbeInput): Promise<{ outcome: SmokeTestOutcome; pid: number | null }> {
  const started = Date.now();
  const redact = (text: string) => input.secrets.reduce((t, s) => (s ? t.split(s).join('[redacted]') : t), text);
  let stderr = '';
  // Loaded on first use: only a smoke test needs the MCP client, and the SDK with its schemas is about 6 MB of heap
  // that the API process (which imports this module through the onboarding routes) would otherwise carry for ever.
  const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
  const server = input.server;
  let transport: import('@modelcontextprotocol/sdk/shared/transport.js').Transport;
  let stdio: import('@modelcontextprotocol/sdk/client/stdio.js').StdioClientTransport | null = null;
  if ('url' in server) {
    const { StreamableHTTPClientTransport } = await import('@modelcontextprotocol/sdk/client/streamableHttp.js');
    transport = new StreamableHTTPClientTransport(new URL(server.url), { requestInit: { headers: server.headers } });
  } else {
    const { StdioClientTransport } = await import('@modelcontextprotocol/sdk/client/stdio.js');
    stdio = new StdioClientTransport({ command: server.command, args: server.args, env: server.env, stderr: 'pipe' });
    stdio.stderr?.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-STDERR_TAIL);
    });
    transport = stdio;
  }
  const client = new Client({ name: 'agent-settlement-smoke-test', version: '1.0.0' });
  let exited = false;
  client.onclose = () => {
    exited = true;
  };

  let step: SmokeStep = 'initialize';
  const seen: Pick<SmokeTestOutcome, 'serverInfo' | 'toolNames' | 'call'> = {
    serverInfo: null,
    toolNames: [],
    call: null,
  };
  const session = async () => {
    try {
      await client.connect(transport);
    } catch (err) {
      // The process could not start, or ended before it answered: that is the spawn failing, not the handshake.
      if (stdio && (exited || (err as NodeJS.ErrnoException).code === 'ENOENT'))
        throw new StepFailure('spawn', 'the MCP server did not start or exited at once', {
          error: (err as Error).message,
        });
      throw new StepFailure('initialize', 'the MCP handshake failed', { error: (err as Error).message });
    }
    const info = client.getServerVersion();
    seen.serverInfo = info ? { name: info.name, version: info.version } : null;
    step = 'tools/list';
    const { tools } = await client.listTools();
    seen.toolNames = tools.map((t) => t.name);
    if (!seen.toolNames.includes(input.tool))
      throw new StepFailure('tools/list', `the server does not offer the tool ${input.tool}`);
    step = 'tools/call';
    const result = (await client.callTool({ name: input.tool, arguments: {} })) as CallToolResult;
    seen.call = { tool: input.tool, isError: result.isError === true, result: result.structuredContent ?? null };
    if (result.isError) {
      const error = (result.structuredContent as { error?: Record<string, unknown> } | undefined)?.error ?? {};
      throw new StepFailure('tools/call', `the tool ${input.tool} failed`, { error });
    }
  };

  let timer: NodeJS.Timeout | undefined;
  let failure: StepFailure | null = null;
  try {
    await Promise.race([
      session(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new StepFailure('timeout', `no complete answer within ${input.timeoutMs} ms`, { during: step })),
          input.timeoutMs,
        );
      }),
    ]);
  } catch (err) {
    failure =
      err instanceof StepFailure
        ? err
        : new StepFailure(step, `the ${step} request failed`, { error: (err as Error).message });
  } finally {
    clearTimeout(timer);
  }
  const pid = stdio?.pid ?? null;
  if (failure?.step === 'timeout' && pid !== null && isAlive(pid)) process.kill(pid, 'SIGKILL');
  await client.close().catch(() => undefined); // closes stdin, then SIGTERM, then SIGKILL, waiting for the exit
  if (pid !== null && isAlive(pid)) process.kill(pid, 'SIGKILL');

  const details = failure
    ? JSON.parse(redact(JSON.stringify({ ...failure.details, ...(stderr ? { stderr } : {}) })))
    : {};
  return {
    pid,
    outcome: {
      passed: failure === null,
      failedStep: failure?.step ?? null,
      ...seen,
      error: failure ? { message: redact(failure.message), details } : null,
      durationMs: Date.now() - started,
    },
  };
}
