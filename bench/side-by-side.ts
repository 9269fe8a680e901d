// What the benches that run two service targets side by side share (bench/x402.ts, bench/money-side-by-side.ts): calls
// that tell a refusal under load from a wrong answer, waiting for every process to go idle before a chunk, and
// nearest-rank percentiles, agents with keys of their own, and writing the results.
import type { KeyObject } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { generateEd25519KeyPair } from '../src/domain/crypto.ts';
import type { HttpClient } from './growth/http-client.ts';
import { CLOCK_TICKS_PER_SECOND, cpuTicks } from './growth/processes.ts';

/** The service refused the call (503 from the request deadline, 429): counted by status, not timed. */
export class Refused extends Error {}

/** The service answered something other than what the call expects: stops the benchmark. */
export class Rejected extends Error {}

/** A caller of one service: its HTTP client and the credential it presents. */
export interface Caller {
  http: HttpClient;
  token: string;
}

/** One call; its JSON answer if its status is one of `expect`. `headers` are sent as given (say an Idempotency-Key). */
export const call = async (
  { http, token }: Caller,
  method: string,
  path: string,
  body?: unknown,
  expect = [200, 201],
  headers?: Record<string, string>,
) => {
  const res = await http.request(method, path, { token, body, ...(headers ? { headers } : {}) });
  // 409 IDEMPOTENCY_IN_PROGRESS: the same key's first attempt is still running (a retry after a 503); retry later too.
  const inProgress = res.status === 409 && res.text.includes('"IDEMPOTENCY_IN_PROGRESS"');
  if (res.status === 503 || res.status === 429 || inProgress)
    throw new Refused(inProgress ? '409' : String(res.status));
  if (!expect.includes(res.status)) throw new Rejected(`${method} ${path} -> ${res.status} ${res.text.slice(0, 300)}`);
  return JSON.parse(res.text);
};

/**
 * Waits until the service's processes are idle (under 5% of a core each over half a second; at most `limitMs`), so
 * that what a measurement times is not the tail of the previous one (the worker fans out webhook events after verify).
 * Returns the milliseconds waited (`limitMs` or more: they never all went idle).
 */
export async function quiesce(pids: number[], limitMs = 30_000): Promise<number> {
  const started = Date.now();
  while (Date.now() - started < limitMs) {
    const before = pids.map(cpuTicks);
    await new Promise((r) => setTimeout(r, 500));
    const busiest = Math.max(...pids.map((pid, i) => cpuTicks(pid) - before[i]!));
    if (busiest / CLOCK_TICKS_PER_SECOND / 0.5 < 0.05) break;
  }
  return Date.now() - started;
}

/** Nearest-rank p50, p95 and p99 of some latencies (ms, two decimals). */
export function percentiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (p: number) =>
    Number(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!.toFixed(2));
  return { n: sorted.length, p50: at(50), p95: at(95), p99: at(99) };
}

/** An agent registered with a key pair of its own; the private key signs its run events. */
export async function registerAgent(
  caller: Caller,
  name: string,
): Promise<{ agentId: string; keyId: string; privateKey: KeyObject }> {
  const pair = generateEd25519KeyPair();
  const agent = await call(caller, 'POST', '/v1/agents', {
    name,
    publicKey: Buffer.from(pair.raw).toString('base64url'),
  });
  return { agentId: agent.agentId as string, keyId: agent.keyId as string, privateKey: pair.privateKey };
}

/** A positive number given on the command line as `--name N` (`fallback` when absent); anything else stops the bench. */
export function positiveArg(name: string, fallback: number, options: { integer?: boolean } = {}): number {
  const i = process.argv.indexOf(name);
  const value = i >= 0 ? Number(process.argv[i + 1]) : fallback;
  if (!Number.isFinite(value) || value <= 0 || (options.integer && !Number.isInteger(value)))
    throw new Error(`${name} must be a positive ${options.integer ? 'integer' : 'number'}`);
  return value;
}

/** Writes a bench's JSON results to `file` and prints them on stdout (the log line goes to stderr). */
export function writeResults(file: string, out: unknown, log: (line: string) => void): void {
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  console.log(JSON.stringify(out, null, 2));
  log(`written to ${file}`);
}
