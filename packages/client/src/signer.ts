// Agent keys and signed run events: what the service checks on append (contract section 5), built with the very
// functions the service verifies with, so a caller never handles canonical JSON, hashes or signatures.
import type { KeyObject } from 'node:crypto';
import type { JsonValue } from './canonical-json.ts';
import {
  base64urlEncode,
  generateEd25519KeyPair,
  newId,
  parsePrivateKey,
  privateKeyToPem,
  publicKeyOf,
} from './crypto.ts';
import { EMPTY_HEAD, signEvents, type ChainHead, type EventEnvelope } from './event-chain.ts';

export type { ChainHead, EventEnvelope, JsonValue };

/** An agent's Ed25519 key pair: `publicKey` is what POST /v1/agents takes, `keyId` what events name as signer. */
export interface AgentKeyPair {
  keyId: string;
  /** base64url of the raw 32 public key bytes. */
  publicKey: string;
  privateKey: KeyObject;
}

/** A fresh agent key pair. Keep the private key (exportAgentPrivateKey) to sign that agent's events later. */
export function generateAgentKeyPair(): AgentKeyPair {
  const pair = generateEd25519KeyPair();
  return { keyId: pair.keyId, publicKey: base64urlEncode(pair.raw), privateKey: pair.privateKey };
}

/** PKCS#8 PEM of the private key, to store it (a secret: keep it out of logs and repositories). */
export function exportAgentPrivateKey(pair: AgentKeyPair): string {
  return privateKeyToPem(pair.privateKey);
}

/** The key pair of a stored private key: PKCS#8 PEM or base64url of the 32-byte seed. */
export function agentKeyPairFromPrivateKey(privateKey: string): AgentKeyPair {
  const key = parsePrivateKey(privateKey);
  const pub = publicKeyOf(key);
  return { keyId: pub.keyId, publicKey: base64urlEncode(pub.raw), privateKey: key };
}

/** One event as the agent means it; id, time, sequence, hashes and signature are filled in. */
export interface EventInput {
  /** `metric` ({name, value}), `sample` ({latencyMs?, correct?}) or a free type such as `log` or `tool_call`. */
  type: string;
  payload: JsonValue;
  /** Default: a fresh `evt_…` id. Sending the same id with the same content again is a harmless no-op. */
  id?: string;
  /** Default: now. */
  at?: Date | string;
}

/**
 * Builds one run's chain of signed events. Each sign() continues from the head of the previous one: start it on a
 * new run (empty head) or on the run's current head (GET /v1/runs/{id} `head`) to continue a chain.
 */
export class RunEventSigner {
  #head: ChainHead;

  constructor(
    readonly runId: string,
    private readonly key: Pick<AgentKeyPair, 'keyId' | 'privateKey'>,
    head: ChainHead = EMPTY_HEAD,
  ) {
    this.#head = { seq: head.seq, chainHash: head.chainHash };
  }

  /** The position after the last event signed. */
  get head(): ChainHead {
    return { ...this.#head };
  }

  /** Signs events in order after the current head and moves the head past them. */
  sign(events: readonly EventInput[]): EventEnvelope[] {
    const signed = signEvents(
      events.map((e) => ({
        id: e.id ?? newId('evt'),
        runId: this.runId,
        type: e.type,
        at: e.at instanceof Date ? e.at.toISOString() : (e.at ?? new Date().toISOString()),
        payload: e.payload,
      })),
      this.#head,
      this.key.privateKey,
      this.key.keyId,
    );
    const last = signed.at(-1);
    if (last) this.#head = { seq: last.seq, chainHash: last.chainHash };
    return signed;
  }

  /** Puts the head back (to where the service says the chain is) after signed events were not appended. */
  rewind(head: ChainHead): void {
    this.#head = { seq: head.seq, chainHash: head.chainHash };
  }
}
