// Agent-signed, hash-chained run events (contract section 5): hashing, signing, batch and full-chain verification.
import type { KeyObject } from 'node:crypto';
import { canonicalize, CanonicalJsonError } from './canonical-json.ts';
import type { JsonValue } from './canonical-json.ts';
import { isSha256Hex, sha256Hex, signHexDigest, verifyHexDigest } from './crypto.ts';

export const EVENT_VERSION = 1;

/** The fields an agent authors; `payloadHash` covers exactly these. */
export interface UnsignedEvent {
  v: 1;
  id: string;
  runId: string;
  seq: number;
  type: string;
  at: string;
  payload: JsonValue;
}

/** The full envelope as appended and as stored in artifacts. */
export interface EventEnvelope extends UnsignedEvent {
  prevChainHash: string | null;
  payloadHash: string;
  chainHash: string;
  signerKeyId: string;
  signature: string;
}

/** Position of a run's chain; an empty run is {seq: 0, chainHash: null}. */
export interface ChainHead {
  seq: number;
  chainHash: string | null;
}

export const EMPTY_HEAD: Readonly<ChainHead> = Object.freeze({ seq: 0, chainHash: null });

/** The envelope's field names, in contract order; anything else on a stored document is not part of the event. */
export const ENVELOPE_FIELDS = [
  'v',
  'id',
  'runId',
  'seq',
  'type',
  'at',
  'payload',
  'prevChainHash',
  'payloadHash',
  'chainHash',
  'signerKeyId',
  'signature',
] as const;

/** `sha256hex(JCS({v,id,runId,seq,type,at,payload}))`. Throws CanonicalJsonError for a non-JSON payload. */
export function computePayloadHash(
  e: Pick<UnsignedEvent, 'v' | 'id' | 'runId' | 'seq' | 'type' | 'at' | 'payload'>,
): string {
  return sha256Hex(
    canonicalize({ v: e.v, id: e.id, runId: e.runId, seq: e.seq, type: e.type, at: e.at, payload: e.payload }),
  );
}

/** `sha256hex(JCS({v, prevChainHash, payloadHash}))`. */
export function computeChainHash(v: number, prevChainHash: string | null, payloadHash: string): string {
  return sha256Hex(canonicalize({ v, prevChainHash, payloadHash }));
}

/** Copy only the envelope fields (drops store metadata such as _id or tenantId). */
export function pickEnvelope(e: EventEnvelope): EventEnvelope {
  return {
    v: e.v,
    id: e.id,
    runId: e.runId,
    seq: e.seq,
    type: e.type,
    at: e.at,
    payload: e.payload,
    prevChainHash: e.prevChainHash,
    payloadHash: e.payloadHash,
    chainHash: e.chainHash,
    signerKeyId: e.signerKeyId,
    signature: e.signature,
  };
}

/** Builds the complete signed envelope; used by clients, the MCP tools and tests. */
export function signEvent(
  fields: Omit<UnsignedEvent, 'v'> & { v?: 1 },
  prevChainHash: string | null,
  privateKey: KeyObject,
  signerKeyId: string,
): EventEnvelope {
  const unsigned: UnsignedEvent = {
    v: EVENT_VERSION,
    id: fields.id,
    runId: fields.runId,
    seq: fields.seq,
    type: fields.type,
    at: fields.at,
    payload: fields.payload,
  };
  const payloadHash = computePayloadHash(unsigned);
  const chainHash = computeChainHash(EVENT_VERSION, prevChainHash, payloadHash);
  return {
    ...unsigned,
    prevChainHash,
    payloadHash,
    chainHash,
    signerKeyId,
    signature: signHexDigest(privateKey, chainHash),
  };
}

/** Signs a sequence of events, chaining them after `head` (seq and prevChainHash are filled in). */
export function signEvents(
  items: ReadonlyArray<Omit<UnsignedEvent, 'v' | 'seq'>>,
  head: ChainHead,
  privateKey: KeyObject,
  signerKeyId: string,
): EventEnvelope[] {
  const out: EventEnvelope[] = [];
  let prev = head;
  for (const item of items) {
    const e = signEvent({ ...item, seq: prev.seq + 1 }, prev.chainHash, privateKey, signerKeyId);
    out.push(e);
    prev = { seq: e.seq, chainHash: e.chainHash };
  }
  return out;
}

/** Same event, same content: the test for "duplicate id with the same content is a no-op". */
export function sameEvent(a: EventEnvelope, b: EventEnvelope): boolean {
  try {
    return canonicalize(pickEnvelope(a)) === canonicalize(pickEnvelope(b));
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Verification

/** Active keys of the signer, by keyId: a Map or a plain record. */
export type KeyLookup = ReadonlyMap<string, KeyObject> | Readonly<Record<string, KeyObject>>;

function lookupKey(keys: KeyLookup, keyId: string): KeyObject | undefined {
  if (keys instanceof Map) return keys.get(keyId);
  const rec = keys as Readonly<Record<string, KeyObject>>;
  return Object.hasOwn(rec, keyId) ? rec[keyId] : undefined;
}

/** Why one event does not verify. The first group is SIGNATURE_INVALID, the second CHAIN_CONFLICT. */
export type IntegrityReason =
  | 'EVENT_MALFORMED'
  | 'VERSION_UNSUPPORTED'
  | 'RUN_MISMATCH'
  | 'PAYLOAD_HASH_MISMATCH'
  | 'CHAIN_HASH_MISMATCH'
  | 'UNKNOWN_SIGNER'
  | 'SIGNATURE_MISMATCH';
export type ChainReason = 'SEQ_MISMATCH' | 'PREV_CHAIN_HASH_MISMATCH' | 'EVENT_MALFORMED';

interface EventProblem<R> {
  reason: R;
  message: string;
}

/** Shape check: the envelope's fields have the contract's types, so the checks below can rely on them. */
function shapeProblem(e: unknown): EventProblem<IntegrityReason> | null {
  const bad = (message: string) => ({ reason: 'EVENT_MALFORMED' as const, message });
  if (typeof e !== 'object' || e === null || Array.isArray(e)) return bad('event is not an object');
  const o = e as Record<string, unknown>;
  for (const f of ['id', 'runId', 'type', 'at', 'signerKeyId', 'signature'] as const) {
    if (typeof o[f] !== 'string') return bad(`${f} must be a string`);
  }
  if (typeof o.seq !== 'number' || !Number.isSafeInteger(o.seq) || o.seq < 1) {
    return bad('seq must be a positive integer');
  }
  if (o.prevChainHash !== null && !isSha256Hex(o.prevChainHash)) {
    return bad('prevChainHash must be null or 64 lowercase hex digits');
  }
  if (!isSha256Hex(o.payloadHash)) return bad('payloadHash must be 64 lowercase hex digits');
  if (!isSha256Hex(o.chainHash)) return bad('chainHash must be 64 lowercase hex digits');
  if (!('payload' in o) || o.payload === undefined) return bad('payload is missing');
  return null;
}

/**
 * Events whose signature this verifier already checked (at append) and may trust, so a full-chain check repeats
 * only the cheap parts for them: hashes, signer key and links are still recomputed.
 */
export type SignatureVerified = (e: EventEnvelope) => boolean;

/** Hashes, signer and signature of one (well-shaped) event, independent of its position in the chain. */
function integrityProblem(
  e: EventEnvelope,
  keys: KeyLookup,
  expectedRunId: string | undefined,
  signatureVerified?: SignatureVerified,
): EventProblem<IntegrityReason> | null {
  if (e.v !== EVENT_VERSION) return { reason: 'VERSION_UNSUPPORTED', message: `v must be ${EVENT_VERSION}` };
  if (expectedRunId !== undefined && e.runId !== expectedRunId) {
    return { reason: 'RUN_MISMATCH', message: `event belongs to run ${e.runId}, not ${expectedRunId}` };
  }
  let payloadHash: string;
  try {
    payloadHash = computePayloadHash(e);
  } catch (err) {
    if (err instanceof CanonicalJsonError) return { reason: 'EVENT_MALFORMED', message: err.message };
    throw err;
  }
  if (payloadHash !== e.payloadHash) {
    return { reason: 'PAYLOAD_HASH_MISMATCH', message: `payloadHash does not match the recomputed ${payloadHash}` };
  }
  const chainHash = computeChainHash(e.v, e.prevChainHash, payloadHash);
  if (chainHash !== e.chainHash) {
    return { reason: 'CHAIN_HASH_MISMATCH', message: `chainHash does not match the recomputed ${chainHash}` };
  }
  const key = lookupKey(keys, e.signerKeyId);
  if (key === undefined) {
    return { reason: 'UNKNOWN_SIGNER', message: `signer ${e.signerKeyId} is not an active key of the agent` };
  }
  if (!signatureVerified?.(e) && !verifyHexDigest(key, e.chainHash, e.signature)) {
    return { reason: 'SIGNATURE_MISMATCH', message: `signature does not verify with ${e.signerKeyId}` };
  }
  return null;
}

/** Position of an event after `prev` (the head, or the previous event of the same batch/chain). */
function chainProblem(e: EventEnvelope, prev: ChainHead): EventProblem<ChainReason> | null {
  if (e.seq !== prev.seq + 1) {
    return { reason: 'SEQ_MISMATCH', message: `seq ${e.seq} does not follow ${prev.seq}` };
  }
  if (e.prevChainHash !== prev.chainHash) {
    return {
      reason: 'PREV_CHAIN_HASH_MISMATCH',
      message: `prevChainHash ${String(e.prevChainHash)} is not ${String(prev.chainHash)}`,
    };
  }
  return null;
}

export type BatchVerification =
  | { ok: true; head: ChainHead }
  | {
      ok: false;
      code: 'SIGNATURE_INVALID';
      reason: IntegrityReason;
      index: number;
      eventId: string | null;
      message: string;
    }
  | {
      ok: false;
      code: 'CHAIN_CONFLICT';
      reason: ChainReason;
      index: number;
      eventId: string | null;
      message: string;
      /** The run's current head, for the error's details.head. */
      head: ChainHead;
    };

/**
 * Verify a batch about to be appended after `head`, all or nothing.
 *
 * Precedence (documented contract decision): first every event's shape (malformed -> SIGNATURE_INVALID, there is
 * nothing to chain), then chain position for the whole batch (the first event follows `head`, each later one the
 * previous event's claimed chainHash; any break -> CHAIN_CONFLICT with the current head), then hashes, signer and
 * signature (-> SIGNATURE_INVALID). Chain position wins because a stale head is the ordinary concurrency case: the
 * client needs the 409 with details.head to rebase, and an event signed against the wrong head can never be
 * accepted anyway. CHAIN_CONFLICT reveals nothing the caller could not read from GET /v1/runs/{id}.
 *
 * `keys` must hold only the agent's ACTIVE keys; `runId` is the run the events are appended to.
 * Duplicate-id replays ("same content is a no-op") must be filtered out by the caller before this check.
 * An empty batch verifies and leaves the head unchanged (the request schema should demand at least one event).
 */
export function verifyEventBatch(
  events: readonly unknown[],
  head: ChainHead,
  keys: KeyLookup,
  runId: string,
): BatchVerification {
  const idOf = (e: unknown): string | null => {
    const id = (e as { id?: unknown } | null)?.id;
    return typeof id === 'string' ? id : null;
  };
  for (const [index, e] of events.entries()) {
    const p = shapeProblem(e);
    if (p) return { ok: false, code: 'SIGNATURE_INVALID', ...p, index, eventId: idOf(e) };
  }
  const batch = events as readonly EventEnvelope[];
  let prev: ChainHead = head;
  for (const [index, e] of batch.entries()) {
    const p = chainProblem(e, prev);
    if (p) return { ok: false, code: 'CHAIN_CONFLICT', ...p, index, eventId: e.id, head: { ...head } };
    prev = { seq: e.seq, chainHash: e.chainHash };
  }
  for (const [index, e] of batch.entries()) {
    const p = integrityProblem(e, keys, runId);
    if (p) return { ok: false, code: 'SIGNATURE_INVALID', ...p, index, eventId: e.id };
  }
  return { ok: true, head: prev };
}

export interface ChainFailure {
  check: 'eventSignatures' | 'chain';
  index: number;
  eventId: string | null;
  reason: IntegrityReason | ChainReason;
  message: string;
}

export interface ChainVerification {
  ok: boolean;
  checks: { eventSignatures: boolean; chain: boolean };
  /** At most one failure per check (the first by index), ordered by index. */
  failures: ChainFailure[];
  /** The earliest failure, or null. */
  firstFailure: ChainFailure | null;
  /** Head after the last event (by claimed values). */
  head: ChainHead;
}

/**
 * Verify a complete run chain from seq 1 (artifact verification). Unlike verifyEventBatch, both checks are always
 * evaluated so a report can say which ones hold: `eventSignatures` = every event's shape, v, runId (when given),
 * payloadHash, chainHash, signer and signature; `chain` = seq 1..n in order and every prevChainHash linking to the
 * previous event's chainHash (null for the first).
 */
export function verifyChain(
  events: readonly unknown[],
  keys: KeyLookup,
  runId?: string,
  signatureVerified?: SignatureVerified,
): ChainVerification {
  let sigFailure: ChainFailure | null = null;
  let chainFailure: ChainFailure | null = null;
  let prev: ChainHead = EMPTY_HEAD;
  for (const [index, raw] of events.entries()) {
    const shape = shapeProblem(raw);
    const eventId = typeof (raw as { id?: unknown } | null)?.id === 'string' ? (raw as { id: string }).id : null;
    if (shape) {
      sigFailure ??= { check: 'eventSignatures', index, eventId, ...shape };
      // A malformed event cannot be placed in the chain either.
      chainFailure ??= {
        check: 'chain',
        index,
        eventId,
        reason: 'EVENT_MALFORMED',
        message: 'malformed event breaks the chain',
      };
      break;
    }
    const e = raw as EventEnvelope;
    if (sigFailure === null) {
      const p = integrityProblem(e, keys, runId, signatureVerified);
      if (p) sigFailure = { check: 'eventSignatures', index, eventId, ...p };
    }
    if (chainFailure === null) {
      const p = chainProblem(e, prev);
      if (p) chainFailure = { check: 'chain', index, eventId, ...p };
    }
    prev = { seq: e.seq, chainHash: e.chainHash };
    if (sigFailure && chainFailure) break;
  }
  const failures = [chainFailure, sigFailure]
    .filter((f): f is ChainFailure => f !== null)
    .sort((a, b) => a.index - b.index);
  return {
    ok: failures.length === 0,
    checks: { eventSignatures: sigFailure === null, chain: chainFailure === null },
    failures,
    firstFailure: failures[0] ?? null,
    head: prev,
  };
}

/** The identity of an event's signature, as a SignatureVerified set keys it. */
export function signatureKey(e: Pick<EventEnvelope, 'signerKeyId' | 'chainHash' | 'signature'>): string {
  return `${e.signerKeyId}\n${e.chainHash}\n${e.signature}`;
}
