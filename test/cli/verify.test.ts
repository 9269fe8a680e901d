import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildArtifact } from '../../src/domain/artifact.ts';
import { base64urlEncode, generateEd25519KeyPair, rawToJwk } from '../../src/domain/crypto.ts';
import { EMPTY_HEAD, signEvents } from '../../src/domain/event-chain.ts';

const BIN = resolve(import.meta.dirname, '../../bin/agent-settlement.js');
const RUN = 'run_CliTest00000000000000000';

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the real launcher as a child process (async, so the in-test JWKS server can answer). */
function cli(...args: string[]): Promise<CliResult> {
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

/** Changes exactly one byte: the first `from` char after the anchors (found one after another) becomes `to`. */
function oneByteChange(text: string, anchors: string[], from: string, to: string): string {
  expect(from).toHaveLength(1);
  expect(to).toHaveLength(1);
  let at = 0;
  for (const anchor of anchors) {
    const found = text.indexOf(anchor, at);
    expect(found, `anchor ${anchor}`).toBeGreaterThanOrEqual(0);
    at = found + anchor.length;
  }
  const i = text.indexOf(from, at);
  expect(i).toBeGreaterThanOrEqual(at);
  const out = text.slice(0, i) + to + text.slice(i + 1);
  expect(Buffer.byteLength(out)).toBe(Buffer.byteLength(text));
  return out;
}

let dir: string;
let artifactText: string;
let artifactPath: string;
let jwksPath: string;
let jwksText: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'verify-cli-'));
  const agent = generateEd25519KeyPair();
  const service = generateEd25519KeyPair();
  const events = signEvents(
    [
      {
        id: 'evt_1',
        runId: RUN,
        type: 'sample',
        at: '2025-01-01T00:00:01Z',
        payload: { latencyMs: 120, correct: true },
      },
      { id: 'evt_2', runId: RUN, type: 'log', at: '2025-01-01T00:00:02Z', payload: { message: 'halfway' } },
      {
        id: 'evt_3',
        runId: RUN,
        type: 'metric',
        at: '2025-01-01T00:00:03Z',
        payload: { name: 'accuracy', value: 0.93 },
      },
    ],
    EMPTY_HEAD,
    agent.privateKey,
    agent.keyId,
  );
  const artifact = buildArtifact(
    {
      runId: RUN,
      agentId: 'acme:agent:cli',
      agentKeys: [{ keyId: agent.keyId, publicKey: base64urlEncode(agent.raw) }],
      terms: { accuracy: { min: 0.9 }, latencyP95: { max: 200 } },
      events,
      finalizedAt: '2025-01-01T00:01:00.000Z',
    },
    { privateKey: service.privateKey, keyId: service.keyId },
  );
  expect(artifact.evaluation.verdict).toBe('pass');
  artifactText = JSON.stringify(artifact, null, 2);
  artifactPath = join(dir, 'artifact.json');
  await writeFile(artifactPath, artifactText);
  jwksText = JSON.stringify({ keys: [rawToJwk(generateEd25519KeyPair().raw), rawToJwk(service.raw)] });
  jwksPath = join(dir, 'jwks.json');
  await writeFile(jwksPath, jwksText);
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function variant(name: string, text: string): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, text);
  return path;
}

describe('agent-settlement verify', () => {
  it('verifies a fresh artifact: exit 0, every check ticked', async () => {
    const r = await cli('verify', artifactPath, '--jwks', jwksPath);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    for (const check of ['artifactHash', 'serviceSignature', 'eventSignatures', 'chain']) {
      expect(r.stdout).toMatch(new RegExp(`✓ ${check}\\b`));
    }
    expect(r.stdout).not.toContain('✗');
    expect(r.stdout).toContain('VERIFIED');
    expect(r.stdout).toContain(RUN);
  });

  it('prints the machine-readable result with --json', async () => {
    const r = await cli('verify', artifactPath, `--jwks=${jwksPath}`, '--json');
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout) as Record<string, unknown>;
    expect(out).toMatchObject({
      verified: true,
      checks: { artifactHash: true, serviceSignature: true, eventSignatures: true, chain: true },
      failures: [],
      runId: RUN,
      verdict: 'pass',
    });
  });

  it('fails when one byte of an event payload changes, naming eventSignatures', async () => {
    // 0.93 -> 0.94 inside evt_3's payload.
    const path = await variant(
      'payload.json',
      oneByteChange(artifactText, ['"items": [', '"id": "evt_3"', '"value": 0.9'], '3', '4'),
    );
    const r = await cli('verify', path, '--jwks', jwksPath);
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/✗ eventSignatures\s+event #2 \(seq 3, evt_3\): PAYLOAD_HASH_MISMATCH/);
    expect(r.stdout).toMatch(/✗ artifactHash/);
    expect(r.stdout).toMatch(/✓ serviceSignature/);
    expect(r.stdout).toContain('NOT VERIFIED');
  });

  it('fails when one byte of the terms changes, naming artifactHash', async () => {
    // accuracy min 0.9 -> 0.8 in the terms block.
    const path = await variant('terms.json', oneByteChange(artifactText, ['"terms": {', '"min": 0.'], '9', '8'));
    const r = await cli('verify', path, '--jwks', jwksPath, '--json');
    expect(r.code).toBe(1);
    const out = JSON.parse(r.stdout) as { verified: boolean; checks: Record<string, boolean>; failures: string[] };
    expect(out.verified).toBe(false);
    expect(out.checks).toEqual({ artifactHash: false, serviceSignature: true, eventSignatures: true, chain: true });
    expect(out.failures[0]).toMatch(/^artifactHash: recomputed hash/);
  });

  it('fails when the verdict changes (one byte, and pass -> fail), naming artifactHash', async () => {
    const oneByte = await variant('verdict1.json', oneByteChange(artifactText, ['"verdict": "'], 'p', 'P'));
    const flipped = await variant('verdict2.json', artifactText.replace('"verdict": "pass"', '"verdict": "fail"'));
    for (const path of [oneByte, flipped]) {
      const r = await cli('verify', path, '--jwks', jwksPath);
      expect(r.code).toBe(1);
      expect(r.stdout).toMatch(/✗ artifactHash\s+recomputed hash [0-9a-f]{64} does not match/);
      expect(r.stdout).toMatch(/✓ eventSignatures/);
    }
  });

  it('fails the service signature against a JWKS without the signing key', async () => {
    const path = await variant('other-jwks.json', JSON.stringify({ keys: [rawToJwk(generateEd25519KeyPair().raw)] }));
    const r = await cli('verify', artifactPath, '--jwks', path);
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/✗ serviceSignature\s+no key with kid key_[0-9a-f]{24} in the JWKS/);
  });

  it('fetches the JWKS from a URL', async () => {
    const server = createServer((req, res) => {
      if (req.url === '/.well-known/jwks.json') {
        res.writeHead(200, { 'content-type': 'application/json' }).end(jwksText);
      } else {
        res.writeHead(404).end();
      }
    });
    await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
    const { port } = server.address() as AddressInfo;
    try {
      const good = await cli('verify', artifactPath, '--jwks', `http://127.0.0.1:${port}/.well-known/jwks.json`);
      expect(good.code).toBe(0);
      const missing = await cli('verify', artifactPath, '--jwks', `http://127.0.0.1:${port}/nope`);
      expect(missing.code).toBe(2);
      expect(missing.stderr).toContain('HTTP 404');
    } finally {
      await new Promise((ok) => server.close(ok));
    }
  });

  it('exits 2 on usage and I/O errors', async () => {
    const noJwks = await cli('verify', artifactPath);
    expect(noJwks.code).toBe(2);
    expect(noJwks.stderr).toContain('missing --jwks');

    const noFile = await cli('verify', join(dir, 'absent.json'), '--jwks', jwksPath);
    expect(noFile.code).toBe(2);
    expect(noFile.stderr).toContain('ENOENT');

    const notJson = await cli('verify', await variant('broken.json', artifactText.slice(0, -1)), '--jwks', jwksPath);
    expect(notJson.code).toBe(2);
    expect(notJson.stderr).toContain('not valid JSON');

    const unknown = await cli('frobnicate');
    expect(unknown.code).toBe(2);

    const help = await cli('--help');
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: agent-settlement verify');
  });
});
