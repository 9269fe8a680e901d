// Offline verifier: `agent-settlement verify <artifact.json | statement.json> --jwks <file|url> [--receipt <file>] [--json]`.
// Exit codes: 0 all checks hold, 1 a check failed, 2 usage or I/O error.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
// The checks are the client package's: the verifier a user installs runs exactly this code.
import { ARTIFACT_CHECKS, verifyArtifact } from 'agent-settlement-client/artifact';
import type { ArtifactCheck, ArtifactVerification } from 'agent-settlement-client/artifact';
import { verifyReceipt, type ReceiptVerification } from 'agent-settlement-client/receipt';
import {
  STATEMENT_CHECKS,
  verifyStatement,
  type StatementCheck,
  type StatementVerification,
} from 'agent-settlement-client/statement';

export const EXIT_OK = 0;
export const EXIT_FAILED = 1;
export const EXIT_USAGE = 2;

const USAGE = `Usage: agent-settlement verify <artifact.json | statement.json> --jwks <file|url> [--receipt <file>] [--json]

Repeats every check of a RunArtifact.v1 offline: artifact hash, service signature (against the JWKS),
every event's hashes and agent signature, and the hash chain; for a run priced by use, the usage and
amount recomputed from the events alone. With --receipt (the run's settlement, or its receipt), the
receipt's hash and signature and that it binds this artifact, its usage, schedule and charge. Given a
payment session's statement (what
GET /x402/sessions/{id}/statement answers): its hash, the service signature, the charges it commits to,
and its totals.

  --jwks <file|url>  the service's JWKS (e.g. https://host/.well-known/jwks.json or a saved copy)
  --receipt <file>   a settlement receipt of the artifact's run (GET /runs/{runId}/settlement, saved)
  --json             print the machine-readable result
Exit status: 0 verified, 1 a check failed, 2 usage or I/O error.`;

const FETCH_TIMEOUT_MS = 10_000;

export interface CliIo {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
}

const processIo: CliIo = {
  stdout: (t) => process.stdout.write(`${t}\n`),
  stderr: (t) => process.stderr.write(`${t}\n`),
};

/** A usage or I/O problem (exit 2), as opposed to a failed check (exit 1). */
class CliError extends Error {}

interface VerifyArgs {
  artifactPath: string;
  jwks: string;
  receiptPath: string | null;
  json: boolean;
}

function parseArgs(argv: readonly string[]): VerifyArgs | 'help' {
  const [command, ...rest] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') return 'help';
  if (command !== 'verify') throw new CliError(`unknown command "${command}"`);
  let artifactPath: string | undefined;
  let jwks: string | undefined;
  let receiptPath: string | null = null;
  let json = false;
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i] as string;
    if (arg === '--help' || arg === '-h') return 'help';
    if (arg === '--json') json = true;
    else if (arg === '--jwks') {
      jwks = rest[++i];
      if (jwks === undefined) throw new CliError('--jwks needs a file or URL');
    } else if (arg.startsWith('--jwks=')) jwks = arg.slice('--jwks='.length);
    else if (arg === '--receipt') {
      receiptPath = rest[++i] ?? null;
      if (receiptPath === null) throw new CliError('--receipt needs a file');
    } else if (arg.startsWith('--receipt=')) receiptPath = arg.slice('--receipt='.length);
    else if (arg.startsWith('-') && arg !== '-') throw new CliError(`unknown option "${arg}"`);
    else if (artifactPath === undefined) artifactPath = arg;
    else throw new CliError(`unexpected argument "${arg}"`);
  }
  if (artifactPath === undefined) throw new CliError('missing <artifact.json>');
  if (!jwks) throw new CliError('missing --jwks <file|url>');
  return { artifactPath, jwks, receiptPath, json };
}

function parseJson(text: string, what: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new CliError(`${what} is not valid JSON: ${(err as Error).message}`);
  }
}

async function readJsonFile(path: string, what: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new CliError(`cannot read ${what} ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  return parseJson(text, `${what} ${path}`);
}

async function loadJwks(source: string): Promise<unknown> {
  if (!/^https?:\/\//i.test(source)) return readJsonFile(source, 'JWKS');
  let res: Response;
  try {
    res = await fetch(source, {
      headers: { accept: 'application/json' },
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
  } catch (err) {
    throw new CliError(`cannot fetch JWKS ${source}: ${(err as Error).message}`);
  }
  if (!res.ok) throw new CliError(`cannot fetch JWKS ${source}: HTTP ${res.status}`);
  return parseJson(await res.text(), `JWKS from ${source}`);
}

/** Artifact strings end up on a terminal: show control characters escaped, never raw. */
function safe(value: unknown): string {
  const s = typeof value === 'string' ? value : (JSON.stringify(value) ?? String(value));
  return s.replace(
    /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}

const PASSED: Record<ArtifactCheck, string> = {
  artifactHash: 'recomputed hash matches artifactHash and artifactId',
  serviceSignature: 'service signature verifies with the JWKS key',
  eventSignatures: 'every event hash and agent signature verifies',
  chain: 'events are linked in order from seq 1; count and head match',
};
const PRICING_PASSED = 'usage and amount recomputed from the events match the schedule';
const RECEIPT_PASSED = 'receipt hash and signature verify; it binds this artifact, its usage and charge';

function summary(artifact: unknown) {
  const a = (typeof artifact === 'object' && artifact !== null ? artifact : {}) as Record<string, unknown>;
  const evaluation = a.evaluation as { verdict?: unknown } | undefined;
  const signature = a.signature as { keyId?: unknown } | undefined;
  const events = a.events as { count?: unknown } | undefined;
  const pricing = a.pricing as { usage?: unknown; amount?: unknown; pricingSha256?: unknown } | undefined;
  return {
    artifactId: a.artifactId ?? null,
    artifactHash: a.artifactHash ?? null,
    runId: a.runId ?? null,
    agentId: a.agentId ?? null,
    verdict: evaluation?.verdict ?? null,
    finalizedAt: a.finalizedAt ?? null,
    keyId: signature?.keyId ?? null,
    eventCount: events?.count ?? null,
    ...(pricing !== undefined
      ? {
          usage: pricing?.usage ?? null,
          pricedAmount: pricing?.amount ?? null,
          pricingSha256: pricing?.pricingSha256 ?? null,
        }
      : {}),
  };
}

const STATEMENT_PASSED: Record<StatementCheck, string> = {
  statementHash: 'recomputed hash matches statementHash',
  serviceSignature: 'service signature verifies with the JWKS key',
  charges: 'the listed charges are the ones the statement commits to',
  usage: "every usage line's amount is its usage's price, its signatures verify with the listed agent keys",
  totals: "total, refund and every payee's share add up",
};

function isStatement(doc: unknown): boolean {
  const body = typeof doc === 'object' && doc !== null ? (doc as { body?: { schema?: unknown } }).body : undefined;
  return body?.schema === 'SessionStatement.v1';
}

function reportStatement(doc: unknown, result: StatementVerification, io: CliIo): void {
  const body = ((doc as { body?: Record<string, unknown> }).body ?? {}) as Record<string, unknown>;
  const lines = [
    `Session      ${safe(body.sessionId)}  (payer ${safe(body.payerAgentId)}, ${safe(body.reason)} at ${safe(body.closedAt)})`,
    `Money        charged ${safe(body.totalCharged)} of ${safe(body.budget)} ${safe(body.currency)} in ${safe(body.chargeCount)} charges, refunded ${safe(body.refunded)}`,
    '',
  ];
  const width = Math.max(...STATEMENT_CHECKS.map((c) => c.length));
  for (const check of STATEMENT_CHECKS) {
    const [first, ...more] = result.reasons[check];
    lines.push(`${result.checks[check] ? '✓' : '✗'} ${check.padEnd(width)}  ${safe(first ?? STATEMENT_PASSED[check])}`);
    for (const reason of more) lines.push(`  ${' '.repeat(width)}  ${safe(reason)}`);
  }
  lines.push('', result.verified ? 'VERIFIED: all checks hold' : 'NOT VERIFIED');
  io.stdout(lines.join('\n'));
}

function report(artifact: unknown, result: ArtifactVerification, receipt: ReceiptVerification | null, io: CliIo): void {
  const s = summary(artifact);
  const lines = [
    `Artifact     ${safe(s.artifactId)}`,
    `Run          ${safe(s.runId)}  (agent ${safe(s.agentId)})`,
    `Verdict      ${safe(s.verdict)}  (finalized ${safe(s.finalizedAt)}, ${safe(s.eventCount)} events)`,
    ...('pricedAmount' in s ? [`Priced       ${safe(s.pricedAmount)} for usage ${safe(s.usage)}`] : []),
    `Signed by    ${safe(s.keyId)}`,
    '',
  ];
  const rows: Array<[string, boolean, string[], string]> = ARTIFACT_CHECKS.map((c) => [
    c,
    result.checks[c],
    result.reasons[c],
    PASSED[c],
  ]);
  if (result.checks.pricing !== undefined)
    rows.push(['pricing', result.checks.pricing, result.reasons.pricing ?? [], PRICING_PASSED]);
  if (receipt) rows.push(['receipt', receipt.verified, receipt.failures, RECEIPT_PASSED]);
  const width = Math.max(...rows.map(([c]) => c.length));
  for (const [check, holds, reasons, passed] of rows) {
    const [first, ...more] = reasons;
    lines.push(`${holds ? '✓' : '✗'} ${check.padEnd(width)}  ${safe(first ?? passed)}`);
    for (const reason of more) lines.push(`  ${' '.repeat(width)}  ${safe(reason)}`);
  }
  const verified = result.verified && (receipt?.verified ?? true);
  lines.push('', verified ? 'VERIFIED: all checks hold' : 'NOT VERIFIED');
  io.stdout(lines.join('\n'));
}

/** A saved GET /runs/{runId}/settlement answer carries the receipt under `receipt`; a bare receipt is taken as is. */
function receiptIn(doc: unknown): unknown {
  const d = typeof doc === 'object' && doc !== null ? (doc as Record<string, unknown>) : null;
  return d && !('body' in d) && 'receipt' in d ? d.receipt : doc;
}

/** Runs the CLI with the arguments after the program name; resolves to the exit code. */
export async function main(argv: readonly string[], io: CliIo = processIo): Promise<number> {
  let args: VerifyArgs | 'help';
  try {
    args = parseArgs(argv);
    if (args === 'help') {
      io.stdout(USAGE);
      return EXIT_OK;
    }
    const [artifact, jwks, receiptDoc] = await Promise.all([
      readJsonFile(args.artifactPath, 'artifact'),
      loadJwks(args.jwks),
      args.receiptPath === null ? null : readJsonFile(args.receiptPath, 'receipt'),
    ]);
    if (isStatement(artifact)) {
      const checked = verifyStatement(artifact, jwks);
      if (args.json) io.stdout(JSON.stringify(checked, null, 2));
      else reportStatement(artifact, checked, io);
      return checked.verified ? EXIT_OK : EXIT_FAILED;
    }
    const result = verifyArtifact(artifact, jwks);
    const a = (typeof artifact === 'object' && artifact !== null ? artifact : {}) as Record<string, unknown>;
    const receipt = receiptDoc === null ? null : verifyReceipt(receiptIn(receiptDoc), jwks, { artifact: a });
    if (args.json) {
      const verified = result.verified && (receipt?.verified ?? true);
      io.stdout(
        JSON.stringify({ ...summary(artifact), ...result, verified, ...(receipt ? { receipt } : {}) }, null, 2),
      );
    } else {
      report(artifact, result, receipt, io);
    }
    return result.verified && (receipt?.verified ?? true) ? EXIT_OK : EXIT_FAILED;
  } catch (err) {
    if (err instanceof CliError) {
      io.stderr(`agent-settlement: ${err.message}\n\n${USAGE}`);
      return EXIT_USAGE;
    }
    io.stderr(`agent-settlement: unexpected error: ${(err as Error).message}`);
    return EXIT_USAGE;
  }
}

// Also runnable directly: `tsx src/cli/verify.ts verify <artifact.json> --jwks <file|url>`.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  process.exitCode = await main(process.argv.slice(2));
}
