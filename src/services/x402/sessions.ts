// x402 payment sessions: a payer (or its sponsor wallet, under its policy) reserves a budget once toward one payee or
// an allow-list of payees; each paid call is then one request that debits the budget and answers a signed receipt;
// the close (the payer's, the expiry sweeper's, or a wind-down's) settles what was charged and returns the rest.
// See store/x402-sessions.ts for where each fact lives and why a crash anywhere ends in one outcome.
//
// Money: the budget is one reserve (`x402ses:<id>:lock`). Its fate is the session's close record (first insert
// wins). The close returns budget - charged by `x402ses:<id>:refund` and pays each payee through a settlement of its
// own (`sst_<id>_<payee index>`), which holds back and can be disputed like any settlement.
import { idFromIdempotency, newId } from '../../domain/crypto.ts';
import { errors, ServiceError, serviceError, x402Error } from '../../domain/errors.ts';
import { failpoint } from '../../domain/failpoints.ts';
import { logStep } from '../work-log.ts';
import { receiptMoney, signReceipt } from '../../domain/receipt.ts';
import { decideSettlement } from '../../domain/settlement.ts';
import { evaluateStaticPolicy } from '../../domain/x402.ts';
import { pricingProblems, parsePriceSchedule, pricingSha256, type PriceSchedule } from '../../domain/pricing.ts';
import {
  priceUsageRecord,
  usageDigest,
  usageProblem,
  usageSignatureValid,
  type UsageRecord,
  type UsageSignature,
  type WitnessedUsage,
} from '../../domain/usage.ts';
import {
  chunkLines,
  chunkSeqs,
  DEFAULT_SESSION_TTL_SECONDS,
  paymentBucketOf,
  paymentBuckets,
  signChargeReceipt,
  signStatement,
  linePays,
  STATEMENT_CHUNK_SEQS,
  StatementAccumulator,
  statementLastSeq,
  type SessionStatus,
  type SignedChargeReceipt,
  type StatementAgentKey,
  type StatementCharge,
  type StatementChunk,
} from '../../domain/x402-sessions.ts';
import type { Runtime } from '../../runtime.ts';
import { bucketMove, isInsufficientFunds, type NewLedgerEntry } from '../../store/ledger.ts';
import {
  chargeId,
  type BudgetState,
  type ChargeDoc,
  type CloseDoc,
  type CloseReason,
  type Debit,
  type DebitResult,
  type HoldBinding,
  type SessionDoc,
  type UsageAckDoc,
} from '../../store/x402-sessions.ts';
import { disputeSettlement } from '../disputes.ts';
import { emitEvent } from '../events.ts';
import { advanceSettlement } from '../settlement.ts';
import { sweepDue } from '../sweep-items.ts';
import { woundDownError, type X402Gates } from './gates.ts';
import type { X402WalletPolicies } from './wallet-policies.ts';

export const sessionEntryIds = {
  lock: (sessionId: string) => `x402ses:${sessionId}:lock`,
  refund: (sessionId: string) => `x402ses:${sessionId}:refund`,
};

/** The settlement that pays a session's payee: derived from the session and the payee's place in its list. */
export function sessionSettlementId(sessionId: string, payeeIndex: number): string {
  return `sst_${sessionId.slice('ses_'.length)}_${payeeIndex}`;
}

/** The session a session settlement pays for (null for any other settlement id). */
export function sessionOfSettlement(settlementId: string): string | null {
  const m = /^sst_(.+)_\d+$/.exec(settlementId);
  return m ? `ses_${m[1]}` : null;
}

/** A session's lock or refund entry id -> its session id (null for any other entry). */
export function sessionOfEntry(entryId: string): string | null {
  const m = /^x402ses:(.+):(lock|refund)$/.exec(entryId);
  return m && sessionEntryIds[m[2] as 'lock' | 'refund'](m[1]!) === entryId ? m[1]! : null;
}

export interface OpenSessionInput {
  payerAgentId: string;
  payeeAgentIds: string[];
  currency: string;
  budget: number;
  maxPerCall: number;
  ttlSeconds?: number;
  holdbackBps?: number;
  disputeWindowSeconds?: number;
  sponsorWalletId?: string;
  /** A price schedule: charges may then carry witnessed usage instead of an amount. */
  pricing?: unknown;
  requireAcknowledgedUsage?: boolean;
}

/** A payee's signed usage record, and the payer's signature when it came with the charge. */
export interface UsageInput {
  record: unknown;
  payeeSignature: unknown;
  payerSignature?: unknown;
}

/** A charge as a caller asks for it: an amount, or usage the session prices. */
export interface ChargeRequest {
  paymentId: string;
  payeeAgentId: string;
  amount?: number;
  usage?: UsageInput;
  requestSha256?: string;
  /** The asset the payment was made in, where the caller names one (the facilitator): the session's currency or refused. */
  asset?: string;
}

/** A charge with its amount: named by the caller, or the priced usage (checked and signed). */
export interface ChargeInput {
  paymentId: string;
  payeeAgentId: string;
  amount: number;
  requestSha256?: string;
  asset?: string;
  usage?: WitnessedUsage;
}

/** What an acknowledgement answers: the charge's seq, and whether the payer's acknowledgement counts. */
export interface AckAnswer {
  paymentId: string;
  seq: number;
  acknowledged: true;
}

export interface HoldInput {
  paymentId: string;
  payeeAgentId: string;
  maxAmount: number;
  requestSha256?: string;
  asset?: string;
}

export interface SessionState {
  session: SessionDoc;
  status: SessionStatus;
  spent: number;
  charges: number;
  close: CloseDoc | null;
}

export interface ChargeAnswer {
  charge: ChargeDoc;
  receipt: SignedChargeReceipt;
  /** The budget left after this debit (for a repeat: now). */
  remaining: number;
  repeated: boolean;
}

/** A session's lock recorded this long ago without being applied never will be (its open died before it). */
const LOCK_GRACE_MS = 60_000;
/** The time a sweep spends on due sessions at most. */
const SWEEP_TIME_MS = 20_000;
/**
 * Seqs voided past a closed session's statement (see fence): more than the calls that can be in flight on one session
 * at the moment a Redis that lost the close's stop starts answering.
 */
const CLOSE_FENCE = 64;
/** What a call on an ended session is refused with: a retry of a call its statement paid gets its receipt instead. */
const ENDED_CODES = new Set(['X402_SESSION_CLOSED', 'X402_SESSION_EXPIRED', 'X402_AGENT_WOUND_DOWN']);
/** Debits one call may make when each finds its seq taken by a recorded charge (Redis lost writes; repaired between). */
const DEBIT_ATTEMPTS = 3;
/**
 * Charges read at once by the work a close or a chunk's summing-up does beside the calls (a few, so that it never
 * queues the calls' own reads and inserts behind a burst of its own), and chunks a close reads at once.
 */
const BACKGROUND_READS = 8;
const CHUNK_READS = 4;
/**
 * A chunk is summed up once the seqs handed out have passed its end by another chunk: by then the calls that took its
 * seqs have answered (or died, and the close decides them).
 */
const CHUNK_LAG = 1;

function sameTerms(a: SessionDoc, b: SessionDoc): boolean {
  const terms = (s: SessionDoc) =>
    JSON.stringify([
      s.tenantId,
      s.payerAgentId,
      s.payeeAgentIds,
      s.walletId,
      s.sponsorWalletId,
      s.currency,
      s.budget,
      s.maxPerCall,
      s.holdbackBps,
      s.disputeWindowSeconds,
      s.pricingSha256 ?? null,
      s.requireAcknowledgedUsage ?? false,
    ]);
  return terms(a) === terms(b);
}

/**
 * A recorded charge as its statement lists it (what the statement's chargesSha256 commits to). A usage line carries
 * its record and signatures: the payer's from the charge, else from the acknowledgement decided for it (`ack`).
 */
function statementLine(c: ChargeDoc, ack: UsageAckDoc | null = null): StatementCharge {
  const line: StatementCharge = {
    seq: c.seq,
    payeeAgentId: c.payeeAgentId!,
    amount: c.amount,
    paymentId: c.paymentId!,
    requestSha256: c.requestSha256,
    chargedAt: c.at.toISOString(),
    receiptHash: c.receipt!.receiptHash,
  };
  if (c.usage)
    line.usage = {
      record: c.usage.record,
      payeeSignature: c.usage.payeeSignature,
      payerSignature: c.usage.payerSignature ?? ack?.payerSignature ?? null,
    };
  return line;
}

/** Whether a charge's usage still waits for the payer's acknowledgement (decided at the latest by the close). */
function awaitsAck(c: ChargeDoc | null): c is ChargeDoc & { usage: WitnessedUsage } {
  return c?.state === 'charged' && !!c.usage && c.usage.payerSignature === null;
}

/**
 * Whether a recorded charge is this call (its payee, amount, request and usage record), as a repeat of its payment id
 * must be.
 */
function sameCall(charge: ChargeDoc, input: ChargeInput): boolean {
  return (
    charge.payeeAgentId === input.payeeAgentId &&
    charge.amount === input.amount &&
    charge.requestSha256 === (input.requestSha256 ?? null) &&
    (charge.usage ? usageDigest(charge.usage.record) : null) === (input.usage ? usageDigest(input.usage.record) : null)
  );
}

/**
 * A checked signature as it is stored and listed: its three fields only (a facilitator's payload may carry more, and
 * the statement's lines must hash as they are served).
 */
function signatureOf(checked: unknown): UsageSignature {
  const { keyId, value } = checked as UsageSignature;
  return { alg: 'Ed25519', keyId, value };
}

/** An agent's keys (active, or all of them: a statement names the key a usage was checked with even once revoked). */
function agentKeys(
  agent: { keys: Record<string, { keyId: string; publicKey: string; status: string }> } | null,
  all = false,
) {
  return new Map(
    Object.values(agent?.keys ?? {})
      .filter((k) => all || k.status === 'active')
      .map((k) => [k.keyId, k.publicKey]),
  );
}

function statusOfClose(close: CloseDoc): SessionStatus {
  return close.reason === 'closed' ? 'closed' : close.reason;
}

/**
 * The agent keys a statement's usage signatures were made with: noted line by line as the close reads them, then
 * listed with their public keys (revoked ones too: a key is named as it was when it signed), in a fixed order.
 */
class Signers {
  private readonly seen = new Map<string, Set<string>>();

  constructor(private readonly session: SessionDoc) {}

  note(line: StatementCharge): void {
    if (!line.usage) return;
    this.add(line.payeeAgentId, line.usage.payeeSignature.keyId);
    if (line.usage.payerSignature) this.add(this.session.payerAgentId, line.usage.payerSignature.keyId);
  }

  private add(agentId: string, keyId: string): void {
    let keys = this.seen.get(agentId);
    if (!keys) this.seen.set(agentId, (keys = new Set()));
    keys.add(keyId);
  }

  async keys(runtime: Runtime): Promise<StatementAgentKey[]> {
    const agentIds = [...this.seen.keys()].sort();
    const agents = await Promise.all(agentIds.map((id) => runtime.stores.agents.getAny(id)));
    return agentIds.flatMap((agentId, i) => {
      const known = agentKeys(agents[i] ?? null, true);
      return [...this.seen.get(agentId)!].sort().map((keyId) => {
        const publicKey = known.get(keyId);
        if (publicKey === undefined) throw new Error(`agent ${agentId} has no key ${keyId}, which signed usage`);
        return { agentId, keyId, publicKey };
      });
    });
  }
}

export class X402Sessions {
  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
    private readonly policies: X402WalletPolicies,
  ) {}

  private get store() {
    return this.runtime.stores.x402Sessions;
  }

  /**
   * Opens a session and reserves its budget in one ledger move. With an Idempotency-Key the session id derives from
   * it, so a retry after a crash resumes that session and its one reserve; other terms under the same key are 422.
   */
  async open(tenantId: string, input: OpenSessionInput, idempotencyScope: string | null): Promise<SessionState> {
    const payees = input.payeeAgentIds;
    if (new Set(payees).size !== payees.length)
      throw errors.unprocessable('payeeAgentIds lists a payee twice', {
        errors: [{ path: 'body.payeeAgentIds', message: 'duplicate payee' }],
      });
    if (payees.includes(input.payerAgentId))
      throw errors.unprocessable('the payer cannot be its own payee', {
        errors: [{ path: 'body.payeeAgentIds', message: 'contains payerAgentId' }],
      });
    if (input.maxPerCall > input.budget)
      throw errors.unprocessable('maxPerCall exceeds the budget', {
        errors: [{ path: 'body.maxPerCall', message: 'greater than budget' }],
      });
    let pricing: PriceSchedule | null = null;
    if (input.pricing !== undefined) {
      const problems = pricingProblems(input.pricing);
      if (problems.length > 0)
        throw errors.unprocessable('the price schedule is invalid', {
          errors: problems.map((p) => ({ path: `body.${p.split(':')[0]}`, message: p.slice(p.indexOf(':') + 2) })),
        });
      pricing = parsePriceSchedule(input.pricing);
    }
    if (input.requireAcknowledgedUsage && !pricing)
      throw errors.unprocessable('requireAcknowledgedUsage needs a price schedule', {
        errors: [{ path: 'body.requireAcknowledgedUsage', message: 'without pricing' }],
      });
    const now = new Date();
    const fresh: SessionDoc = {
      _id: idempotencyScope ? idFromIdempotency('ses', idempotencyScope) : newId('ses'),
      tenantId,
      payerAgentId: input.payerAgentId,
      payeeAgentIds: payees,
      walletId: input.sponsorWalletId ?? input.payerAgentId,
      sponsorWalletId: input.sponsorWalletId ?? null,
      currency: input.currency,
      budget: input.budget,
      maxPerCall: input.maxPerCall,
      holdbackBps: input.holdbackBps ?? 0,
      disputeWindowSeconds: input.disputeWindowSeconds ?? 86_400,
      expiresAt: new Date(now.getTime() + (input.ttlSeconds ?? DEFAULT_SESSION_TTL_SECONDS) * 1000),
      createdAt: now,
      // Only a priced session carries these: an unpriced one is stored (and its statement signed) as before.
      ...(pricing
        ? {
            pricing,
            pricingSha256: pricingSha256(pricing),
            requireAcknowledgedUsage: input.requireAcknowledgedUsage ?? false,
          }
        : {}),
    };
    await this.gates.requireLiveAgents(tenantId, [input.payerAgentId, ...payees]);
    if (input.sponsorWalletId) await this.sponsorAllows(tenantId, fresh);
    else await this.gates.ensureAgentWallet(input.payerAgentId, tenantId);

    // The session, its due record (its expiry: the sweeper returns the budget then, whatever happens next) and its
    // place in every party's index (a wind-down finds it there) go first, before any money moves.
    const [recorded] = await Promise.all([
      this.store.record(fresh),
      this.store.due.mark(fresh._id, tenantId, fresh.expiresAt),
      ...[input.payerAgentId, ...payees].map((agentId) =>
        this.runtime.stores.x402.agentGates.append(agentId, () => ({ ref: fresh._id })),
      ),
    ]);
    const session = recorded.session;
    if (!recorded.created) {
      if (!sameTerms(session, fresh))
        throw serviceError('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key opened a session with other terms', {
          sessionId: session._id,
        });
      await this.store.due.mark(session._id, tenantId, session.expiresAt); // its own expiry, not this retry's
      const close = await this.store.closeOf(session._id);
      if (close) return this.resumedOpenAnswer(session, close);
    }
    failpoint('x402.session.recorded');
    await this.fund(session, recorded.created);
    failpoint('x402.session.locked');
    await this.openBudget(session);
    this.store.remember(session);
    logStep(this.runtime, 'x402.session.opened', {
      tenantId,
      sessionId: session._id,
      payerAgentId: session.payerAgentId,
      walletId: session.walletId,
      budget: session.budget,
      currency: session.currency,
      repeat: !recorded.created,
    });
    await emitEvent(
      this.runtime,
      tenantId,
      'x402.session.opened',
      this.eventData(session),
      `x402.session.opened:${session._id}`,
    );
    return this.state(session);
  }

  /** A sponsor wallet pays for a session only if its policy allows every payee at the per-call maximum and the budget today. */
  private async sponsorAllows(tenantId: string, session: SessionDoc): Promise<void> {
    const walletId = session.sponsorWalletId!;
    const [wallet, version] = await Promise.all([
      this.gates.knownWallet(walletId),
      this.policies.policyInForce(walletId),
    ]);
    if (!wallet || wallet.tenantId !== tenantId) throw errors.notFound('sponsor wallet');
    const violation = (breach: { rule: string; message: string }) =>
      x402Error('X402_WALLET_POLICY_VIOLATION', breach.message, { walletId, ...breach });
    if (!version)
      throw violation({ rule: 'policy', message: 'the wallet has no policy; sponsor wallets refuse until one is set' });
    for (const payeeAgentId of session.payeeAgentIds) {
      const breach = evaluateStaticPolicy(version.policy, {
        amount: session.maxPerCall,
        currency: session.currency,
        payeeAgentId,
        toolId: null,
      });
      if (breach) throw violation(breach);
    }
    // The whole budget counts against today's limit, once per session (a resumed open is not counted again).
    const breach = await this.policies.spendDaily(
      walletId,
      version.policy,
      `session#${session._id}`,
      session.budget,
      session.createdAt,
      true,
    );
    if (breach) throw violation(breach);
  }

  private lockEntry(session: SessionDoc): NewLedgerEntry {
    return {
      _id: sessionEntryIds.lock(session._id),
      tenantId: session.tenantId,
      kind: 'x402_session_lock',
      currency: session.currency,
      legs: bucketMove(session.walletId, 'available', 'escrow', session.budget),
      ref: { sessionId: session._id },
    };
  }

  /** Reserves the budget (a resumed open finishes the first attempt's lock); a wind-down that raced it closes the session. */
  private async fund(session: SessionDoc, fresh: boolean): Promise<void> {
    let raced: Promise<string | null> = Promise.resolve(null);
    try {
      await this.runtime.stores.ledger.apply(this.lockEntry(session), {
        expectNew: fresh,
        onRecorded: () => {
          // Read once the lock is recorded: a wind-down recorded later walks the agent's index and meets this session.
          raced = this.gates.anyWoundDown([session.payerAgentId, ...session.payeeAgentIds]);
          raced.catch(() => undefined);
        },
      });
    } catch (err) {
      await raced.catch(() => null);
      if (isInsufficientFunds(err)) await this.store.removeRefused(session._id);
      throw err;
    }
    const woundDown = await raced;
    if (woundDown) {
      await this.closeSession(session, 'wound_down', woundDown);
      throw woundDownError(woundDown);
    }
  }

  /** A funded session's budget in Redis as it starts: nothing spent, no seq handed out. */
  private async openBudget(session: SessionDoc): Promise<void> {
    await this.store.initBudget(session._id, {
      state: 'open',
      budget: session.budget,
      spent: 0,
      seq: 0,
      expiresAt: session.expiresAt,
    });
  }

  private async resumedOpenAnswer(session: SessionDoc, close: CloseDoc): Promise<SessionState> {
    await this.finishClose(session, close);
    if (close.reason === 'wound_down') throw woundDownError(close.woundDownAgentId ?? session.payerAgentId);
    return this.state(session);
  }

  async requireSession(tenantId: string, sessionId: string): Promise<SessionDoc> {
    const session = await this.store.get(sessionId);
    if (!session || session.tenantId !== tenantId) throw errors.notFound('session');
    return session;
  }

  /**
   * One paid call: checks the call against the session's terms, debits the budget (the one ordering point, so
   * parallel calls never overspend) and records the charge; answers its signed receipt. The same payment id again
   * answers the first charge, whatever happened to the first request.
   */
  async charge(tenantId: string, sessionId: string, request: ChargeRequest): Promise<ChargeAnswer> {
    const input = await this.priced(await this.requireSession(tenantId, sessionId), request);
    return this.chargePriced(tenantId, sessionId, input);
  }

  /**
   * A charge request with its amount: a plain amount as asked (refused on a session that pays acknowledged usage
   * only), or witnessed usage checked (shape, record against the call, the payee's and any payer's signature by
   * their agents' active keys) and priced with the session's schedule, within the cap and the per-call maximum.
   */
  private async priced(session: SessionDoc, request: ChargeRequest): Promise<ChargeInput> {
    const { usage, ...rest } = request;
    if (usage === undefined) {
      if (request.amount === undefined)
        throw errors.unprocessable('a charge needs an amount or usage', {
          errors: [{ path: 'body.amount', message: 'required without usage' }],
        });
      if (session.requireAcknowledgedUsage)
        throw x402Error('X402_USAGE_REQUIRED', 'this session pays witnessed usage only: send usage, not an amount');
      return { ...rest, amount: request.amount };
    }
    if (request.amount !== undefined)
      throw x402Error('X402_USAGE_AND_AMOUNT', 'a charge carries an amount or usage, not both');
    const schedule = session.pricing;
    if (!schedule) throw x402Error('X402_USAGE_NOT_PRICED', 'the session has no price schedule to price usage with');
    const problem = usageProblem(usage.record, schedule);
    if (problem) {
      const code =
        problem.kind === 'metric'
          ? 'X402_USAGE_METRIC_UNKNOWN'
          : problem.kind === 'count'
            ? 'X402_USAGE_COUNT_INVALID'
            : 'X402_USAGE_RECORD_INVALID';
      throw x402Error(code, problem.message);
    }
    const record = usage.record as UsageRecord;
    const mismatch = (field: string, expected: string) =>
      x402Error('X402_USAGE_RECORD_MISMATCH', `the usage record's ${field} is not the charge's`, {
        field,
        expected,
        got: record[field as keyof UsageRecord],
      });
    if (record.sessionId !== session._id) throw mismatch('sessionId', session._id);
    if (record.paymentId !== request.paymentId) throw mismatch('paymentId', request.paymentId);
    if (record.payeeAgentId !== request.payeeAgentId) throw mismatch('payeeAgentId', request.payeeAgentId);
    if (request.requestSha256 !== undefined && record.requestSha256 !== request.requestSha256)
      throw mismatch('requestSha256', request.requestSha256);
    const agents = this.runtime.stores.agents;
    const [payee, payer] = await Promise.all([
      this.runtime.credentials.agent(agents, request.payeeAgentId),
      usage.payerSignature === undefined || usage.payerSignature === null
        ? null
        : this.runtime.credentials.agent(agents, session.payerAgentId),
    ]);
    if (!usageSignatureValid(record, usage.payeeSignature, agentKeys(payee)))
      throw x402Error(
        'X402_USAGE_PAYEE_SIGNATURE_INVALID',
        `the usage record is not signed by an active key of the payee ${request.payeeAgentId}`,
      );
    const acknowledged = usage.payerSignature !== undefined && usage.payerSignature !== null;
    if (acknowledged && !usageSignatureValid(record, usage.payerSignature, agentKeys(payer)))
      throw x402Error(
        'X402_USAGE_PAYER_SIGNATURE_INVALID',
        `the usage record is not signed by an active key of the payer ${session.payerAgentId}`,
      );
    const { amount, aboveCap } = priceUsageRecord(schedule, record);
    if (aboveCap)
      throw x402Error('X402_USAGE_ABOVE_CAP', `the usage prices at ${amount}, above the schedule's cap`, {
        amount,
        cap: schedule.cap,
      });
    if (amount > session.maxPerCall)
      throw x402Error(
        'X402_USAGE_ABOVE_LIMIT',
        `the usage prices at ${amount}, above the session's per-call maximum of ${session.maxPerCall}`,
        { amount, maxPerCall: session.maxPerCall },
      );
    return {
      ...rest,
      amount,
      requestSha256: record.requestSha256,
      usage: {
        record,
        payeeSignature: signatureOf(usage.payeeSignature),
        payerSignature: acknowledged ? signatureOf(usage.payerSignature) : null,
      },
    };
  }

  private async chargePriced(tenantId: string, sessionId: string, input: ChargeInput): Promise<ChargeAnswer> {
    try {
      return await this.chargeOpen(tenantId, sessionId, input);
    } catch (err) {
      // A retry of a call the statement paid answers its receipt, whatever Redis still remembers of the payment.
      if (err instanceof ServiceError && ENDED_CODES.has(err.code)) {
        const paid = await this.receiptedAtClose(sessionId, input);
        if (paid) return paid;
      }
      throw err;
    }
  }

  /**
   * The charge of this payment id that a closed session's statement lists (read among its charges by `_id`: only when
   * a call meets an ended session), answered as a repeat; another call under that id is refused as a reuse.
   */
  private async receiptedAtClose(sessionId: string, input: ChargeInput): Promise<ChargeAnswer | null> {
    const [session, close] = await Promise.all([this.store.get(sessionId), this.store.closeOf(sessionId)]);
    if (!session || !close) return null;
    const charge = await this.statementCharge(session, close, input.paymentId);
    if (!charge || charge === 'refused') return null;
    if (!sameCall(charge, input)) throw this.reusedError(input.paymentId);
    return this.answerOf(session, charge, null);
  }

  /**
   * The charge of a payment id among those a closed session's statement pays (null when it pays none), or `refused`
   * when the budget had seen the payment id and the close voided it: looked up in the session's payment index (two
   * reads by `_id`); while the close has not written it yet, among the statement's charges.
   */
  private async statementCharge(
    session: SessionDoc,
    close: CloseDoc,
    paymentId: string,
  ): Promise<ChargeDoc | 'refused' | null> {
    const buckets = paymentBuckets(close.statement.body.chargeCount + close.statement.body.voided);
    if (buckets === 0) return null;
    const bucket = await this.store.getPaymentBucket(session._id, paymentBucketOf(paymentId, buckets));
    if (bucket?.refused.includes(paymentId)) return 'refused';
    const seq = bucket
      ? bucket.seqs[bucket.paymentIds.indexOf(paymentId)]
      : (await this.statementLines(session, close)).find((line) => line.paymentId === paymentId)?.seq;
    if (seq === undefined) return null;
    const charge = await this.store.getCharge(session._id, seq);
    return charge?.state === 'charged' && charge.paymentId === paymentId ? charge : null;
  }

  private async chargeOpen(tenantId: string, sessionId: string, input: ChargeInput): Promise<ChargeAnswer> {
    const session = await this.checkCall(tenantId, sessionId, input.payeeAgentId, input.amount, input.asset);
    for (let attempt = 1; ; attempt++) {
      const now = new Date();
      const debit = await this.debit(session, input.paymentId, input.amount, 'charge', now);
      failpoint('x402.session.debited');
      // A hold under this payment id (a facilitator verify) is captured by it instead.
      if (debit.kind === 'repeat' && debit.mode === 'hold') return this.capturePriced(tenantId, sessionId, input);
      if (debit.kind === 'repeat' && debit.amount !== input.amount) throw this.reusedError(input.paymentId);
      const answer = await this.recordCharge(session, debit, input, now);
      if (answer !== 'seq taken') return answer;
      await this.afterSeqTaken(session, debit.seq, attempt);
    }
  }

  /**
   * A facilitator's verify: holds up to `maxAmount` of the budget under the payment id before the call is served,
   * so that a verified call can always be paid; its settle captures what the call cost (capture). A hold nobody
   * captures is voided at the close and costs the payer nothing. Answers what is left of the budget.
   */
  async hold(
    tenantId: string,
    sessionId: string,
    input: HoldInput,
  ): Promise<{ session: SessionDoc; remaining: number }> {
    const session = await this.checkCall(tenantId, sessionId, input.payeeAgentId, input.maxAmount, input.asset);
    const binding = this.bindingOf(session, input);
    let debit = await this.debit(session, input.paymentId, input.maxAmount, 'hold', new Date(), binding);
    // A verified call must be payable: a hold whose seq a recorded charge or void already holds was numbered by a
    // Redis that lost writes (or the close's stop). Put right (or refused as closed) before the verify answers.
    for (let attempt = 1; debit.kind === 'new'; attempt++) {
      const taken = await this.store.getCharge(session._id, debit.seq);
      if (!taken) break;
      if (taken.state === 'void') throw await this.closedError(session, true);
      await this.afterSeqTaken(session, debit.seq, attempt);
      debit = await this.debit(session, input.paymentId, input.maxAmount, 'hold', new Date(), binding);
    }
    if (debit.kind === 'repeat' && debit.mode === 'charge')
      throw x402Error('X402_SESSION_PAYMENT_REUSED', `payment ${input.paymentId} was already settled`, {
        paymentId: input.paymentId,
      });
    if (debit.kind === 'repeat' && debit.amount !== input.maxAmount) throw this.reusedError(input.paymentId);
    if (debit.kind === 'repeat' && debit.binding) this.requireBinding(session, debit.binding, binding);
    return { session, remaining: debit.kind === 'new' ? debit.remaining : await this.remaining(session) };
  }

  /** What a hold is bound to: the payee it was verified for and the request it pays. */
  private bindingOf(session: SessionDoc, input: { payeeAgentId: string; requestSha256?: string }): HoldBinding {
    return {
      payeeIndex: session.payeeAgentIds.indexOf(input.payeeAgentId),
      requestSha256: input.requestSha256 ?? null,
    };
  }

  /** Refuses a settle or charge of a hold that names another payee or request than its verify did. */
  private requireBinding(session: SessionDoc, held: HoldBinding, asked: HoldBinding): void {
    if (held.payeeIndex !== asked.payeeIndex) {
      const heldFor = session.payeeAgentIds[held.payeeIndex] ?? null;
      throw x402Error('X402_PAYEE_MISMATCH', `this payment was verified for payee ${heldFor}`, {
        heldFor,
        payeeAgentId: session.payeeAgentIds[asked.payeeIndex] ?? null,
      });
    }
    if (held.requestSha256 !== asked.requestSha256) {
      throw x402Error('X402_REQUEST_BINDING_MISMATCH', 'this payment was verified for another request', {
        requestSha256: held.requestSha256,
      });
    }
  }

  /**
   * A facilitator's settle: charges what the call cost, at most what its verify held (zero is allowed); the rest of
   * the hold goes back to the budget at once. Without a hold (a settle nobody verified) it is a plain charge.
   */
  async capture(tenantId: string, sessionId: string, request: ChargeRequest): Promise<ChargeAnswer> {
    const input = await this.priced(await this.requireSession(tenantId, sessionId), request);
    return this.capturePriced(tenantId, sessionId, input);
  }

  private async capturePriced(tenantId: string, sessionId: string, input: ChargeInput): Promise<ChargeAnswer> {
    const session = await this.checkCall(tenantId, sessionId, input.payeeAgentId, input.amount, input.asset);
    const binding = this.bindingOf(session, input);
    for (let attempt = 1; ; attempt++) {
      const captured = await this.store.capture(session._id, input.paymentId, input.amount, binding);
      // No hold under this payment id (a settle nobody verified, or a hold a Redis that lost writes forgot): a plain
      // charge. Zero included: a verified call that cost nothing settles, whatever Redis remembers of its hold.
      if (captured.kind === 'unknown') return this.chargePriced(tenantId, sessionId, input);
      if (captured.kind === 'mismatch') {
        if (input.usage && captured.binding!.requestSha256 !== binding.requestSha256)
          throw x402Error('X402_USAGE_RECORD_MISMATCH', "the usage record's requestSha256 is not the one verified", {
            field: 'requestSha256',
            expected: captured.binding!.requestSha256,
            got: binding.requestSha256,
          });
        this.requireBinding(session, captured.binding!, binding);
        throw new Error(
          `session ${session._id}: the capture script refused payment ${input.paymentId} with a binding that matches`,
        );
      }
      if (captured.kind === 'over') {
        if (input.usage)
          throw x402Error(
            'X402_USAGE_ABOVE_LIMIT',
            `the usage prices at ${input.amount}, above the ${captured.amount} verify held for this payment`,
            { held: captured.amount, amount: input.amount },
          );
        throw x402Error(
          'X402_SESSION_LIMIT_EXCEEDED',
          `${input.amount} exceeds the ${captured.amount} verify held for this payment`,
          { held: captured.amount, amount: input.amount },
        );
      }
      if (captured.kind === 'repeat' && captured.amount !== input.amount) throw this.reusedError(input.paymentId);
      failpoint('x402.session.captured');
      const answer = await this.recordCharge(session, { ...captured, kind: 'repeat' }, input, new Date());
      if (answer !== 'seq taken') return answer;
      await this.afterSeqTaken(session, captured.seq, attempt);
    }
  }

  /** The session, if this call may be charged to it: a listed payee, within the per-call maximum, both agents live. */
  private async checkCall(
    tenantId: string,
    sessionId: string,
    payeeAgentId: string,
    amount: number,
    asset?: string,
  ): Promise<SessionDoc> {
    const session = await this.requireSession(tenantId, sessionId);
    if (asset !== undefined && asset !== session.currency) {
      throw x402Error('X402_ASSET_MISMATCH', `the session is in ${session.currency}, the payment in ${asset}`, {
        currency: session.currency,
        asset,
      });
    }
    if (!session.payeeAgentIds.includes(payeeAgentId)) {
      throw x402Error('X402_SESSION_PAYEE_NOT_ALLOWED', `payee ${payeeAgentId} is not one of the session's payees`, {
        payeeAgentId,
      });
    }
    if (amount > session.maxPerCall) {
      throw x402Error(
        'X402_SESSION_LIMIT_EXCEEDED',
        `${amount} exceeds the session's per-call maximum of ${session.maxPerCall}`,
        { maxPerCall: session.maxPerCall, amount },
      );
    }
    await this.gates.requireLiveAgents(tenantId, [session.payerAgentId, payeeAgentId]);
    return session;
  }

  /** Debits the budget (restoring it first when Redis does not hold it); every refusal as its error. */
  private async debit(
    session: SessionDoc,
    paymentId: string,
    amount: number,
    mode: Debit['mode'],
    now: Date,
    binding?: HoldBinding,
  ): Promise<Extract<DebitResult, { kind: 'new' | 'repeat' }>> {
    let debit = await this.store.debit(session._id, paymentId, amount, mode, now, binding);
    if (debit.kind === 'missing') {
      if ((await this.ensureBudget(session)) === 'closed') throw await this.closedError(session);
      debit = await this.store.debit(session._id, paymentId, amount, mode, now, binding);
    }
    if (debit.kind === 'new' && !this.seqIsFresh(session._id, debit.seq)) {
      // Redis handed out a seq this process saw before: it lost writes. Put the budget right, then debit again.
      await this.repairBudget(session, `seq ${debit.seq} handed out twice`);
      debit = await this.store.debit(session._id, paymentId, amount, mode, now, binding);
    }
    if (debit.kind === 'missing') throw errors.unavailable("the session's budget could not be read");
    if (debit.kind === 'budget') {
      throw x402Error(
        'X402_SESSION_BUDGET_EXCEEDED',
        `${amount} exceeds what is left of the session's budget (${debit.remaining})`,
        { remaining: debit.remaining, amount },
      );
    }
    if (debit.kind === 'expired') {
      // The sweeper closes it at its expiry; a call after it is refused even before that.
      throw x402Error('X402_SESSION_EXPIRED', 'the session has expired; its budget goes back to the payer', {
        expiresAt: session.expiresAt.toISOString(),
      });
    }
    if (debit.kind === 'closed') throw await this.closedError(session);
    if (debit.kind === 'new' && debit.seq % STATEMENT_CHUNK_SEQS === 0) {
      const chunk = debit.seq / STATEMENT_CHUNK_SEQS - 1 - CHUNK_LAG;
      if (chunk >= 0) this.sumUpInBackground(session, chunk);
    }
    return debit;
  }

  /**
   * Sums up a chunk of an open session's charges (see StatementChunk) beside the calls, never in their way: a call
   * whose debit passed a chunk's end by another chunk starts it and answers without waiting. A chunk with a seq not
   * yet decided (a call still in flight, or one that died) is left to the close, which reads its charges one by one.
   * Nothing depends on it having happened: a process that dies here leaves only less done.
   */
  private sumUpInBackground(session: SessionDoc, chunk: number): void {
    this.sumUpChunk(session, chunk).catch((err: unknown) =>
      this.runtime.logger.warn(
        { err, sessionId: session._id, chunk },
        'x402 session statement chunk not summed up; the close reads its charges',
      ),
    );
  }

  async sumUpChunk(session: SessionDoc, chunk: number): Promise<boolean> {
    const { from, to } = chunkSeqs(chunk);
    const charges = await this.store.chargesBetween(session._id, from, to, BACKGROUND_READS);
    // A line whose usage the payer may still acknowledge is not final until the close decides it.
    if (charges.some((c) => c === null || awaitsAck(c))) return false;
    const summary = new StatementAccumulator(session, true);
    for (const c of charges as ChargeDoc[]) {
      if (c.state === 'charged') summary.addCharge(statementLine(c));
      else summary.addVoid();
    }
    failpoint('x402.session.chunk-read');
    await this.store.recordChunk(session._id, chunk, summary.chunk());
    return true;
  }

  /**
   * Records a debit as its charge (the unique insert of its seq; a close may have voided it first) and answers it.
   * `seq taken`: a recorded charge of another payment holds the seq, so Redis lost writes since it handed it out.
   */
  private async recordCharge(
    session: SessionDoc,
    debit: Extract<DebitResult, { kind: 'new' | 'repeat' }>,
    input: ChargeInput,
    now: Date,
  ): Promise<ChargeAnswer | 'seq taken'> {
    const existing = debit.kind === 'repeat' ? await this.store.getCharge(session._id, debit.seq) : null;
    const charge = existing ?? (await this.store.recordCharge(this.chargeDoc(session, debit.seq, input, now)));
    if (charge.paymentId !== input.paymentId && charge.state === 'charged') return 'seq taken';
    if (charge.state === 'void') throw await this.closedError(session, true);
    if (!sameCall(charge, input)) throw this.reusedError(input.paymentId);
    failpoint('x402.session.charged');
    return {
      charge,
      receipt: this.receiptOf(session, charge),
      remaining: debit.kind === 'new' ? debit.remaining : await this.remaining(session),
      repeated: existing !== null,
    };
  }

  /**
   * A call found its seq held by another payment's recorded charge: Redis lost writes (a replica promoted behind its
   * primary, or an append-only file cut short) and numbers seqs again that it handed out before. Puts the budget right
   * from the recorded charges; the caller debits again. Never a 500 for the caller unless it keeps happening.
   */
  private async afterSeqTaken(session: SessionDoc, seq: number, attempt: number): Promise<void> {
    if (attempt >= DEBIT_ATTEMPTS)
      throw errors.unavailable("the session's budget is being put right after Redis lost writes; retry shortly");
    await this.repairBudget(session, `seq ${seq} is held by another payment's charge`);
  }

  /** Highest seq this process saw handed out per session: Redis handing one out again means it lost writes. */
  private readonly seqsSeen = new Map<string, number>();

  private seqIsFresh(sessionId: string, seq: number): boolean {
    const seen = this.seqsSeen.get(sessionId) ?? 0;
    if (seq <= seen) return false;
    if (this.seqsSeen.size > 100_000) this.seqsSeen.clear();
    this.seqsSeen.set(sessionId, seq);
    return true;
  }

  /**
   * Puts an open session's budget right against its recorded charges (MongoDB is the record; Redis only orders the
   * debits): see X402SessionStore.repairBudget. Reads every recorded charge by `_id` (this rare path only) and those
   * recorded past the seq Redis holds.
   */
  async repairBudget(session: SessionDoc, why: string): Promise<void> {
    // A close Redis lost: its statement is final, so the budget is stopped again and the call refused.
    if (await this.store.closeOf(session._id)) throw await this.closedError(session, true);
    const state = await this.store.budgetState(session._id);
    if (!state) {
      if ((await this.ensureBudget(session)) === 'closed') throw await this.closedError(session);
      return;
    }
    const [through, beyond] = await Promise.all([
      this.store.chargesThrough(session._id, state.seq),
      this.store.chargesBeyond(session._id, state.seq),
    ]);
    const recorded = [...through, ...beyond].filter((c): c is ChargeDoc => c?.state === 'charged');
    const repaired = await this.store.repairBudget(session._id, recorded);
    if (repaired.missing) return;
    this.seqsSeen.set(session._id, Math.max(this.seqsSeen.get(session._id) ?? 0, repaired.seqAfter));
    this.runtime.logger.warn(
      { sessionId: session._id, why, ...repaired, recorded: recorded.length },
      'x402 session budget put right against its recorded charges (Redis lost writes)',
    );
  }

  /**
   * After Redis lost writes (services/redis-loss.ts): every open session whose budget is behind its recorded charges
   * is put right, before its next call or its close has to find out. One failing session never stops the others.
   */
  async repairOpenBudgets(limit: number): Promise<{ looked: number; repaired: number; failed: number }> {
    const counts = { looked: 0, repaired: 0, failed: 0 };
    for (const sessionId of await this.store.due.allIds(limit)) {
      counts.looked++;
      try {
        const session = await this.store.get(sessionId);
        const budget = session && (await this.store.budgetState(sessionId));
        if (!session || !budget || budget.state !== 'open') continue; // rebuilt at its next call, or closing
        if ((await this.store.chargesBeyond(sessionId, budget.seq)).length === 0) continue;
        await this.repairBudget(session, 'Redis lost writes (its masters changed)');
        counts.repaired++;
      } catch (err) {
        counts.failed++;
        this.runtime.logger.warn(
          { err, sessionId },
          'x402 session budget could not be checked after Redis lost writes; its next call or close does',
        );
      }
    }
    return counts;
  }

  /**
   * Where a payment of the session stands, for a provider that lost its settle's answer: `unknown` (never seen),
   * `authorized` (held by a verify, not settled: settle it before the session closes), `settling` (debited, its
   * record in flight: settle again, it answers the same), `settled` (charged: the charge and its receipt), `refused`
   * (voided by the close). Reads by `_id` and one Redis read; moves nothing.
   */
  async paymentState(
    tenantId: string,
    sessionId: string,
    paymentId: string,
  ): Promise<{
    status: 'unknown' | 'authorized' | 'settling' | 'settled' | 'refused';
    session: SessionDoc | null;
    charged: ChargeAnswer | null;
  }> {
    const session = await this.store.get(sessionId);
    if (!session || session.tenantId !== tenantId) return { status: 'unknown', session: null, charged: null };
    const [debit, budget] = await Promise.all([
      this.store.debitOf(session._id, paymentId),
      this.store.budgetState(session._id),
    ]);
    // A closed session's payment records go from Redis once its payment index is written: looked up there.
    if (!debit && (!budget || budget.state === 'closed')) return this.paymentOfRetired(session, paymentId, budget);
    if (!debit) return { status: 'unknown', session, charged: null };
    const [charge, close] = await Promise.all([
      this.store.getCharge(session._id, debit.seq),
      this.store.closeOf(session._id),
    ]);
    if (charge?.state === 'charged')
      return { status: 'settled', session, charged: this.answerOf(session, charge, budget) };
    if (charge?.state === 'void') return { status: 'refused', session, charged: null };
    if (close) return { status: 'refused', session, charged: null }; // the close voids it at its next look
    return { status: debit.mode === 'hold' ? 'authorized' : 'settling', session, charged: null };
  }

  /**
   * A payment of a session Redis no longer holds the budget of: a closed one's (its budget retired), looked up among
   * the statement's charges by `_id` (what the session charged, never the whole collection); an open one's after
   * Redis lost it, once the budget is rebuilt. Not among a closed session's charges: `unknown` (never charged, and
   * now never will be: a hold the close voided is not told apart from an id never seen).
   */
  private async paymentOfRetired(
    session: SessionDoc,
    paymentId: string,
    budget: BudgetState | null,
  ): Promise<Awaited<ReturnType<X402Sessions['paymentState']>>> {
    const close = await this.store.closeOf(session._id);
    // Closing: its payment records stay in Redis until the close is recorded, so this one was never seen.
    if (!close && budget) return { status: 'unknown', session, charged: null };
    if (!close) {
      await this.ensureBudget(session).catch(() => undefined);
      const debit = await this.store.debitOf(session._id, paymentId);
      return debit
        ? this.paymentState(session.tenantId, session._id, paymentId)
        : { status: 'unknown', session, charged: null };
    }
    const charge = await this.statementCharge(session, close, paymentId);
    if (charge === 'refused') return { status: 'refused', session, charged: null };
    return charge
      ? { status: 'settled', session, charged: this.answerOf(session, charge, null) }
      : { status: 'unknown', session, charged: null };
  }

  /** A recorded charge as a charge answers it (a repeat: nothing new was charged); `remaining` from the budget read. */
  private answerOf(session: SessionDoc, charge: ChargeDoc, budget: BudgetState | null): ChargeAnswer {
    const remaining = budget?.state === 'open' ? budget.budget - budget.spent : 0;
    return { charge, receipt: this.receiptOf(session, charge), remaining, repeated: true };
  }

  private async remaining(session: SessionDoc): Promise<number> {
    const state = await this.store.budgetState(session._id);
    return state && state.state === 'open' ? state.budget - state.spent : 0;
  }

  private chargeDoc(session: SessionDoc, seq: number, input: ChargeInput, at: Date): ChargeDoc {
    const doc: ChargeDoc = {
      _id: chargeId(session._id, seq),
      sessionId: session._id,
      seq,
      state: 'charged',
      paymentId: input.paymentId,
      payeeAgentId: input.payeeAgentId,
      amount: input.amount,
      requestSha256: input.requestSha256 ?? null,
      at,
      receipt: null,
      ...(input.usage ? { usage: input.usage } : {}),
    };
    const { receiptHash, signature } = this.receiptOf(session, doc);
    return { ...doc, receipt: { receiptHash, signature } };
  }

  /** The charge's receipt: signed when the charge is made; a repeat answers the stored signature. */
  private receiptOf(session: SessionDoc, charge: ChargeDoc): SignedChargeReceipt {
    const body = {
      schema: 'SessionChargeReceipt.v1' as const,
      sessionId: session._id,
      chargeId: charge._id,
      seq: charge.seq,
      paymentId: charge.paymentId!,
      payerAgentId: session.payerAgentId,
      walletId: session.walletId,
      payeeAgentId: charge.payeeAgentId!,
      amount: charge.amount,
      currency: session.currency,
      requestSha256: charge.requestSha256,
      chargedAt: charge.at.toISOString(),
      // A witnessed charge's receipt binds the usage record and the schedule that priced it.
      ...(charge.usage ? { usageSha256: usageDigest(charge.usage.record), pricingSha256: session.pricingSha256! } : {}),
    };
    return charge.receipt ? { body, ...charge.receipt } : signChargeReceipt(body, this.runtime.keys.active);
  }

  private reusedError(paymentId: string): ServiceError {
    return x402Error('X402_SESSION_PAYMENT_REUSED', `payment ${paymentId} was already charged for another call`, {
      paymentId,
    });
  }

  /**
   * The error a call on an ended session gets. `stopRedis`: the call met a void seq, so the session is closed in
   * MongoDB while Redis may still debit it (it lost the close's stop): stopped again, so the calls after it are refused
   * by Redis itself.
   */
  private async closedError(session: SessionDoc, stopRedis = false): Promise<ServiceError> {
    const close = await this.store.closeOf(session._id);
    if (close && stopRedis) await this.store.stopDebits(session._id);
    if (close?.reason === 'wound_down') return woundDownError(close.woundDownAgentId ?? session.payerAgentId);
    if (close?.reason === 'expired')
      return x402Error('X402_SESSION_EXPIRED', 'the session has expired; its budget went back to the payer', {
        expiresAt: session.expiresAt.toISOString(),
      });
    return x402Error('X402_SESSION_CLOSED', 'the session is closed', { status: close ? 'closed' : 'closing' });
  }

  /**
   * Puts an open session's budget back in Redis when it is not there: a crashed open (its lock applied, the budget
   * never started) or a Redis that lost it. Only a funded session gets one; nothing was charged unless charge #1
   * exists, else the budget is rebuilt from the charges (a scan, on this rare path only). A closed session's budget
   * is never put back (its charges are final, and a close's retired budget is meant to go): answers `closed`.
   */
  private async ensureBudget(session: SessionDoc): Promise<'restored' | 'closed'> {
    const { ledger } = this.runtime.stores;
    const [close, lock, first] = await Promise.all([
      this.store.closeOf(session._id),
      ledger.getEntry(sessionEntryIds.lock(session._id)),
      this.store.getCharge(session._id, 1),
    ]);
    if (close) return 'closed';
    let funded = lock?.state === 'applied';
    if (lock?.state === 'pending')
      funded =
        (await ledger.resume(lock.entryId).catch((err) => (isInsufficientFunds(err) ? null : Promise.reject(err))))
          ?.state === 'applied';
    if (!funded)
      throw x402Error('X402_SESSION_CLOSED', 'the session holds no budget: its reserve was never made', {
        status: 'unfunded',
      });
    if (!first) {
      await this.openBudget(session);
      return 'restored';
    }
    const charges = await this.store.allCharges(session._id);
    const seq = Math.max(0, ...charges.map((c) => c.seq));
    const spent = charges.filter((c) => c.state === 'charged').reduce((sum, c) => sum + c.amount, 0);
    const payments = charges
      .filter((c) => c.paymentId)
      .map((c): [string, string] => [c.paymentId!, `${c.seq}:${c.amount}:c`]);
    this.runtime.logger.warn(
      { sessionId: session._id, charges: charges.length, spent },
      'x402 session budget rebuilt from its charges',
    );
    await this.store.initBudget(
      session._id,
      { state: 'open', budget: session.budget, spent, seq, expiresAt: session.expiresAt },
      payments,
    );
    return 'restored';
  }

  /** The payer's close: charges stop, the rest goes back at once, the payees are paid through their settlements. */
  async close(tenantId: string, sessionId: string): Promise<SessionState> {
    const session = await this.requireSession(tenantId, sessionId);
    await this.closeSession(session, 'closed');
    return this.state(session);
  }

  /**
   * Ends a session once, whoever asks (the payer, the sweeper, a wind-down): stops the debits, decides every debit
   * (charged, or void when its charge was never recorded), signs the statement and records the close (first insert
   * wins; a later closer finishes the winner's). Then the money moves (finishClose). Answers the recorded close, or
   * null for a session that never held money (its lock was refused, or never made).
   */
  async closeSession(
    session: SessionDoc,
    reason: CloseReason,
    woundDownAgentId: string | null = null,
  ): Promise<CloseDoc | null> {
    const recorded = await this.store.closeOf(session._id);
    if (recorded) {
      await this.finishClose(session, recorded);
      return recorded;
    }
    // Due for the sweeper first: a close that dies anywhere below is finished at its next pass.
    await this.store.due.mark(
      session._id,
      session.tenantId,
      new Date(Date.now() + this.runtime.config.sweeper.staleAfterMs),
    );
    let lastSeq = await this.store.stopDebits(session._id);
    if (lastSeq === null) {
      let budget: 'restored' | 'closed';
      try {
        budget = await this.ensureBudget(session);
      } catch (err) {
        if (err instanceof ServiceError && err.code === 'X402_SESSION_CLOSED') return this.unfunded(session);
        throw err;
      }
      if (budget === 'closed') return this.closeSession(session, reason, woundDownAgentId); // another closer recorded it
      lastSeq = (await this.store.stopDebits(session._id)) ?? 0;
    }
    failpoint('x402.session.stopped');
    const now = new Date();
    // Every seq Redis handed out is decided, and every charge recorded past them too: after Redis lost writes its seq
    // is behind the recorded charges, and the statement must still pay every receipt. A chunk summed up while the
    // session was open stands for its 256 charges; the rest are read one by one, a few at a time.
    const totals = new StatementAccumulator(session);
    const paid: Array<[string, number]> = [];
    const signers = new Signers(session);
    const fullChunks = Math.floor(lastSeq / STATEMENT_CHUNK_SEQS);
    const summedUpNow: Array<[number, StatementChunk]> = [];
    for (let first = 0; first < fullChunks; first += CHUNK_READS) {
      const chunks = Array.from({ length: Math.min(CHUNK_READS, fullChunks - first) }, (_, i) => first + i);
      const docs = await Promise.all(chunks.map((c) => this.store.getChunk(session._id, c)));
      for (const [i, chunk] of chunks.entries()) {
        let summary: StatementChunk | null = docs[i] ?? null;
        if (!summary) {
          const { from, to } = chunkSeqs(chunk);
          const decided = await this.decideSeqs(
            session,
            from,
            await this.store.chargesBetween(session._id, from, to, BACKGROUND_READS),
            now,
          );
          const acks = await this.decideAcks(session, decided, now);
          const own = new StatementAccumulator(session, true);
          for (const c of decided) this.addDecided(own, c, paid, acks, signers);
          summary = own.chunk();
          summedUpNow.push([chunk, summary]);
        } else
          for (const line of chunkLines(summary)) {
            paid.push([line.paymentId, line.seq]);
            signers.note(line);
          }
        totals.addChunk(summary);
      }
    }
    const tailFrom = fullChunks * STATEMENT_CHUNK_SEQS + 1;
    const [tail, beyond] = await Promise.all([
      this.store.chargesBetween(session._id, tailFrom, lastSeq, BACKGROUND_READS),
      this.store.chargesBeyond(session._id, lastSeq),
    ]);
    if (beyond.length > 0)
      this.runtime.logger.warn(
        { sessionId: session._id, redisSeq: lastSeq, recordedSeq: lastSeq + beyond.length },
        'x402 session close found charges past the seq Redis held (Redis lost writes)',
      );
    const decided = await this.decideSeqs(session, tailFrom, [...tail, ...beyond], now);
    const acks = await this.decideAcks(session, decided, now);
    failpoint('x402.session.acks-decided');
    for (const c of decided) this.addDecided(totals, c, paid, acks, signers);
    failpoint('x402.session.voided');
    // The chunks read one by one are decided now: summed up for the statement's later readers.
    await Promise.all(summedUpNow.map(([chunk, summary]) => this.store.recordChunk(session._id, chunk, summary)));
    const sums = totals.finish();
    const statement = signStatement(
      {
        schema: 'SessionStatement.v1',
        sessionId: session._id,
        payerAgentId: session.payerAgentId,
        walletId: session.walletId,
        currency: session.currency,
        budget: session.budget,
        maxPerCall: session.maxPerCall,
        holdbackBps: session.holdbackBps,
        openedAt: session.createdAt.toISOString(),
        expiresAt: session.expiresAt.toISOString(),
        reason,
        closedAt: now.toISOString(),
        voided: sums.voided,
        chargeCount: sums.chargeCount,
        chargesSha256: sums.chargesSha256,
        totalCharged: sums.totalCharged,
        refunded: sums.refunded,
        payees: session.payeeAgentIds.map((payeeAgentId, i) => {
          const charged = sums.perPayee.get(payeeAgentId)!;
          return { payeeAgentId, charged, settlementId: charged > 0 ? sessionSettlementId(session._id, i) : null };
        }),
        ...(session.pricing
          ? {
              pricing: session.pricing,
              pricingSha256: session.pricingSha256!,
              requireAcknowledgedUsage: session.requireAcknowledgedUsage ?? false,
              unacknowledged: sums.unacknowledged,
              agentKeys: await signers.keys(this.runtime),
            }
          : {}),
      },
      this.runtime.keys.active,
    );
    const { close, won } = await this.store.recordClose({
      _id: session._id,
      tenantId: session.tenantId,
      reason,
      woundDownAgentId,
      at: now,
      statement,
    });
    failpoint('x402.session.closed');
    await this.finishClose(session, close, won ? paid : null);
    logStep(this.runtime, 'x402.session.closed', {
      tenantId: session.tenantId,
      sessionId: session._id,
      reason: close.reason,
      totalCharged: close.statement.body.totalCharged,
      refunded: close.statement.body.refunded,
      chargeCount: close.statement.body.chargeCount,
      currency: session.currency,
      repeat: !won,
    });
    return close;
  }

  /** Seqs from `from` on as read (null: not recorded), each decided: a missing one is voided (or found charged). */
  private decideSeqs(session: SessionDoc, from: number, read: Array<ChargeDoc | null>, at: Date): Promise<ChargeDoc[]> {
    return Promise.all(read.map((charge, i) => charge ?? this.store.recordVoid(session._id, from + i, at)));
  }

  private addDecided(
    totals: StatementAccumulator,
    c: ChargeDoc,
    paid: Array<[string, number]>,
    acks: Map<number, UsageAckDoc>,
    signers: Signers,
  ): void {
    if (c.state !== 'charged') return totals.addVoid();
    const line = statementLine(c, acks.get(c.seq) ?? null);
    totals.addCharge(line);
    signers.note(line);
    paid.push([c.paymentId!, c.seq]);
  }

  /**
   * Decides, for each decided charge whose usage awaits the payer, whether it was acknowledged: the payer's
   * acknowledgement recorded first stands, else the close records that none came (the same unique insert, so an
   * acknowledgement racing the close is either counted or refused, never both). Every closer decides the same.
   */
  private async decideAcks(session: SessionDoc, decided: ChargeDoc[], at: Date): Promise<Map<number, UsageAckDoc>> {
    const waiting = decided.filter(awaitsAck);
    const docs = await Promise.all(
      waiting.map((c) =>
        this.store.decideAck({
          _id: chargeId(session._id, c.seq),
          sessionId: session._id,
          seq: c.seq,
          paymentId: c.paymentId!,
          payerSignature: null,
          at,
        }),
      ),
    );
    return new Map(docs.map((d) => [d.seq, d]));
  }

  /** Lines of recorded charges as a closed session's statement lists them (acknowledgements as the close decided). */
  private async linesOf(session: SessionDoc, docs: Array<ChargeDoc | null>): Promise<StatementCharge[]> {
    const charged = docs.filter((c): c is ChargeDoc => c?.state === 'charged');
    const acks = await Promise.all(
      charged.map((c) => (awaitsAck(c) ? this.store.getAck(session._id, c.seq) : Promise.resolve(null))),
    );
    return charged.map((c, i) => statementLine(c, acks[i] ?? null));
  }

  /**
   * The charges a closed session's statement lists, in seq order: its chunks (every chunk within the statement was
   * summed up by then, but for those a close died before recording) and the charges past them, read by `_id`.
   */
  private async statementLines(session: SessionDoc, close: CloseDoc): Promise<StatementCharge[]> {
    const lastSeq = statementLastSeq(close.statement.body);
    const fullChunks = Math.floor(lastSeq / STATEMENT_CHUNK_SEQS);
    const lines: StatementCharge[] = [];
    const charged = (docs: Array<ChargeDoc | null>) => this.linesOf(session, docs);
    for (let first = 0; first < fullChunks; first += CHUNK_READS) {
      const chunks = Array.from({ length: Math.min(CHUNK_READS, fullChunks - first) }, (_, i) => first + i);
      const docs = await Promise.all(chunks.map((c) => this.store.getChunk(session._id, c)));
      for (const [i, chunk] of chunks.entries()) {
        const doc = docs[i];
        if (doc) lines.push(...chunkLines(doc));
        else {
          const { from, to } = chunkSeqs(chunk);
          lines.push(...(await charged(await this.store.chargesBetween(session._id, from, to, BACKGROUND_READS))));
        }
      }
    }
    const tail = await this.store.chargesBetween(
      session._id,
      fullChunks * STATEMENT_CHUNK_SEQS + 1,
      lastSeq,
      BACKGROUND_READS,
    );
    return [...lines, ...(await charged(tail))];
  }

  /**
   * Writes a closed session's payment index (payment id -> seq, in buckets; and the payment ids the budget saw that
   * the statement does not pay), so that Redis can forget the session's payments: from what the close just read, or
   * (a close finished by another closer or the sweeper) from the statement's charges, unless its last bucket is there.
   */
  private async indexPayments(
    session: SessionDoc,
    close: CloseDoc,
    paid: Array<[string, number]> | null,
  ): Promise<void> {
    const count = paymentBuckets(close.statement.body.chargeCount + close.statement.body.voided);
    if (count === 0) return;
    if (!paid) {
      if (await this.store.getPaymentBucket(session._id, count - 1)) return;
      paid = (await this.statementLines(session, close)).map((line) => [line.paymentId, line.seq]);
    }
    const buckets = Array.from({ length: count }, () => ({
      paymentIds: [] as string[],
      seqs: [] as number[],
      refused: [] as string[],
    }));
    const charged = new Set<string>();
    for (const [paymentId, seq] of paid) {
      const bucket = buckets[paymentBucketOf(paymentId, count)]!;
      bucket.paymentIds.push(paymentId);
      bucket.seqs.push(seq);
      charged.add(paymentId);
    }
    // A debit Redis holds that the statement does not pay was voided by the close: its payment is refused.
    for (const paymentId of await this.store.debitedPaymentIds(session._id))
      if (!charged.has(paymentId)) buckets[paymentBucketOf(paymentId, count)]!.refused.push(paymentId);
    await this.store.recordPaymentIndex(session._id, buckets);
  }

  /** A session whose reserve was never made holds nothing: once its open can no longer make it, it goes. */
  private async unfunded(session: SessionDoc): Promise<null> {
    const lock = await this.runtime.stores.ledger.getEntry(sessionEntryIds.lock(session._id));
    if (lock || Date.now() - session.createdAt.getTime() >= LOCK_GRACE_MS) await this.store.removeRefused(session._id);
    return null;
  }

  /**
   * Moves a closed session's money, each step once (derived ledger ids, settlement facts by unique insert): the rest
   * of the budget back to the payer, each payee's charges into its settlement (decided pass, then released less its
   * holdback). Then the event, and the sweeper is done with it.
   */
  private async finishClose(
    session: SessionDoc,
    close: CloseDoc,
    paid: Array<[string, number]> | null = null,
  ): Promise<void> {
    const { ledger, settlements } = this.runtime.stores;
    const { body } = close.statement;
    if (body.refunded > 0) {
      await ledger.apply({
        _id: sessionEntryIds.refund(session._id),
        tenantId: session.tenantId,
        kind: 'x402_session_refund',
        currency: session.currency,
        legs: bucketMove(session.walletId, 'escrow', 'available', body.refunded),
        ref: { sessionId: session._id },
      });
    }
    failpoint('x402.session.refunded');
    for (const payee of body.payees) {
      if (!payee.settlementId) continue;
      await this.gates.ensureAgentWallet(payee.payeeAgentId, session.tenantId);
      const s = await settlements.createForSession(payee.settlementId, {
        tenantId: session.tenantId,
        sessionId: session._id,
        payerWalletId: session.walletId,
        payeeWalletId: payee.payeeAgentId,
        amount: payee.charged,
        currency: session.currency,
        holdbackBps: session.holdbackBps,
        disputeWindowSeconds: session.disputeWindowSeconds,
      });
      const decision = decideSettlement({ settlementId: s._id, ...s }, 'pass', null, close.at, (money) =>
        signReceipt(
          {
            ...receiptMoney({ settlementId: s._id, ...s }, money),
            sessionId: session._id,
            statementHash: close.statement.statementHash,
          },
          this.runtime.keys.active,
        ),
      );
      const claimed = await settlements.claimDecision(s._id, decision);
      await advanceSettlement(this.runtime, s._id, undefined, {
        doc: s,
        facts: claimed.facts,
        decidedNow: claimed.won,
      });
      failpoint('x402.session.payee-settled');
    }
    const type = close.reason === 'expired' ? 'x402.session.expired' : 'x402.session.closed';
    await emitEvent(
      this.runtime,
      session.tenantId,
      type,
      {
        ...this.eventData(session),
        reason: close.reason,
        totalCharged: body.totalCharged,
        refunded: body.refunded,
        chargeCount: body.chargeCount,
        statementHash: close.statement.statementHash,
      },
      `${type}:${session._id}`,
    );
    await this.fence(session, close);
    await this.indexPayments(session, close, paid);
    failpoint('x402.session.indexed');
    await this.store.retireBudget(session._id);
    await this.store.due.done(session._id);
  }

  /**
   * Voids the seqs just past the statement's: a Redis that lost the close's stop (and so says the session is open,
   * its seq where the close found it) hands those out next, and their calls must meet a void and be refused, not
   * record a charge the statement does not pay. Every closer and sweep may run it again (unique inserts).
   */
  private async fence(session: SessionDoc, close: CloseDoc): Promise<void> {
    const lastSeq = statementLastSeq(close.statement.body);
    await Promise.all(
      Array.from({ length: CLOSE_FENCE }, (_, i) => lastSeq + 1 + i).map((seq) =>
        this.store.recordVoid(session._id, seq, close.at),
      ),
    );
  }

  private eventData(session: SessionDoc): Record<string, unknown> {
    return {
      sessionId: session._id,
      payerAgentId: session.payerAgentId,
      payeeAgentIds: session.payeeAgentIds,
      walletId: session.walletId,
      budget: session.budget,
      currency: session.currency,
      expiresAt: session.expiresAt.toISOString(),
    };
  }

  async state(session: SessionDoc): Promise<SessionState> {
    const [close, budget] = await Promise.all([this.store.closeOf(session._id), this.store.budgetState(session._id)]);
    if (close)
      return {
        session,
        status: statusOfClose(close),
        spent: close.statement.body.totalCharged,
        charges: close.statement.body.chargeCount,
        close,
      };
    if (!budget) {
      const funded = await this.runtime.stores.ledger.firstAttemptApplied(sessionEntryIds.lock(session._id));
      return { session, status: funded ? 'open' : 'unfunded', spent: 0, charges: 0, close: null };
    }
    return {
      session,
      status: budget.state === 'closed' ? 'closing' : 'open',
      spent: budget.spent,
      charges: budget.seq,
      close: null,
    };
  }

  async get(tenantId: string, sessionId: string): Promise<SessionState> {
    return this.state(await this.requireSession(tenantId, sessionId));
  }

  /** The closed session's signed statement and the charges it commits to (409 while the session is open). */
  async statement(tenantId: string, sessionId: string): Promise<{ close: CloseDoc; charges: StatementCharge[] }> {
    const session = await this.requireSession(tenantId, sessionId);
    const close = await this.store.closeOf(session._id);
    if (!close)
      throw errors.transitionIllegal('an open session has no statement yet', (await this.state(session)).status);
    return { close, charges: await this.statementLines(session, close) };
  }

  /**
   * The payer acknowledges charges' usage after reading their responses, a batch at a time: each acknowledgement is
   * the payer agent's signature over the charge's usage record, checked against the payer's active keys, then
   * recorded by unique insert. Idempotent: an acknowledged charge stays acknowledged. A charge the close already
   * decided unacknowledged cannot be acknowledged any more (X402_USAGE_ACK_AFTER_CLOSE, naming those; the others in
   * the batch are recorded). Every item is checked before any is recorded: a bad one records nothing.
   */
  async acknowledge(
    tenantId: string,
    sessionId: string,
    items: Array<{ paymentId: string; payerSignature: unknown }>,
  ): Promise<AckAnswer[]> {
    const session = await this.requireSession(tenantId, sessionId);
    if (!session.pricing) throw x402Error('X402_USAGE_NOT_PRICED', 'the session has no priced usage to acknowledge');
    const payer = await this.runtime.credentials.agent(this.runtime.stores.agents, session.payerAgentId);
    const keys = agentKeys(payer);
    const close = await this.store.closeOf(session._id);
    const charges = await Promise.all(items.map((item) => this.chargeOfPayment(session, close, item.paymentId)));
    for (const [i, item] of items.entries()) {
      const charge = charges[i];
      if (!charge) throw errors.notFound(`a charge of payment ${item.paymentId} in this session`);
      if (!charge.usage)
        throw x402Error('X402_USAGE_NOT_METERED', `the charge of payment ${item.paymentId} carries no usage`, {
          paymentId: item.paymentId,
        });
      if (!usageSignatureValid(charge.usage.record, item.payerSignature, keys))
        throw x402Error(
          'X402_USAGE_PAYER_SIGNATURE_INVALID',
          `the acknowledgement of payment ${item.paymentId} is not signed by an active key of the payer`,
          { paymentId: item.paymentId },
        );
    }
    const now = new Date();
    const decided = await Promise.all(
      items.map((item, i) => {
        const charge = charges[i]!;
        if (charge.usage!.payerSignature) return Promise.resolve(true);
        return this.store
          .decideAck({
            _id: charge._id,
            sessionId: session._id,
            seq: charge.seq,
            paymentId: item.paymentId,
            payerSignature: signatureOf(item.payerSignature),
            at: now,
          })
          .then((ack) => ack.payerSignature !== null);
      }),
    );
    failpoint('x402.session.acknowledged');
    const late = items.filter((_, i) => !decided[i]).map((item) => item.paymentId);
    if (late.length > 0)
      throw x402Error(
        'X402_USAGE_ACK_AFTER_CLOSE',
        'the close decided these charges unacknowledged before their acknowledgement came',
        { paymentIds: late, acknowledged: items.filter((_, i) => decided[i]).map((item) => item.paymentId) },
      );
    return items.map((item, i) => ({ paymentId: item.paymentId, seq: charges[i]!.seq, acknowledged: true }));
  }

  /**
   * The recorded charge of a payment id (null: none): while the session is open, through the budget's record of the
   * payment id; once closed, among its statement's charges (the payment index).
   */
  private async chargeOfPayment(
    session: SessionDoc,
    close: CloseDoc | null,
    paymentId: string,
  ): Promise<ChargeDoc | null> {
    if (close) {
      const found = await this.statementCharge(session, close, paymentId);
      return found === 'refused' ? null : found;
    }
    const debit = await this.store.debitOf(session._id, paymentId);
    const charge = debit ? await this.store.getCharge(session._id, debit.seq) : null;
    return charge?.state === 'charged' && charge.paymentId === paymentId ? charge : null;
  }

  /**
   * The payer disputes what a payee was paid at the close, inside the session's dispute window: the payee's holdback
   * is frozen until an ops ruling (POST /ops/disputes/{id}/resolve), as for any settlement. `lines` cites statement
   * lines (their seqs) of that payee: usage the payer never acknowledged; an acknowledged line cannot be cited
   * (X402_USAGE_ACKNOWLEDGED). The cited lines go into the dispute's evidence as the statement lists them.
   */
  async dispute(
    tenantId: string,
    sessionId: string,
    input: { payeeAgentId: string; reason: string; evidence?: unknown; lines?: number[] },
  ) {
    const session = await this.requireSession(tenantId, sessionId);
    const close = await this.store.closeOf(session._id);
    const payee = close?.statement.body.payees.find((p) => p.payeeAgentId === input.payeeAgentId);
    if (!close)
      throw errors.transitionIllegal(
        'an open session has nothing settled to dispute yet',
        (await this.state(session)).status,
      );
    const cited = input.lines ? await this.citedLines(session, close, input.payeeAgentId, input.lines) : null;
    const s = payee?.settlementId ? await this.runtime.stores.settlements.get(payee.settlementId) : null;
    if (!s) throw errors.notFound(`a settlement of payee ${input.payeeAgentId} in this session`);
    const { lines: _lines, ...rest } = input;
    const opened = await disputeSettlement(
      this.runtime,
      s,
      cited ? { ...rest, evidence: { lines: cited, evidence: input.evidence ?? null } } : rest,
    );
    return {
      disputeId: opened.disputeId,
      status: opened.status,
      settlementId: s._id,
      sessionId: session._id,
      payeeAgentId: input.payeeAgentId,
      frozenAmount: opened.frozenAmount,
      ...(cited ? { lines: cited.map((line) => line.seq) } : {}),
    };
  }

  /** The statement lines a dispute cites: each a line of the payee's, paid to it, whose usage was not acknowledged. */
  private async citedLines(
    session: SessionDoc,
    close: CloseDoc,
    payeeAgentId: string,
    seqs: number[],
  ): Promise<StatementCharge[]> {
    const bySeq = new Map((await this.statementLines(session, close)).map((line) => [line.seq, line]));
    return [...new Set(seqs)].map((seq, i) => {
      const line = bySeq.get(seq);
      const unfit = (message: string) =>
        errors.unprocessable(`line ${seq} ${message}`, { errors: [{ path: `body.lines.${i}`, message }] });
      if (!line || line.payeeAgentId !== payeeAgentId)
        throw unfit(`is not a charge of ${payeeAgentId} in the statement`);
      if (line.usage?.payerSignature)
        throw x402Error('X402_USAGE_ACKNOWLEDGED', `line ${seq}'s usage was acknowledged by the payer`, { seq });
      if (!linePays(session, line)) throw unfit('was not paid (its usage was never acknowledged)');
      return line;
    });
  }

  /** A wind-down closes every session the agent pays or is paid by (found through the agent's index). */
  async windDown(sessionId: string, agentId: string): Promise<CloseDoc | null> {
    const session = await this.store.get(sessionId);
    if (!session) return null; // its funding was refused
    return this.closeSession(session, 'wound_down', agentId);
  }

  /** Closes every session past its expiry, and finishes every close a crash left half-done; one failure never stops it. */
  async sweep(partition?: number): Promise<{ looked: number; expired: number; failed: number }> {
    const summary = { looked: 0, expired: 0, failed: 0 };
    // Each look moves or removes the session's record itself (a close marks and clears it as it goes).
    const counts = await sweepDue(
      this.runtime,
      'x402-sessions',
      this.store.due,
      SWEEP_TIME_MS,
      async (id, now) => {
        await this.lookAt(id, now, summary);
        return 'handled';
      },
      partition,
    );
    return Object.assign(summary, counts);
  }

  /** One due session: finish its close, close it at its expiry, or finish a close that died before it was recorded. */
  private async lookAt(sessionId: string, now: Date, summary: { expired: number }): Promise<void> {
    const session = await this.store.get(sessionId);
    if (!session) return this.store.due.done(sessionId);
    const close = await this.store.closeOf(session._id);
    if (close) return this.finishClose(session, close);
    if (session.expiresAt.getTime() <= now.getTime()) {
      if (await this.closeSession(session, 'expired')) summary.expired++;
      return;
    }
    const budget = await this.store.budgetState(session._id);
    if (budget?.state === 'closed') await this.closeSession(session, 'closed');
    else await this.store.due.mark(session._id, session.tenantId, session.expiresAt);
  }
}
