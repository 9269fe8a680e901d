import { describe, expect, it } from 'vitest';
import type { KeyObject } from 'node:crypto';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { base64urlDecode, generateEd25519KeyPair, sha256Hex, verifyBytes } from '../../src/domain/crypto.ts';
import {
  attestationHolds,
  batchAttestation,
  computeChainHash,
  computePayloadHash,
  EMPTY_HEAD,
  sameEvent,
  signatureKey,
  signEvent,
  signEvents,
  verifyChain,
  verifyEventBatch,
} from '../../src/domain/event-chain.ts';
import type { ChainHead, EventEnvelope } from '../../src/domain/event-chain.ts';

const RUN = 'run_TestRun000000000000000';
const agent = generateEd25519KeyPair();
const activeKeys = new Map<string, KeyObject>([[agent.keyId, agent.publicKey]]);

function chainOf(n: number, head: ChainHead = EMPTY_HEAD): EventEnvelope[] {
  return signEvents(
    Array.from({ length: n }, (_, i) => ({
      id: `evt_${head.seq + i + 1}`,
      runId: RUN,
      type: 'sample',
      at: `2025-01-01T00:00:0${i}Z`,
      payload: { latencyMs: 100 + i, correct: i % 2 === 0 },
    })),
    head,
    agent.privateKey,
    agent.keyId,
  );
}

function headOf(e: EventEnvelope): ChainHead {
  return { seq: e.seq, chainHash: e.chainHash };
}

/** Re-sign an edited event so only the property under test is wrong. */
function resign(e: EventEnvelope, edit: Partial<EventEnvelope>): EventEnvelope {
  const merged = { ...e, ...edit };
  return signEvent(merged, merged.prevChainHash, agent.privateKey, merged.signerKeyId);
}

describe('event hashes and signatures (contract section 5)', () => {
  it('computes payloadHash, chainHash and signature exactly as specified', () => {
    const e = signEvent(
      {
        id: 'evt_1',
        runId: RUN,
        seq: 1,
        type: 'metric',
        at: '2025-01-01T00:00:00Z',
        payload: { name: 'accuracy', value: 0.9 },
      },
      null,
      agent.privateKey,
      agent.keyId,
    );
    expect(e.v).toBe(1);
    expect(e.prevChainHash).toBeNull();
    const expectedPayloadHash = sha256Hex(
      '{"at":"2025-01-01T00:00:00Z","id":"evt_1","payload":{"name":"accuracy","value":0.9},' +
        `"runId":"${RUN}","seq":1,"type":"metric","v":1}`,
    );
    expect(e.payloadHash).toBe(expectedPayloadHash);
    expect(computePayloadHash(e)).toBe(expectedPayloadHash);
    expect(e.chainHash).toBe(sha256Hex(`{"payloadHash":"${expectedPayloadHash}","prevChainHash":null,"v":1}`));
    expect(computeChainHash(1, null, expectedPayloadHash)).toBe(e.chainHash);
    // The signature covers the 32 raw bytes of chainHash, not its hex text.
    expect(verifyBytes(agent.publicKey, Buffer.from(e.chainHash, 'hex'), base64urlDecode(e.signature))).toBe(true);
    expect(verifyBytes(agent.publicKey, Buffer.from(e.chainHash), base64urlDecode(e.signature))).toBe(false);
  });

  it('payloadHash ignores key order but not content', () => {
    const base = { v: 1 as const, id: 'evt_1', runId: RUN, seq: 1, type: 'log', at: 't', payload: { a: 1, b: [1, 2] } };
    expect(computePayloadHash(base)).toBe(computePayloadHash({ ...base, payload: { b: [1, 2], a: 1 } }));
    expect(computePayloadHash(base)).not.toBe(computePayloadHash({ ...base, payload: { a: 1, b: [2, 1] } }));
  });

  it('links each event to the previous chainHash', () => {
    const events = chainOf(3);
    expect(events.map((e) => e.seq)).toEqual([1, 2, 3]);
    expect(events[1]?.prevChainHash).toBe(events[0]?.chainHash);
    expect(events[2]?.prevChainHash).toBe(events[1]?.chainHash);
  });

  it('sameEvent compares envelope content only', () => {
    const [e] = chainOf(1) as [EventEnvelope];
    expect(sameEvent(e, { ...e, _id: 'mongo', tenantId: 'ten_x' } as EventEnvelope)).toBe(true);
    expect(sameEvent(e, { ...e, at: 'other' })).toBe(false);
  });
});

describe('verifyEventBatch', () => {
  it('accepts a chain appended to an empty run and returns the new head', () => {
    const events = chainOf(3);
    const r = verifyEventBatch(events, EMPTY_HEAD, activeKeys, RUN);
    expect(r).toEqual({ ok: true, head: headOf(events[2] as EventEnvelope) });
  });

  it('accepts a batch after an existing head, keys given as a record too', () => {
    const first = chainOf(2);
    const head = headOf(first[1] as EventEnvelope);
    const next = chainOf(2, head);
    expect(verifyEventBatch(next, head, { [agent.keyId]: agent.publicKey }, RUN).ok).toBe(true);
  });

  it('reports CHAIN_CONFLICT with the current head when the batch does not follow it', () => {
    const events = chainOf(2);
    const head = headOf(events[1] as EventEnvelope);
    // Re-sending seq 1 against a head of seq 2 (a stale client).
    const r = verifyEventBatch([events[0]], head, activeKeys, RUN);
    expect(r).toMatchObject({ ok: false, code: 'CHAIN_CONFLICT', reason: 'SEQ_MISMATCH', index: 0, head });
    // Right seq, wrong prevChainHash (forked from an older head).
    const forked = resign(events[1] as EventEnvelope, { seq: 3 });
    expect(verifyEventBatch([forked], head, activeKeys, RUN)).toMatchObject({
      code: 'CHAIN_CONFLICT',
      reason: 'PREV_CHAIN_HASH_MISMATCH',
    });
    // The first event of a run must have prevChainHash null.
    const notGenesis = resign(events[0] as EventEnvelope, { prevChainHash: sha256Hex('x') });
    expect(verifyEventBatch([notGenesis], EMPTY_HEAD, activeKeys, RUN)).toMatchObject({ code: 'CHAIN_CONFLICT' });
  });

  it('requires every event of a batch to follow the previous one', () => {
    const events = chainOf(3);
    const gap = [events[0], events[2]];
    expect(verifyEventBatch(gap, EMPTY_HEAD, activeKeys, RUN)).toMatchObject({
      ok: false,
      code: 'CHAIN_CONFLICT',
      reason: 'SEQ_MISMATCH',
      index: 1,
      eventId: 'evt_3',
      head: EMPTY_HEAD,
    });
  });

  it.each([
    [
      'payload changed after signing',
      (e: EventEnvelope) => ({ ...e, payload: { latencyMs: 101 } }),
      'PAYLOAD_HASH_MISMATCH',
    ],
    ['type changed after signing', (e: EventEnvelope) => ({ ...e, type: 'log' }), 'PAYLOAD_HASH_MISMATCH'],
    [
      'chainHash not recomputable',
      (e: EventEnvelope) => ({ ...e, chainHash: sha256Hex('forged') }),
      'CHAIN_HASH_MISMATCH',
    ],
    [
      'signature over something else',
      (e: EventEnvelope) => ({
        ...e,
        signature: signEvent({ ...e, id: 'evt_other' }, null, agent.privateKey, agent.keyId).signature,
      }),
      'SIGNATURE_MISMATCH',
    ],
    ['signature garbage', (e: EventEnvelope) => ({ ...e, signature: 'not-a-signature' }), 'SIGNATURE_MISMATCH'],
    ['unknown signer', (e: EventEnvelope) => ({ ...e, signerKeyId: 'key_000000000000000000000000' }), 'UNKNOWN_SIGNER'],
    ['wrong version', (e: EventEnvelope) => ({ ...e, v: 2 }) as unknown as EventEnvelope, 'VERSION_UNSUPPORTED'],
    ['another run', (e: EventEnvelope) => resign(e, { runId: 'run_other' }), 'RUN_MISMATCH'],
    ['lone surrogate in payload', (e: EventEnvelope) => ({ ...e, payload: { note: '\ud800' } }), 'EVENT_MALFORMED'],
    [
      'missing payload',
      (e: EventEnvelope) => {
        const { payload: _p, ...rest } = e;
        return rest as EventEnvelope;
      },
      'EVENT_MALFORMED',
    ],
    ['uppercase hash', (e: EventEnvelope) => ({ ...e, payloadHash: e.payloadHash.toUpperCase() }), 'EVENT_MALFORMED'],
    ['fractional seq', (e: EventEnvelope) => ({ ...e, seq: 1.5 }), 'EVENT_MALFORMED'],
  ])('reports SIGNATURE_INVALID for %s', (_name, tamper, reason) => {
    const [e] = chainOf(1) as [EventEnvelope];
    const r = verifyEventBatch([tamper(e)], EMPTY_HEAD, activeKeys, RUN);
    expect(r).toMatchObject({ ok: false, code: 'SIGNATURE_INVALID', reason, index: 0 });
  });

  it('refuses a key that is not active (revoked keys are simply absent from the lookup)', () => {
    const events = chainOf(1);
    const other = generateEd25519KeyPair();
    const r = verifyEventBatch(events, EMPTY_HEAD, new Map([[other.keyId, other.publicKey]]), RUN);
    expect(r).toMatchObject({ code: 'SIGNATURE_INVALID', reason: 'UNKNOWN_SIGNER' });
    // A key of someone else claiming the agent's keyId does not verify either.
    const impostor = new Map([[agent.keyId, other.publicKey]]);
    expect(verifyEventBatch(events, EMPTY_HEAD, impostor, RUN)).toMatchObject({ reason: 'SIGNATURE_MISMATCH' });
    // Prototype names are not keys.
    const proto = resign(events[0] as EventEnvelope, { signerKeyId: 'constructor' });
    expect(verifyEventBatch([proto], EMPTY_HEAD, { [agent.keyId]: agent.publicKey }, RUN)).toMatchObject({
      reason: 'UNKNOWN_SIGNER',
    });
  });

  it('is all or nothing: one bad event in a batch fails it, naming its index', () => {
    const events = chainOf(3);
    const bad = [...events];
    bad[2] = { ...(events[2] as EventEnvelope), payload: { latencyMs: 1 } };
    expect(verifyEventBatch(bad, EMPTY_HEAD, activeKeys, RUN)).toMatchObject({
      code: 'SIGNATURE_INVALID',
      index: 2,
      eventId: 'evt_3',
    });
  });

  it('gives chain position precedence over signature problems', () => {
    const events = chainOf(2);
    const staleAndForged = { ...(events[0] as EventEnvelope), payload: { forged: true } };
    // Head is already at seq 2, and the event is also tampered: the client first needs to learn the head.
    const r = verifyEventBatch([staleAndForged], headOf(events[1] as EventEnvelope), activeKeys, RUN);
    expect(r).toMatchObject({ code: 'CHAIN_CONFLICT' });
    // Within a batch too: a bad signature at index 0 and a broken link at index 1 -> CHAIN_CONFLICT.
    const mixed = [
      { ...(events[0] as EventEnvelope), signature: 'AAAA' },
      { ...(events[1] as EventEnvelope), seq: 5 },
    ];
    expect(verifyEventBatch(mixed, EMPTY_HEAD, activeKeys, RUN)).toMatchObject({ code: 'CHAIN_CONFLICT', index: 1 });
  });

  it('an empty batch changes nothing', () => {
    const head = { seq: 4, chainHash: sha256Hex('h') };
    expect(verifyEventBatch([], head, activeKeys, RUN)).toEqual({ ok: true, head });
  });
});

describe('verifyChain', () => {
  it('accepts a whole chain, and an empty one', () => {
    const events = chainOf(4);
    const r = verifyChain(events, activeKeys, RUN);
    expect(r).toMatchObject({
      ok: true,
      checks: { eventSignatures: true, chain: true },
      failures: [],
      firstFailure: null,
    });
    expect(r.head).toEqual(headOf(events[3] as EventEnvelope));
    expect(verifyChain([], activeKeys)).toMatchObject({ ok: true, head: EMPTY_HEAD });
  });

  it('flags a tampered payload as eventSignatures only', () => {
    const events = chainOf(4);
    events[2] = { ...(events[2] as EventEnvelope), payload: { latencyMs: 999 } };
    const r = verifyChain(events, activeKeys, RUN);
    expect(r.checks).toEqual({ eventSignatures: false, chain: true });
    expect(r.firstFailure).toMatchObject({ check: 'eventSignatures', index: 2, reason: 'PAYLOAD_HASH_MISMATCH' });
  });

  it('flags a dropped or reordered event as a chain failure', () => {
    const events = chainOf(4);
    const dropped = [events[0], events[1], events[3]];
    const r = verifyChain(dropped, activeKeys, RUN);
    expect(r.checks).toEqual({ eventSignatures: true, chain: false });
    expect(r.firstFailure).toMatchObject({ check: 'chain', index: 2, reason: 'SEQ_MISMATCH' });

    const swapped = [events[1], events[0], events[2], events[3]];
    expect(verifyChain(swapped, activeKeys, RUN).firstFailure).toMatchObject({ check: 'chain', index: 0 });
  });

  it('detects a consistently re-signed fork only through the links', () => {
    // Replacing event 2 with a validly signed alternative breaks event 3's prevChainHash.
    const events = chainOf(3);
    events[1] = resign(events[1] as EventEnvelope, { payload: { latencyMs: 1 } });
    const r = verifyChain(events, activeKeys, RUN);
    expect(r.checks).toEqual({ eventSignatures: true, chain: false });
    expect(r.firstFailure).toMatchObject({ index: 2, reason: 'PREV_CHAIN_HASH_MISMATCH' });
  });

  it('reports both checks, ordered by index, and stops at a malformed event', () => {
    const events = chainOf(3);
    const broken = [
      events[0],
      { ...(events[1] as EventEnvelope), signature: 'AAAA' },
      { ...(events[2] as EventEnvelope), seq: 9 },
    ];
    const r = verifyChain(broken, activeKeys, RUN);
    expect(r.failures.map((f) => [f.check, f.index])).toEqual([
      ['eventSignatures', 1],
      ['chain', 2],
    ]);
    const malformed = verifyChain([events[0], 'nope'], activeKeys, RUN);
    expect(malformed.checks).toEqual({ eventSignatures: false, chain: false });
    expect(malformed.firstFailure?.reason).toBe('EVENT_MALFORMED');
  });

  it('checks the run id when given', () => {
    const events = chainOf(2);
    expect(verifyChain(events, activeKeys, 'run_other').firstFailure).toMatchObject({ reason: 'RUN_MISMATCH' });
    // Canonical forms are stable, so hashes can be recomputed anywhere.
    expect(canonicalize(events[0])).toBe(canonicalize(JSON.parse(JSON.stringify(events[0]))));
  });
});

describe('batch attestations (signatures verified once, at append)', () => {
  const key = Buffer.alloc(32, 7);

  it('holds for exactly the attested events, run and key', () => {
    const events = chainOf(3);
    const mac = batchAttestation(key, RUN, events);
    expect(attestationHolds(key, RUN, events, mac)).toBe(true);
    expect(attestationHolds(Buffer.alloc(32, 8), RUN, events, mac)).toBe(false);
    expect(attestationHolds(key, 'run_other', events, mac)).toBe(false);
    expect(attestationHolds(key, RUN, events.slice(0, 2), mac)).toBe(false);
    const forged = events.map((e, i) => (i === 1 ? { ...e, signature: events[0]!.signature } : e));
    expect(attestationHolds(key, RUN, forged, mac)).toBe(false);
    expect(attestationHolds(key, RUN, events, 'short')).toBe(false);
  });

  it('lets verifyChain skip only the Ed25519 check of trusted events; hashes and links are still recomputed', () => {
    const events = chainOf(3);
    const badSignature = events.map((e, i) => (i === 2 ? { ...e, signature: events[0]!.signature } : e));
    const trusted = new Set(badSignature.map(signatureKey));
    // A trusted signature is not re-checked (the service verified it at append) ...
    expect(verifyChain(badSignature, activeKeys, RUN, (e) => trusted.has(signatureKey(e))).ok).toBe(true);
    // ... while without the trust it fails, and a trusted event with an altered payload still fails its hash.
    expect(verifyChain(badSignature, activeKeys, RUN).firstFailure).toMatchObject({
      index: 2,
      reason: 'SIGNATURE_MISMATCH',
    });
    const altered = events.map((e, i) => (i === 1 ? { ...e, payload: { latencyMs: 1 } } : e));
    expect(verifyChain(altered, activeKeys, RUN, () => true).firstFailure).toMatchObject({
      index: 1,
      reason: 'PAYLOAD_HASH_MISMATCH',
    });
  });
});
