import { describe, expect, it } from 'vitest';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import {
  base64urlEncode,
  generateEd25519KeyPair,
  publicKeyToPem,
  rawToJwk,
  sha256Hex,
  verifyHexDigest,
} from '../../src/domain/crypto.ts';
import {
  ArtifactBuildError,
  artifactIdFor,
  buildArtifact,
  buildArtifactBody,
  hashArtifact,
  signArtifactHash,
  verifyArtifact,
} from '../../src/domain/artifact.ts';
import type { BuildArtifactInput, RunArtifact } from '../../src/domain/artifact.ts';
import { EMPTY_HEAD, signEvents } from '../../src/domain/event-chain.ts';
import type { EventEnvelope } from '../../src/domain/event-chain.ts';

const RUN = 'run_ArtifactTest0000000000';
const AGENT = 'acme:agent:summarizer';
const agentKey = generateEd25519KeyPair();
const rotatedKey = generateEd25519KeyPair();
const service = generateEd25519KeyPair();
const jwks = { keys: [rawToJwk(service.raw)] };
const signer = { privateKey: service.privateKey, keyId: service.keyId };

function runEvents(): EventEnvelope[] {
  const first = signEvents(
    [
      {
        id: 'evt_a',
        runId: RUN,
        type: 'sample',
        at: '2025-01-01T00:00:01Z',
        payload: { latencyMs: 120, correct: true },
      },
      {
        id: 'evt_b',
        runId: RUN,
        type: 'sample',
        at: '2025-01-01T00:00:02Z',
        payload: { latencyMs: 180, correct: true },
      },
    ],
    EMPTY_HEAD,
    agentKey.privateKey,
    agentKey.keyId,
  );
  const last = first[1] as EventEnvelope;
  // The agent rotated keys mid-run: both keys must appear in agentKeys.
  const second = signEvents(
    [
      {
        id: 'evt_c',
        runId: RUN,
        type: 'metric',
        at: '2025-01-01T00:00:03Z',
        payload: { name: 'accuracy', value: 0.93 },
      },
    ],
    { seq: last.seq, chainHash: last.chainHash },
    rotatedKey.privateKey,
    rotatedKey.keyId,
  );
  return [...first, ...second];
}

function input(overrides: Partial<BuildArtifactInput> = {}): BuildArtifactInput {
  return {
    runId: RUN,
    agentId: AGENT,
    agentKeys: [
      { keyId: rotatedKey.keyId, publicKey: publicKeyToPem(rotatedKey.publicKey) },
      { keyId: agentKey.keyId, publicKey: base64urlEncode(agentKey.raw) },
    ],
    terms: { accuracy: { min: 0.9 }, latencyP95: { max: 200 } },
    events: runEvents(),
    finalizedAt: '2025-01-01T00:01:00.000Z',
    ...overrides,
  };
}

function clone<T>(v: T): T {
  return JSON.parse(JSON.stringify(v)) as T;
}

describe('buildArtifactBody', () => {
  it('records the run, signer keys, metrics, evaluation and events', () => {
    const body = buildArtifactBody(input());
    expect(body.schema).toBe('RunArtifact.v1');
    expect(body.agentKeys).toEqual(
      [
        { keyId: agentKey.keyId, publicKey: base64urlEncode(agentKey.raw) },
        { keyId: rotatedKey.keyId, publicKey: base64urlEncode(rotatedKey.raw) },
      ].sort((a, b) => (a.keyId < b.keyId ? -1 : 1)),
    );
    expect(body.metrics).toEqual({ accuracy: 0.93, latencyP95: 180 });
    expect(body.evaluation.verdict).toBe('pass');
    expect(body.events.count).toBe(3);
    const last = body.events.items[2] as EventEnvelope;
    expect(body.events.head).toEqual({ seq: 3, chainHash: last.chainHash });
    expect(body.finalizedAt).toBe('2025-01-01T00:01:00.000Z');
    expect(body).not.toHaveProperty('artifactHash');
    expect(body).not.toHaveProperty('signature');
  });

  it('is deterministic: event order, key format, unused keys and store fields do not matter', () => {
    const events = runEvents();
    const a = buildArtifactBody(input({ events }));
    const extraKey = generateEd25519KeyPair();
    const shuffledWithMeta = [events[2], events[0], events[1]].map((e) => ({ ...e, _id: 'x', tenantId: 'ten_1' }));
    const b = buildArtifactBody(
      input({
        events: shuffledWithMeta as EventEnvelope[],
        agentKeys: [
          { keyId: agentKey.keyId, publicKey: publicKeyToPem(agentKey.publicKey) },
          { keyId: extraKey.keyId, publicKey: base64urlEncode(extraKey.raw) },
          { keyId: rotatedKey.keyId, publicKey: base64urlEncode(rotatedKey.raw) },
        ],
      }),
    );
    expect(canonicalize(b)).toBe(canonicalize(a));
    expect(hashArtifact(b)).toBe(hashArtifact(a));
  });

  it('makes an empty run with no terms a passing artifact with the empty head', () => {
    const body = buildArtifactBody(input({ events: [], terms: null }));
    expect(body.events).toEqual({ count: 0, head: EMPTY_HEAD, items: [] });
    expect(body.agentKeys).toEqual([]);
    expect(body.terms).toEqual({});
    expect(body.evaluation).toEqual({ verdict: 'pass', results: [] });
  });

  it('refuses to build over events that do not verify or keys it cannot account for', () => {
    const events = runEvents();
    events[1] = { ...(events[1] as EventEnvelope), payload: { latencyMs: 1 } };
    expect(() => buildArtifactBody(input({ events }))).toThrow(ArtifactBuildError);
    expect(() =>
      buildArtifactBody(input({ agentKeys: [{ keyId: agentKey.keyId, publicKey: base64urlEncode(agentKey.raw) }] })),
    ).toThrow(/not among the agent's keys/);
    expect(() =>
      buildArtifactBody(input({ agentKeys: [{ keyId: agentKey.keyId, publicKey: base64urlEncode(rotatedKey.raw) }] })),
    ).toThrow(/does not match its public key/);
    expect(() => buildArtifactBody(input({ terms: { accuracy: { min: 1, max: 2 } as never } }))).toThrow(
      ArtifactBuildError,
    );
    expect(() => buildArtifactBody(input({ runId: 'run_other' }))).toThrow(/RUN_MISMATCH/);
  });
});

describe('hash, id and service signature', () => {
  it('hashes the JCS of the body and derives the id from it', () => {
    const body = buildArtifactBody(input());
    const hash = hashArtifact(body);
    expect(hash).toBe(sha256Hex(canonicalize(body)));
    expect(artifactIdFor(hash)).toBe(`art_${hash}`);
  });

  it('finalizedAt, terms and evaluation are all inside the hash', () => {
    const base = hashArtifact(buildArtifactBody(input()));
    expect(hashArtifact(buildArtifactBody(input({ finalizedAt: '2025-01-01T00:01:00.001Z' })))).not.toBe(base);
    expect(hashArtifact(buildArtifactBody(input({ terms: { accuracy: { min: 0.95 } } })))).not.toBe(base);
  });

  it('signs the hash bytes with the service key', () => {
    const hash = hashArtifact(buildArtifactBody(input()));
    const sig = signArtifactHash(hash, service.privateKey, service.keyId);
    expect(sig.alg).toBe('Ed25519');
    expect(sig.keyId).toBe(service.keyId);
    expect(verifyHexDigest(service.publicKey, hash, sig.value)).toBe(true);
  });

  it('finalizing twice yields the identical artifact', () => {
    const one = buildArtifact(input(), signer);
    const two = buildArtifact(input({ events: [...runEvents()].reverse() }), signer);
    expect(two).toEqual(one);
    expect(one.artifactId).toBe(`art_${one.artifactHash}`);
    expect(hashArtifact(one)).toBe(one.artifactHash); // unhashed fields are ignored
  });
});

describe('verifyArtifact', () => {
  const artifact = buildArtifact(input(), signer);
  const ALL_OK = { artifactHash: true, serviceSignature: true, eventSignatures: true, chain: true };

  it('verifies a fresh artifact, also after a JSON round trip', () => {
    const r = verifyArtifact(clone(artifact), clone(jwks));
    expect(r).toEqual({
      verified: true,
      checks: ALL_OK,
      failures: [],
      reasons: { artifactHash: [], serviceSignature: [], eventSignatures: [], chain: [] },
    });
  });

  it('a changed event payload breaks the event signatures and the artifact hash', () => {
    const a = clone(artifact);
    (a.events.items[2] as EventEnvelope).payload = { name: 'accuracy', value: 0.94 };
    const r = verifyArtifact(a, jwks);
    expect(r.verified).toBe(false);
    expect(r.checks).toEqual({ ...ALL_OK, artifactHash: false, eventSignatures: false });
    expect(r.reasons.eventSignatures[0]).toMatch(/event #2 \(seq 3, evt_c\): PAYLOAD_HASH_MISMATCH/);
  });

  it('changed terms, verdict or finalizedAt break the artifact hash only', () => {
    const mutations: Array<(a: RunArtifact) => void> = [
      (a) => {
        a.terms = { ...a.terms, accuracy: { min: 0.5 } };
      },
      (a) => {
        a.evaluation.verdict = 'fail';
      },
      (a) => {
        (a.evaluation.results[0] as { pass: boolean }).pass = false;
      },
      (a) => {
        a.metrics.accuracy = 0.99;
      },
      (a) => {
        a.finalizedAt = '2030-01-01T00:00:00.000Z';
      },
      (a) => {
        (a as unknown as Record<string, unknown>).extra = 'added field';
      },
    ];
    for (const mutate of mutations) {
      const a = clone(artifact);
      mutate(a);
      const r = verifyArtifact(a, jwks);
      expect(r.checks).toEqual({ ...ALL_OK, artifactHash: false });
      expect(r.failures[0]).toMatch(/^artifactHash: recomputed hash [0-9a-f]{64} does not match/);
    }
  });

  it('a re-hashed forgery still fails the service signature', () => {
    const a = clone(artifact);
    a.evaluation.verdict = 'fail';
    a.artifactHash = hashArtifact(a);
    a.artifactId = artifactIdFor(a.artifactHash);
    const r = verifyArtifact(a, jwks);
    expect(r.checks).toEqual({ ...ALL_OK, serviceSignature: false });
    expect(r.reasons.serviceSignature).toEqual([`signature does not verify with JWKS key ${service.keyId}`]);
  });

  it('the signature must come from a JWKS key with the right kid', () => {
    const other = generateEd25519KeyPair();
    expect(verifyArtifact(artifact, { keys: [rawToJwk(other.raw)] }).reasons.serviceSignature[0]).toMatch(
      /no key with kid/,
    );
    // Right kid, wrong key material.
    const impostor = { keys: [rawToJwk(other.raw, service.keyId)] };
    expect(verifyArtifact(artifact, impostor).checks.serviceSignature).toBe(false);
    // Retired keys stay in the JWKS, so a JWKS with several keys works.
    expect(verifyArtifact(artifact, { keys: [rawToJwk(other.raw), ...jwks.keys] }).verified).toBe(true);
    expect(verifyArtifact(artifact, { keys: 'nope' }).checks.serviceSignature).toBe(false);
    expect(verifyArtifact(artifact, null).checks.serviceSignature).toBe(false);
  });

  it('a changed artifactId or signature alg fails', () => {
    const a = clone(artifact);
    a.artifactId = `art_${'0'.repeat(64)}`;
    expect(verifyArtifact(a, jwks).reasons.artifactHash[0]).toMatch(/artifactId/);
    const b = clone(artifact);
    (b.signature as { alg: string }).alg = 'RS256';
    expect(verifyArtifact(b, jwks).checks.serviceSignature).toBe(false);
  });

  it('removing an event breaks the chain (and the hash), even with count and head fixed up', () => {
    const a = clone(artifact);
    a.events.items.splice(1, 1);
    a.events.count = 2;
    const r = verifyArtifact(a, jwks);
    expect(r.checks.chain).toBe(false);
    expect(r.checks.artifactHash).toBe(false);
    expect(r.checks.eventSignatures).toBe(true);
    expect(r.reasons.chain[0]).toMatch(/SEQ_MISMATCH/);
  });

  it('count and head must describe the items', () => {
    const a = clone(artifact);
    a.events.count = 4;
    a.events.head = { seq: 2, chainHash: (a.events.items[1] as EventEnvelope).chainHash };
    const r = verifyArtifact(a, jwks);
    expect(r.checks.chain).toBe(false);
    expect(r.reasons.chain).toHaveLength(2);
  });

  it('agent keys must match their key ids and cover every signer', () => {
    const a = clone(artifact);
    a.agentKeys = a.agentKeys.map((k) => ({ ...k, publicKey: base64urlEncode(generateEd25519KeyPair().raw) }));
    const r = verifyArtifact(a, jwks);
    expect(r.checks.eventSignatures).toBe(false);
    expect(r.reasons.eventSignatures[0]).toMatch(/keyId .* does not match its public key/);
    const b = clone(artifact);
    b.agentKeys = b.agentKeys.filter((k) => k.keyId !== rotatedKey.keyId);
    expect(verifyArtifact(b, jwks).reasons.eventSignatures.join('\n')).toMatch(/UNKNOWN_SIGNER/);
  });

  it('never throws on garbage input', () => {
    for (const junk of [null, 42, 'x', [], {}, { events: { items: [null] } }, { ...clone(artifact), events: 5 }]) {
      const r = verifyArtifact(junk, jwks);
      expect(r.verified).toBe(false);
      expect(r.failures.length).toBeGreaterThan(0);
    }
    // A lone surrogate smuggled in through JSON escapes cannot be hashed: reported, not thrown.
    const text = JSON.stringify(artifact).replace('"agentId":"acme', '"agentId":"\\ud800acme');
    expect(verifyArtifact(JSON.parse(text), jwks).reasons.artifactHash[0]).toMatch(/not canonical JSON/);
  });
});
