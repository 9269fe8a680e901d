// Payment sessions' pure parts: what a charge's receipt and a session's statement commit to, how they are signed
// (canonical JSON, sha256, Ed25519 over the hex digest: the same rules and keys as settlement receipts), and the
// statement's totals with the invariants they must hold.
import { createHash, type KeyObject } from 'node:crypto';
import { canonicalize } from './canonical-json.ts';
import { sha256Hex, signHexDigest } from './crypto.ts';
import { assertMoney } from './money.ts';
import type { PriceSchedule } from './pricing.ts';
import type { WitnessedUsage } from './usage.ts';

export const MAX_SESSION_PAYEES = 20;
export const MAX_SESSION_TTL_SECONDS = 30 * 86_400;
export const DEFAULT_SESSION_TTL_SECONDS = 3_600;

export type SessionStatus = 'open' | 'closing' | 'closed' | 'expired' | 'wound_down' | 'unfunded';

interface Signature {
  alg: 'Ed25519';
  keyId: string;
  value: string;
}

/** What one paid call's receipt commits to: who paid whom how much, for which request, in which session. */
export interface ChargeReceiptBody {
  schema: 'SessionChargeReceipt.v1';
  sessionId: string;
  chargeId: string;
  seq: number;
  paymentId: string;
  payerAgentId: string;
  walletId: string;
  payeeAgentId: string;
  amount: number;
  currency: string;
  requestSha256: string | null;
  chargedAt: string;
  /** A charge priced from witnessed usage only: sha256hex(JCS(the usage record)) and the schedule's hash. */
  usageSha256?: string;
  pricingSha256?: string;
}

export interface SignedChargeReceipt {
  body: ChargeReceiptBody;
  receiptHash: string;
  signature: Signature;
}

/** One line of a statement: a charge as the session recorded it. */
export interface StatementCharge {
  seq: number;
  payeeAgentId: string;
  amount: number;
  paymentId: string;
  requestSha256: string | null;
  chargedAt: string;
  receiptHash: string;
  /** A charge priced from witnessed usage (absent otherwise): the record, the payee's and the payer's signature. */
  usage?: WitnessedUsage;
}

/** An agent key a statement checked usage signatures with (base64url of the raw 32 public key bytes). */
export interface StatementAgentKey {
  agentId: string;
  keyId: string;
  publicKey: string;
}

/**
 * What a closed session's statement commits to. The charges themselves are listed beside it (they can be many):
 * `chargesSha256` is the sha256 of their canonical JSON array, so the list is as signed as the totals.
 */
export interface SessionStatementBody {
  schema: 'SessionStatement.v1';
  sessionId: string;
  payerAgentId: string;
  walletId: string;
  currency: string;
  budget: number;
  maxPerCall: number;
  holdbackBps: number;
  openedAt: string;
  expiresAt: string;
  reason: 'closed' | 'expired' | 'wound_down';
  closedAt: string;
  /** Debits numbered but never charged (a call that crashed before it was recorded, or lost to the close). */
  voided: number;
  chargeCount: number;
  chargesSha256: string;
  totalCharged: number;
  refunded: number;
  /** Per payee (in the session's order) what it was charged, and the settlement that pays it (null: nothing). */
  payees: Array<{ payeeAgentId: string; charged: number; settlementId: string | null }>;
  /**
   * A session priced by use only (absent otherwise): its schedule and the schedule's hash, whether payees are paid
   * for acknowledged usage only, what unacknowledged usage returned to the payer for that reason (0 without the
   * requirement: totalCharged + unacknowledged = the lines' sum), and the agent keys the usage signatures were
   * checked with.
   */
  pricing?: PriceSchedule;
  pricingSha256?: string;
  requireAcknowledgedUsage?: boolean;
  unacknowledged?: number;
  agentKeys?: StatementAgentKey[];
}

export interface SignedStatement {
  body: SessionStatementBody;
  statementHash: string;
  signature: Signature;
}

function sign<T>(body: T, signer: { keyId: string; privateKey: KeyObject }): { hash: string; signature: Signature } {
  const hash = sha256Hex(canonicalize(body));
  return { hash, signature: { alg: 'Ed25519', keyId: signer.keyId, value: signHexDigest(signer.privateKey, hash) } };
}

export function signChargeReceipt(
  body: ChargeReceiptBody,
  signer: { keyId: string; privateKey: KeyObject },
): SignedChargeReceipt {
  const { hash, signature } = sign(body, signer);
  return { body, receiptHash: hash, signature };
}

export function chargesSha256(charges: StatementCharge[]): string {
  return sha256Hex(canonicalize(charges));
}

/**
 * The statement's money from its charges: every charge within the per-call maximum, the total within the budget,
 * refund = budget - total, and each payee's share adding up to the total (a MoneyInvariantError otherwise, before
 * anything moves).
 */
/** The last seq a closed session decided (charged or void): its statement covers seqs 1..this. */
export function statementLastSeq(body: { chargeCount: number; voided: number }): number {
  return body.chargeCount + body.voided;
}

export function statementTotals(
  session: { _id: string; budget: number; maxPerCall: number; payeeAgentIds: string[] },
  charges: StatementCharge[],
): { totalCharged: number; refunded: number; perPayee: Map<string, number> } {
  const perPayee = new Map(session.payeeAgentIds.map((p) => [p, 0]));
  let total = 0;
  for (const c of charges) {
    // Zero is a metered call that cost nothing: listed, paid nothing.
    assertMoney(
      Number.isSafeInteger(c.amount) && c.amount >= 0 && c.amount <= session.maxPerCall,
      `session ${session._id}: charge ${c.seq} of ${c.amount} breaks the per-call maximum`,
    );
    assertMoney(
      perPayee.has(c.payeeAgentId),
      `session ${session._id}: charge ${c.seq} pays ${c.payeeAgentId}, not one of its payees`,
    );
    perPayee.set(c.payeeAgentId, perPayee.get(c.payeeAgentId)! + c.amount);
    total += c.amount;
  }
  assertMoney(
    total <= session.budget,
    `session ${session._id}: charges of ${total} exceed its budget of ${session.budget}`,
  );
  return { totalCharged: total, refunded: session.budget - total, perPayee };
}

/**
 * Seqs per statement chunk: a session's charges are summed up a chunk at a time while it is open (see
 * StatementChunk), so that a close reads a chunk's summary instead of its charges one by one.
 */
export const STATEMENT_CHUNK_SEQS = 256;

/** The chunk that holds a seq (0-based), and the seqs chunk `c` covers. */
export function chunkOf(seq: number): number {
  return Math.floor((seq - 1) / STATEMENT_CHUNK_SEQS);
}

export function chunkSeqs(chunk: number): { from: number; to: number } {
  return { from: chunk * STATEMENT_CHUNK_SEQS + 1, to: (chunk + 1) * STATEMENT_CHUNK_SEQS };
}

/**
 * A run of STATEMENT_CHUNK_SEQS seqs, every one decided (charged or void), as the statement lists them: `lines` is
 * the canonical JSON of each charged line in seq order, joined by commas (a piece of the JSON array chargesSha256 is
 * over), with its counts and sums. Derived from charges that never change, so any two builders make the same one.
 */
export interface StatementChunk {
  lines: string;
  charged: number;
  voided: number;
  /** Per payee, in the session's order, what its charges in the chunk add up to (what is paid to it). */
  perPayee: number[];
  total: number;
  /** Unacknowledged usage a session that requires acknowledgement pays nobody (absent: 0). */
  unacknowledged?: number;
}

/**
 * A statement's charges summed up as they are read, in seq order, a line or a chunk at a time: the sha256 of their
 * canonical JSON array (JCS writes an array as its members' JCS joined by commas, so the hash is taken piece by
 * piece and never needs the whole list), the totals, and each charge checked as statementTotals checks it. With
 * `keepLines` it also keeps the lines' JSON, to make a StatementChunk.
 */
export class StatementAccumulator {
  private readonly hash = createHash('sha256').update('[');
  private readonly pieces: string[] | null;
  private readonly payeeIndex: Map<string, number>;
  chargeCount = 0;
  voided = 0;
  totalCharged = 0;
  readonly perPayee: number[];

  /** With acknowledgement required: what unacknowledged usage lines add up to (paid to nobody, back to the payer). */
  unacknowledged = 0;

  constructor(
    private readonly session: {
      _id: string;
      budget: number;
      maxPerCall: number;
      payeeAgentIds: string[];
      requireAcknowledgedUsage?: boolean;
    },
    keepLines = false,
  ) {
    this.pieces = keepLines ? [] : null;
    this.payeeIndex = new Map(session.payeeAgentIds.map((p, i) => [p, i]));
    this.perPayee = session.payeeAgentIds.map(() => 0);
  }

  addCharge(c: StatementCharge): void {
    const index = this.payeeIndex.get(c.payeeAgentId);
    assertMoney(
      Number.isSafeInteger(c.amount) && c.amount >= 0 && c.amount <= this.session.maxPerCall,
      `session ${this.session._id}: charge ${c.seq} of ${c.amount} breaks the per-call maximum`,
    );
    assertMoney(
      index !== undefined,
      `session ${this.session._id}: charge ${c.seq} pays ${c.payeeAgentId}, not one of its payees`,
    );
    this.append(canonicalize(c as unknown as Parameters<typeof canonicalize>[0]), 1);
    if (!linePays(this.session, c)) {
      this.unacknowledged += c.amount;
      return;
    }
    this.perPayee[index!]! += c.amount;
    this.totalCharged += c.amount;
  }

  addVoid(): void {
    this.voided++;
  }

  /** A chunk summed up before: its sums are checked against each other and the per-call maximum. */
  addChunk(chunk: StatementChunk): void {
    assertMoney(
      chunk.charged + chunk.voided === STATEMENT_CHUNK_SEQS &&
        chunk.perPayee.length === this.perPayee.length &&
        chunk.perPayee.every((x) => Number.isSafeInteger(x) && x >= 0) &&
        chunk.perPayee.reduce((a, b) => a + b, 0) === chunk.total &&
        chunk.total + (chunk.unacknowledged ?? 0) <= chunk.charged * this.session.maxPerCall &&
        (chunk.charged === 0) === (chunk.lines === ''),
      `session ${this.session._id}: a statement chunk does not add up`,
    );
    if (chunk.charged > 0) this.append(chunk.lines, chunk.charged);
    this.voided += chunk.voided;
    chunk.perPayee.forEach((x, i) => (this.perPayee[i]! += x));
    this.totalCharged += chunk.total;
    this.unacknowledged += chunk.unacknowledged ?? 0;
  }

  private append(json: string, lines: number): void {
    this.hash.update(this.chargeCount === 0 ? json : `,${json}`);
    this.pieces?.push(json);
    this.chargeCount += lines;
  }

  /** What a chunk of these lines says (made with keepLines). */
  chunk(): StatementChunk {
    return {
      lines: (this.pieces ?? []).join(','),
      charged: this.chargeCount,
      voided: this.voided,
      perPayee: [...this.perPayee],
      total: this.totalCharged,
      ...(this.unacknowledged > 0 ? { unacknowledged: this.unacknowledged } : {}),
    };
  }

  /** The statement's sums, once every seq is in: total within the budget, refund = budget - total. */
  finish(): {
    chargesSha256: string;
    chargeCount: number;
    voided: number;
    totalCharged: number;
    unacknowledged: number;
    refunded: number;
    perPayee: Map<string, number>;
  } {
    assertMoney(
      this.totalCharged <= this.session.budget,
      `session ${this.session._id}: charges of ${this.totalCharged} exceed its budget of ${this.session.budget}`,
    );
    return {
      chargesSha256: this.hash.update(']').digest('hex'),
      chargeCount: this.chargeCount,
      voided: this.voided,
      totalCharged: this.totalCharged,
      unacknowledged: this.unacknowledged,
      refunded: this.session.budget - this.totalCharged,
      perPayee: new Map(this.session.payeeAgentIds.map((p, i) => [p, this.perPayee[i]!])),
    };
  }
}

/**
 * Whether a statement line is paid to its payee: always, unless the session requires acknowledged usage and the line
 * is usage its payer never acknowledged (that amount goes back to the payer at the close).
 */
export function linePays(session: { requireAcknowledgedUsage?: boolean }, line: StatementCharge): boolean {
  return !(session.requireAcknowledgedUsage === true && line.usage !== undefined && line.usage.payerSignature === null);
}

/** The lines of a chunk as objects (its JSON pieces are an array's members). */
export function chunkLines(chunk: { lines: string }): StatementCharge[] {
  return chunk.lines === '' ? [] : (JSON.parse(`[${chunk.lines}]`) as StatementCharge[]);
}

/**
 * Buckets of a closed session's payment index (payment id -> seq, in MongoDB): about 256 payment ids a bucket, so a
 * retried call after the close finds its charge with two reads by `_id`, whatever the session's size.
 */
export function paymentBuckets(chargeCount: number): number {
  return Math.ceil(chargeCount / 256);
}

export function paymentBucketOf(paymentId: string, buckets: number): number {
  return createHash('sha256').update(paymentId).digest().readUInt32BE(0) % buckets;
}

export function signStatement(
  body: SessionStatementBody,
  signer: { keyId: string; privateKey: KeyObject },
): SignedStatement {
  const { hash, signature } = sign(body, signer);
  return { body, statementHash: hash, signature };
}

// The statement's offline check is the client package's (the CLI and any holder of a statement run it).
export {
  STATEMENT_CHECKS,
  verifyStatement,
  type StatementCheck,
  type StatementVerification,
} from 'agent-settlement-client/statement';
