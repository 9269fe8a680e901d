import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  artifactIdFor,
  buildArtifact,
  hashArtifact,
  signArtifactHash,
  type RunArtifact,
} from '../../src/domain/artifact.ts';
import { base64urlEncode, generateEd25519KeyPair, rawToJwk } from '../../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents } from '../../src/domain/event-chain.ts';
import { pricedCapture, type PriceSchedule } from '../../src/domain/pricing.ts';
import { receiptMoney, signReceipt, type SettlementReceiptBody } from '../../src/domain/receipt.ts';

// `agent-settlement verify` on the artifact of a run priced by use: it recomputes usage and amount from the signed
// events alone, and with --receipt checks that the settlement's receipt charged exactly that (capped by the escrow).
const BIN = resolve(import.meta.dirname, '../../bin/agent-settlement.js');
const RUN = 'run_CliPriced000000000000000';
const schedule: PriceSchedule = { prices: { tokens: { price: 3, per: 1000 }, rows: { price: 2, per: 1 } }, cap: 500 };
const service = generateEd25519KeyPair();
const signer = { privateKey: service.privateKey, keyId: service.keyId };

function cli(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', fail);
    child.on('close', (code) => done({ code, stdout, stderr }));
  });
}

let dir: string;
let jwksPath: string;
let artifact: RunArtifact;

/** The receipt the service signs for this artifact's settlement with `escrow` locked (see services/settlement.ts). */
function receiptFor(a: RunArtifact, escrow: number, change: Partial<SettlementReceiptBody> = {}) {
  const captured = pricedCapture(a.pricing!.amount, escrow, a.evaluation.verdict);
  const body: SettlementReceiptBody = {
    ...receiptMoney(
      { settlementId: 'stl_cli', payerWalletId: 'payer', payeeWalletId: 'worker', amount: escrow, currency: 'USD' },
      { releasedNow: captured, holdback: 0, verdict: a.evaluation.verdict, decidedAt: '2026-01-01T00:02:00.000Z' },
    ),
    runId: a.runId,
    artifactId: a.artifactId,
    artifactHash: a.artifactHash,
    pricingSha256: a.pricing!.pricingSha256,
    usage: a.pricing!.usage,
    pricedAmount: a.pricing!.amount,
    captured,
    ...change,
  };
  return signReceipt(body, signer);
}

/** The artifact with its pricing changed, then hashed and signed again with the service key (a lying service). */
function forged(a: RunArtifact, change: (p: NonNullable<RunArtifact['pricing']>) => void): RunArtifact {
  const copy = structuredClone(a);
  change(copy.pricing!);
  const hash = hashArtifact(copy);
  return {
    ...copy,
    artifactHash: hash,
    artifactId: artifactIdFor(hash),
    signature: signArtifactHash(hash, signer.privateKey, signer.keyId),
  };
}

async function file(name: string, value: unknown): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, typeof value === 'string' ? value : JSON.stringify(value, null, 2));
  return path;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'verify-priced-'));
  const agent = generateEd25519KeyPair();
  const events = signEvents(
    [
      { id: 'evt_1', runId: RUN, type: 'sample', at: '2026-01-01T00:00:01Z', payload: { tokens: 7000, rows: 3 } },
      { id: 'evt_2', runId: RUN, type: 'sample', at: '2026-01-01T00:00:02Z', payload: { tokens: 5345, rows: 4 } },
    ],
    EMPTY_HEAD,
    agent.privateKey,
    agent.keyId,
  );
  artifact = buildArtifact(
    {
      runId: RUN,
      agentId: 'acme:agent:cli',
      agentKeys: [{ keyId: agent.keyId, publicKey: base64urlEncode(agent.raw) }],
      pricing: schedule,
      events,
      finalizedAt: '2026-01-01T00:01:00.000Z',
    },
    signer,
  );
  // 12,345 tokens at 3 per 1,000 -> 38 (rounded up once), 7 rows at 2 -> 14.
  expect(artifact.pricing).toMatchObject({ usage: { rows: 7, tokens: 12_345 }, subtotal: 52, amount: 52 });
  jwksPath = await file('jwks.json', { keys: [rawToJwk(service.raw)] });
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('agent-settlement verify, priced by use', () => {
  it('recomputes the amount from the artifact alone and checks the receipt that charged it', async () => {
    const path = await file('artifact.json', artifact);
    const receipt = await file('settlement.json', { runId: RUN, receipt: receiptFor(artifact, 2_500) });
    const r = await cli('verify', path, '--jwks', jwksPath, '--receipt', receipt);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/✓ pricing\b/);
    expect(r.stdout).toMatch(/✓ receipt\b/);
    expect(r.stdout).toContain('Priced       52');
    expect(r.stdout).not.toContain('✗');

    const json = await cli('verify', path, '--jwks', jwksPath, '--receipt', receipt, '--json');
    expect(json.code).toBe(0);
    expect(JSON.parse(json.stdout)).toMatchObject({
      verified: true,
      pricedAmount: 52,
      usage: { rows: 7, tokens: 12_345 },
      checks: { pricing: true },
      receipt: { verified: true },
    });
  });

  it.each([
    ['usage', (p: NonNullable<RunArtifact['pricing']>) => void (p.usage.tokens = 1_000)],
    ['price', (p: NonNullable<RunArtifact['pricing']>) => void (p.schedule.prices.tokens!.price = 2)],
    ['cap', (p: NonNullable<RunArtifact['pricing']>) => void (p.schedule.cap = 40)],
    ['amount', (p: NonNullable<RunArtifact['pricing']>) => void (p.amount = 60)],
  ])('fails when the artifact states another %s, re-signed or not', async (what, change) => {
    const signed = await cli('verify', await file(`forged-${what}.json`, forged(artifact, change)), '--jwks', jwksPath);
    expect(signed.code).toBe(1);
    expect(signed.stdout).toMatch(/✓ serviceSignature\b/);
    expect(signed.stdout).toMatch(/✗ pricing\b/);
    expect(signed.stdout).toContain('NOT VERIFIED');

    const edited = structuredClone(artifact);
    change(edited.pricing!);
    const plain = await cli('verify', await file(`edited-${what}.json`, edited), '--jwks', jwksPath);
    expect(plain.code).toBe(1);
    expect(plain.stdout).toMatch(/✗ artifactHash\b/);
  });

  it('caps the charge by the escrow, and fails a receipt that charged anything else', async () => {
    const path = await file('artifact-cap.json', artifact);
    const capped = await file('capped.json', receiptFor(artifact, 30)); // 52 priced, 30 escrowed: 30 charged
    expect((await cli('verify', path, '--jwks', jwksPath, '--receipt', capped)).code).toBe(0);

    // Signed by the service key, but charging more than the usage costs: the binding check catches it.
    const over = await file('over.json', receiptFor(artifact, 2_500, { captured: 60, releasedNow: 60 }));
    const r = await cli('verify', path, '--jwks', jwksPath, '--receipt', over);
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/✗ receipt\b.*captured 60/);

    // Other usage in the receipt than in the artifact.
    const usage = await file('usage.json', receiptFor(artifact, 2_500, { usage: { rows: 7, tokens: 99 } }));
    expect((await cli('verify', path, '--jwks', jwksPath, '--receipt', usage)).code).toBe(1);

    // A receipt edited after signing fails its own hash.
    const edited = receiptFor(artifact, 2_500);
    (edited.body as SettlementReceiptBody).captured = 51;
    const e = await cli('verify', path, '--jwks', jwksPath, '--receipt', await file('edited-receipt.json', edited));
    expect(e.code).toBe(1);
    expect(e.stdout).toContain('receiptHash');
  });
});
