// RunArtifact.v1 (contract section 6): deterministic build, content-addressed hash, service signature, offline verify.
import type { KeyObject } from 'node:crypto';
import { canonicalize } from './canonical-json.ts';
import {
  base64urlEncode,
  isSha256Hex,
  jwkToRaw,
  KeyFormatError,
  parsePublicKey,
  publicKeyFromRaw,
  sha256Hex,
  signHexDigest,
  verifyHexDigest,
} from './crypto.ts';
import { EMPTY_HEAD, pickEnvelope, verifyChain } from './event-chain.ts';
import type { ChainHead, EventEnvelope, SignatureVerified } from './event-chain.ts';
import { checkPricedUsage, parsePriceSchedule, PricingError, pricedUsage } from './pricing.ts';
import type { PriceSchedule, PricedUsage } from './pricing.ts';
import { evaluateRun, termsProblems } from './terms.ts';
import type { Evaluation, Metrics, Terms } from './terms.ts';

export const ARTIFACT_SCHEMA = 'RunArtifact.v1';

/** A key that signed at least one event; `publicKey` is base64url of the raw 32 bytes. */
export interface AgentKeyRef {
  keyId: string;
  publicKey: string;
}

export interface ArtifactEvents {
  count: number;
  head: ChainHead;
  items: EventEnvelope[];
}

export interface ArtifactSignature {
  alg: 'Ed25519';
  keyId: string;
  value: string;
}

/** Everything that is hashed: the artifact without artifactId, artifactHash and signature. */
export interface RunArtifactBody {
  schema: typeof ARTIFACT_SCHEMA;
  runId: string;
  agentId: string;
  agentKeys: AgentKeyRef[];
  terms: Terms;
  metrics: Metrics;
  evaluation: Evaluation;
  /**
   * A priced run only (absent otherwise, so artifacts of unpriced runs hash as before): its schedule, the usage its
   * events report and what that costs, all recomputable from `events` (verifyArtifact does).
   */
  pricing?: PricedUsage;
  events: ArtifactEvents;
  finalizedAt: string;
}

export interface RunArtifact extends RunArtifactBody {
  artifactId: string;
  artifactHash: string;
  signature: ArtifactSignature;
}

/**
 * Fields left out of the hash. artifactId has to be excluded as well as artifactHash and signature: it is derived
 * from the hash ("art_" + hash), so it cannot be part of its own input.
 */
export const UNHASHED_FIELDS = ['artifactId', 'artifactHash', 'signature'] as const;

/** Thrown when a run's stored data cannot make a valid artifact (broken chain, unknown signer key, bad terms). */
export class ArtifactBuildError extends Error {
  readonly code = 'ARTIFACT_BUILD_FAILED';
  constructor(message: string) {
    super(message);
    this.name = 'ArtifactBuildError';
  }
}

export interface BuildArtifactInput {
  runId: string;
  agentId: string;
  /** Keys of the agent (any format parsePublicKey accepts); extra keys are fine, only signers are recorded. */
  agentKeys: ReadonlyArray<{ keyId: string; publicKey: string }>;
  /** The run's terms; null/undefined means none. */
  terms?: Terms | null;
  /** The run's price schedule; null/undefined means the run is not priced by use. */
  pricing?: PriceSchedule | null;
  /** The run's stored events, in any order; store-only fields are dropped. */
  events: readonly EventEnvelope[];
  /**
   * A stable timestamp supplied by the caller (e.g. when finalize was requested, stored on the run). It is hashed,
   * so it must not be "now" at build time, or a retried finalize would produce a different artifact.
   */
  finalizedAt: string;
  /** Events whose signatures were verified at append (see batchAttestation); every other check still runs. */
  signatureVerified?: SignatureVerified;
}

/**
 * The hashed body of a run's artifact. Deterministic for the same stored data: events ordered by seq, only keys that
 * signed an event recorded (sorted by keyId, public keys as base64url raw bytes), metrics and evaluation recomputed
 * from the events. The chain is verified first; an artifact is never built over events that do not verify.
 */
export function buildArtifactBody(input: BuildArtifactInput): RunArtifactBody {
  const terms: Terms = input.terms ?? {};
  const problems = termsProblems(terms);
  if (problems.length > 0) throw new ArtifactBuildError(`invalid terms: ${problems.join('; ')}`);

  const items = [...input.events].sort((a, b) => a.seq - b.seq).map(pickEnvelope);

  const known = new Map<string, { ref: AgentKeyRef; key: KeyObject }>();
  for (const k of input.agentKeys) {
    const parsed = parsePublicKey(k.publicKey);
    if (parsed.keyId !== k.keyId) {
      throw new ArtifactBuildError(`agent key ${k.keyId} does not match its public key (${parsed.keyId})`);
    }
    known.set(k.keyId, { ref: { keyId: k.keyId, publicKey: base64urlEncode(parsed.raw) }, key: parsed.keyObject });
  }
  const signerIds = [...new Set(items.map((e) => e.signerKeyId))].sort();
  const keys = new Map<string, KeyObject>();
  const agentKeys: AgentKeyRef[] = [];
  for (const id of signerIds) {
    const k = known.get(id);
    if (!k) throw new ArtifactBuildError(`event signer ${id} is not among the agent's keys`);
    keys.set(id, k.key);
    agentKeys.push(k.ref);
  }

  const chain = verifyChain(items, keys, input.runId, input.signatureVerified);
  if (!chain.ok) {
    const f = chain.firstFailure;
    throw new ArtifactBuildError(
      `events do not verify: ${f ? `event ${f.index} ${f.reason}: ${f.message}` : 'unknown'}`,
    );
  }

  const { metrics, evaluation } = evaluateRun(items, terms);
  let pricing: PricedUsage | undefined;
  try {
    pricing = input.pricing ? pricedUsage(items, parsePriceSchedule(input.pricing)) : undefined;
  } catch (err) {
    // A schedule is validated at creation, so this is usage that overflows: no artifact can state its price.
    if (err instanceof PricingError) throw new ArtifactBuildError(`cannot price the run's usage: ${err.message}`);
    throw err;
  }
  const last = items.at(-1);
  return {
    schema: ARTIFACT_SCHEMA,
    runId: input.runId,
    agentId: input.agentId,
    agentKeys,
    terms: structuredClone(terms),
    metrics,
    evaluation,
    ...(pricing ? { pricing } : {}),
    events: {
      count: items.length,
      head: last ? { seq: last.seq, chainHash: last.chainHash } : { ...EMPTY_HEAD },
      items,
    },
    finalizedAt: input.finalizedAt,
  };
}

/** `sha256hex(JCS(body))`; any unhashed fields present on the argument are ignored. */
export function hashArtifact(body: RunArtifactBody | RunArtifact): string {
  return sha256Hex(canonicalize(artifactBodyOf(body)));
}

/** The body (hash input) of an artifact-like object: everything except UNHASHED_FIELDS, extra fields included. */
export function artifactBodyOf<T extends object>(artifact: T): Omit<T, (typeof UNHASHED_FIELDS)[number]> {
  const body = { ...artifact } as Record<string, unknown>;
  for (const f of UNHASHED_FIELDS) delete body[f];
  return body as Omit<T, (typeof UNHASHED_FIELDS)[number]>;
}

export function artifactIdFor(hashHex: string): string {
  return `art_${hashHex}`;
}

/** The service's signature: Ed25519 over the 32 hash bytes (hex-decoded), base64url. */
export function signArtifactHash(hashHex: string, privateKey: KeyObject, keyId: string): ArtifactSignature {
  return { alg: 'Ed25519', keyId, value: signHexDigest(privateKey, hashHex) };
}

/** Build, hash and sign in one go (what the finalize worker stores). Same input + same key -> identical artifact. */
export function buildArtifact(
  input: BuildArtifactInput,
  signer: { privateKey: KeyObject; keyId: string },
): RunArtifact {
  const body = buildArtifactBody(input);
  const artifactHash = hashArtifact(body);
  // Contract field order, for readable JSON; the hash does not depend on it.
  return {
    schema: body.schema,
    artifactId: artifactIdFor(artifactHash),
    artifactHash,
    runId: body.runId,
    agentId: body.agentId,
    agentKeys: body.agentKeys,
    terms: body.terms,
    metrics: body.metrics,
    evaluation: body.evaluation,
    ...(body.pricing ? { pricing: body.pricing } : {}),
    events: body.events,
    finalizedAt: body.finalizedAt,
    signature: signArtifactHash(artifactHash, signer.privateKey, signer.keyId),
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Verification (pure; the CLI and GET /v1/verify both use it)

export type ArtifactCheck = 'artifactHash' | 'serviceSignature' | 'eventSignatures' | 'chain';
export const ARTIFACT_CHECKS: readonly ArtifactCheck[] = [
  'artifactHash',
  'serviceSignature',
  'eventSignatures',
  'chain',
];

/**
 * `pricing` is reported only for an artifact of a priced run (one that carries `pricing`): its usage and amount
 * recomputed from the events must be the ones it states. Artifacts without pricing keep the four checks.
 */
export interface ArtifactVerification {
  verified: boolean;
  checks: Record<ArtifactCheck, boolean> & { pricing?: boolean };
  /** Every failure as "<check>: <reason>". */
  failures: string[];
  /** The reasons per check (empty when it holds), for reports. */
  reasons: Record<ArtifactCheck, string[]> & { pricing?: string[] };
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function checkHash(a: Record<string, unknown>): string[] {
  const out: string[] = [];
  if (a.schema !== ARTIFACT_SCHEMA) out.push(`schema is ${JSON.stringify(a.schema)}, expected "${ARTIFACT_SCHEMA}"`);
  if (!isSha256Hex(a.artifactHash)) return [...out, 'artifactHash is not 64 lowercase hex digits'];
  let recomputed: string;
  try {
    recomputed = sha256Hex(canonicalize(artifactBodyOf(a)));
  } catch (err) {
    return [...out, `artifact is not canonical JSON: ${(err as Error).message}`];
  }
  if (recomputed !== a.artifactHash) {
    out.push(`recomputed hash ${recomputed} does not match artifactHash ${a.artifactHash}`);
  }
  if (a.artifactId !== artifactIdFor(a.artifactHash)) {
    out.push(`artifactId ${JSON.stringify(a.artifactId)} is not "art_" + artifactHash`);
  }
  return out;
}

function checkServiceSignature(a: Record<string, unknown>, jwks: unknown): string[] {
  if (!isSha256Hex(a.artifactHash)) return ['no valid artifactHash to check the signature against'];
  return verifyServiceSignature(a.signature, a.artifactHash, jwks);
}

/**
 * Checks a service signature (`{alg: 'Ed25519', keyId, value}` over a hex digest) against a JWKS, as every signed
 * document of this service is checked offline (artifacts, receipts, session statements); answers what is wrong.
 */
export function verifyServiceSignature(sig: unknown, hexDigest: string, jwks: unknown): string[] {
  if (!isRecord(sig) || typeof sig.keyId !== 'string' || typeof sig.value !== 'string') {
    return ['signature must be {alg, keyId, value}'];
  }
  if (sig.alg !== 'Ed25519') return [`signature alg ${JSON.stringify(sig.alg)} is not "Ed25519"`];
  if (!isRecord(jwks) || !Array.isArray(jwks.keys)) return ['JWKS must be an object with a "keys" array'];
  const jwk = jwks.keys.find((k: unknown) => isRecord(k) && k.kid === sig.keyId);
  if (jwk === undefined) return [`no key with kid ${sig.keyId} in the JWKS`];
  let key: KeyObject;
  try {
    key = publicKeyFromRaw(jwkToRaw(jwk));
  } catch (err) {
    return [`JWKS key ${sig.keyId} is unusable: ${(err as Error).message}`];
  }
  if (isRecord(jwk) && jwk.use !== undefined && jwk.use !== 'sig')
    return [`JWKS key ${sig.keyId} is not a signing key`];
  return verifyHexDigest(key, hexDigest, sig.value) ? [] : [`signature does not verify with JWKS key ${sig.keyId}`];
}

function checkEvents(
  a: Record<string, unknown>,
  signatureVerified?: SignatureVerified,
): { eventSignatures: string[]; chain: string[] } {
  const sigs: string[] = [];
  const chain: string[] = [];
  const ev = a.events;
  if (!isRecord(ev) || !Array.isArray(ev.items)) {
    const msg = 'events.items is missing';
    return { eventSignatures: [msg], chain: [msg] };
  }
  if (typeof a.runId !== 'string') sigs.push('runId is missing');

  const keys = new Map<string, KeyObject>();
  if (!Array.isArray(a.agentKeys)) {
    sigs.push('agentKeys is missing');
  } else {
    for (const [i, k] of a.agentKeys.entries()) {
      if (!isRecord(k) || typeof k.keyId !== 'string' || typeof k.publicKey !== 'string') {
        sigs.push(`agentKeys[${i}] must be {keyId, publicKey}`);
        continue;
      }
      try {
        const parsed = parsePublicKey(k.publicKey);
        // The keyId is derived from the key; a mismatch means the listed key is not the key of that id.
        if (parsed.keyId !== k.keyId) sigs.push(`agentKeys[${i}] keyId ${k.keyId} does not match its public key`);
        else keys.set(k.keyId, parsed.keyObject);
      } catch (err) {
        sigs.push(
          `agentKeys[${i}] is not an Ed25519 public key: ${err instanceof KeyFormatError ? err.message : 'unreadable'}`,
        );
      }
    }
  }

  const result = verifyChain(ev.items, keys, typeof a.runId === 'string' ? a.runId : undefined, signatureVerified);
  for (const f of result.failures) {
    const e = ev.items[f.index] as { seq?: unknown } | undefined;
    const where = `event #${f.index} (seq ${String(e?.seq)}${f.eventId ? `, ${f.eventId}` : ''})`;
    (f.check === 'chain' ? chain : sigs).push(`${where}: ${f.reason} ${f.message}`);
  }
  if (ev.count !== ev.items.length) chain.push(`events.count ${String(ev.count)} != ${ev.items.length} items`);
  const head = ev.head;
  if (!isRecord(head) || head.seq !== result.head.seq || head.chainHash !== result.head.chainHash) {
    chain.push(
      `events.head does not match the last event {seq: ${result.head.seq}, chainHash: ${String(result.head.chainHash)}}`,
    );
  }
  return { eventSignatures: sigs, chain };
}

/**
 * Repeat every check offline from the artifact and the service JWKS: the artifact hash (and artifactId), the
 * service signature with the JWKS key whose kid is signature.keyId, every event's payloadHash/chainHash/signature
 * against artifact.agentKeys, and the chain links, count and head. Checks are independent; never throws.
 * `signatureVerified` (the service only, for events it attested at append) skips those events' Ed25519 checks.
 */
export function verifyArtifact(
  artifact: unknown,
  jwks: unknown,
  options: { signatureVerified?: SignatureVerified } = {},
): ArtifactVerification {
  let found: Record<ArtifactCheck, string[]>;
  if (!isRecord(artifact)) {
    const msg = ['artifact is not a JSON object'];
    found = { artifactHash: msg, serviceSignature: msg, eventSignatures: msg, chain: msg };
  } else {
    found = {
      artifactHash: checkHash(artifact),
      serviceSignature: checkServiceSignature(artifact, jwks),
      ...checkEvents(artifact, options.signatureVerified),
    };
  }
  const checks = {} as ArtifactVerification['checks'];
  const failures: string[] = [];
  for (const c of ARTIFACT_CHECKS) {
    checks[c] = found[c].length === 0;
    failures.push(...found[c].map((m) => `${c}: ${m}`));
  }
  const reasons: ArtifactVerification['reasons'] = found;
  if (isRecord(artifact) && artifact.pricing !== undefined) {
    const items = isRecord(artifact.events) && Array.isArray(artifact.events.items) ? artifact.events.items : [];
    reasons.pricing = checkPricedUsage(artifact.pricing, items.filter(isRecord) as unknown as EventEnvelope[]);
    checks.pricing = reasons.pricing.length === 0;
    failures.push(...reasons.pricing.map((m) => `pricing: ${m}`));
  }
  return { verified: failures.length === 0, checks, failures, reasons };
}
