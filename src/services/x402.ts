// The x402 payment gate's use cases (contract section 8). Every ledger entry id and every event of the gate is
// decided here; routes and the x402-verify worker call these and nothing else.
import { QueueEvents } from 'bullmq';
import { createLocalJWKSet, jwtVerify, SignJWT, type JWTPayload } from 'jose';
import { idFromIdempotency, newId } from '../domain/crypto.ts';
import { errors, ServiceError, x402Error } from '../domain/errors.ts';
import { failpoint } from '../domain/failpoints.ts';
import { MoneyInvariantError } from '../domain/money.ts';
import { signReceipt } from '../domain/receipt.ts';
import { decideSettlement, entryIds, type DecisionFact, type SettlementFacts, type SettlementView } from '../domain/settlement.ts';
import {
  authorizationDeadline,
  DEFAULT_QUOTE_TTL_SECONDS,
  escalationIdFor,
  evaluateDailyLimit,
  evaluateStaticPolicy,
  firstGateCheck,
  OVERRIDE_TTL_SECONDS,
  paymentRequiredHeader,
  paymentRequirements,
  paymentTokenClaims,
  quoteSha256,
  refundReason,
  TOKEN_AUDIENCE,
  utcDay,
  verifyVerdict,
  WALLET_DECISION_TTL_SECONDS,
  type GateStatus,
  type PaymentRequirementsV2,
  type PolicyBreach,
  type VerificationStatus,
  type WalletPolicy,
} from '../domain/x402.ts';
import { bullPrefix, jobIdFor } from '../queues/index.ts';
import type { Runtime } from '../runtime.ts';
import type { AgentDoc } from '../store/agents.ts';
import type { NewLedgerEntry, PreparedEntry, WalletDoc } from '../store/ledger.ts';
import { bucketMove, isInsufficientFunds } from '../store/ledger.ts';
import { readSettlement, type SettlementState } from '../store/settlements.ts';
import {
  OtherKeyTaken,
  type CommitmentDoc,
  type EscalationDoc,
  type GateDoc,
  type PolicyVersionDoc,
  type QuoteDoc,
  type ResolutionDoc,
  type VerificationDoc,
  type WindDownSummary,
} from '../store/x402.ts';
import { emitEvent } from './events.ts';
import { advanceSettlement } from './settlement.ts';

/** How long verify waits for its job before answering 202 with the status URL. */
const VERIFY_WAIT_MS = 2_000;
/** Index records one escalation page may read past filtered-out ones before it hands back a cursor. */
const ESCALATION_SCAN_BUDGET = 500;

export const x402EntryIds = {
  lock: (gateId: string) => `x402:${gateId}:lock`,
  unlock: (gateId: string) => `x402:${gateId}:unlock`,
};

/** The settlement of a gate lives under an id derived from the gate, so it is found by `_id`. */
export function gateSettlementId(gateId: string): string {
  return `stl_${gateId.slice('gate_'.length)}`;
}

export interface CreateGateInput {
  payerAgentId: string;
  payeeAgentId: string;
  amount: number;
  currency: string;
  holdbackBps?: number;
  disputeWindowSeconds?: number;
  toolId?: string;
  sponsorWalletId?: string;
}

export interface QuoteResult {
  quote: QuoteDoc;
  gate: GateDoc;
  paymentRequirements: PaymentRequirementsV2;
  paymentRequired: string;
}

export interface GateState {
  gate: GateDoc;
  status: GateStatus;
  funded: boolean;
  commitment: CommitmentDoc | null;
  verification: VerificationDoc | null;
  quote: QuoteDoc | null;
  settlement: SettlementState | null;
}

export interface EscalationState {
  escalation: EscalationDoc;
  resolution: ResolutionDoc | null;
}

export interface PaymentAuthorization {
  authorizationRef: string;
  token: string;
  tokenKid: string;
  expiresAt: Date;
  reserve: { amount: number; currency: string; status: 'reserved' };
}

type AuthorizationDoc = Extract<CommitmentDoc, { kind: 'authorization' }>;

/** What the x402-verify job answers (through its completion event) to the request waiting for it. */
export interface VerifyOutcome {
  decision: DecisionFact;
  view: SettlementView;
}

function isTerminal(status: GateStatus): boolean {
  return status === 'settling' || status === 'released' || status === 'refunded' || status === 'cancelled' || status === 'expired' || status === 'unfunded';
}

/** What a create retried under the same Idempotency-Key must ask for again to resume the gate it made. */
function sameGateTerms(a: GateDoc, b: GateDoc): boolean {
  return (
    a.tenantId === b.tenantId &&
    a.payerAgentId === b.payerAgentId &&
    a.payeeAgentId === b.payeeAgentId &&
    a.escrowWalletId === b.escrowWalletId &&
    a.sponsorWalletId === b.sponsorWalletId &&
    a.toolId === b.toolId &&
    a.amount === b.amount &&
    a.currency === b.currency &&
    a.holdbackBps === b.holdbackBps &&
    a.disputeWindowSeconds === b.disputeWindowSeconds
  );
}

/** A wound-down agent's refusal (410), as the lifecycle check words it. */
function woundDownError(agentId: string): ServiceError {
  return x402Error('X402_AGENT_WOUND_DOWN', `agent ${agentId} is wound down`, { agentId, status: 'wound_down' });
}

/** The value of a settled read, or its error: reads go out together, their failures are met in the checks' order. */
function valueOf<T>(result: PromiseSettledResult<T>): T {
  if (result.status === 'rejected') throw result.reason;
  return result.value;
}

const MEMO_LIMIT = 100_000;
function remember(set: Set<string>, id: string) {
  if (set.size > MEMO_LIMIT) set.clear();
  set.add(id);
}

export class X402Service {
  private queueEvents: QueueEvents | null = null;
  /** Facts that never change back once true, remembered to save a read on the hot path. */
  private readonly fundedGates = new Set<string>();
  /** Wallets never change once opened (nor are they removed): one seen once is served from memory. */
  private readonly walletDocs = new Map<string, WalletDoc>();
  /** Callers waiting for an x402-verify job, by job id (one listener on the queue's events serves them all). */
  private readonly verifyWaiters = new Map<string, Array<(result: VerifyOutcome | null) => void>>();
  private readonly jwks;

  constructor(private readonly runtime: Runtime) {
    this.jwks = createLocalJWKSet(runtime.keys.jwks as never);
  }

  private get store() {
    return this.runtime.stores.x402;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Agents' lifecycle

  /**
   * 410 when an agent is wound down (the wind-down record is the truth) or frozen; 404 when not the tenant's. Both
   * the agent and whether its wind-down fact exists come from the credential cache: windDown() publishes the agent's
   * invalidation right after recording the fact, and every process drops the entry on it and reads both afresh.
   * So a process refuses the agent within the pub/sub latency of the fact (under a millisecond on a healthy Redis,
   * and in any case before that wind-down answers, which first walks and unwinds the agent's gates); while a
   * process's invalidation channel is down its cache serves nothing, and both are read on every call. What keeps the
   * money right in that short window is not this check but the commitment's first-writer-wins insert and the create's
   * exact re-read of the facts once its lock is recorded (see createGate).
   */
  private async requireLiveAgents(tenantId: string, agentIds: string[]): Promise<AgentDoc[]> {
    const { agents } = this.runtime.stores;
    const found = await Promise.all(
      agentIds.map(async (id) => {
        const { agent, woundDown } = await this.runtime.credentials.agentLifecycle(agents, id, (agentId) => this.store.isWoundDown(agentId));
        return { id, agent, windDown: woundDown };
      }),
    );
    for (const { id, agent } of found) if (!agent || agent.tenantId !== tenantId) throw errors.notFound(`agent ${id}`);
    for (const { id, agent, windDown } of found) {
      if (windDown) throw x402Error('X402_AGENT_WOUND_DOWN', `agent ${id} is wound down`, { agentId: id, status: 'wound_down' });
      if (agent!.status === 'frozen') throw x402Error('X402_AGENT_WOUND_DOWN', `agent ${id} is frozen`, { agentId: id, status: 'frozen' });
    }
    return found.map((f) => f.agent!);
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Gates

  /**
   * Creates a gate and locks its amount. With an Idempotency-Key (`idempotencyScope`) the gate id derives from the
   * key, so a retry after a crash or a 5xx (which frees the key) resumes that gate and its one lock instead of
   * making a second; a retry asking for other terms is 422 IDEMPOTENCY_KEY_REUSED.
   */
  async createGate(tenantId: string, input: CreateGateInput, idempotencyScope: string | null = null): Promise<GateState> {
    if (input.payerAgentId === input.payeeAgentId) {
      throw errors.unprocessable('payer and payee must be different agents', { errors: [{ path: 'body.payeeAgentId', message: 'equals payerAgentId' }] });
    }
    const fresh: GateDoc = {
      _id: idempotencyScope ? idFromIdempotency('gate', idempotencyScope) : newId('gate'),
      tenantId,
      payerAgentId: input.payerAgentId,
      payeeAgentId: input.payeeAgentId,
      escrowWalletId: input.sponsorWalletId ?? input.payerAgentId,
      sponsorWalletId: input.sponsorWalletId ?? null,
      toolId: input.toolId ?? null,
      amount: input.amount,
      currency: input.currency,
      holdbackBps: input.holdbackBps ?? 0,
      disputeWindowSeconds: input.disputeWindowSeconds ?? 86_400,
      createdAt: new Date(),
    };
    const lock = this.lockEntry(fresh);
    // The lock's reads (its accounts' heads) go out at once; the checks' reads beside them, when they are not served
    // from memory (agents and their wind-down facts from the credential cache, wallets once seen). Nothing is
    // written until the checks pass; once warm, the gate's inserts below thus go out beside the heads' reads.
    const prepared = this.runtime.stores.ledger.prepare(lock);
    prepared.catch(() => undefined); // only a head start: apply reads the heads itself without it
    const [lifecycle, sponsor] = await Promise.allSettled([
      this.requireLiveAgents(tenantId, [input.payerAgentId, input.payeeAgentId]),
      input.sponsorWalletId ? this.knownWallet(input.sponsorWalletId) : null,
    ]);
    valueOf(lifecycle);
    if (input.sponsorWalletId) {
      const wallet = valueOf(sponsor);
      if (!wallet || wallet.tenantId !== tenantId) throw errors.notFound('sponsor wallet');
    } else {
      // Only once the payer is known to be the tenant's live agent: this may create its wallet.
      await this.ensureAgentWallet(input.payerAgentId, tenantId);
    }
    // The gate, its due record (so the sweeper finds a reserve whatever happens next) and its place in both agents'
    // indexes first, so a wind-down can always find a gate that holds money. A resumed gate is appended again: the
    // wind-down walk skips a gate it has seen.
    const [recorded] = await Promise.all([
      this.store.recordGate(fresh),
      this.store.due.mark(fresh._id, tenantId, firstGateCheck(fresh.createdAt, this.runtime.config.x402)),
      this.store.agentGates.append(fresh.payerAgentId, () => ({ ref: fresh._id })),
      this.store.agentGates.append(fresh.payeeAgentId, () => ({ ref: fresh._id })),
    ]);
    const gate = recorded.gate;
    if (!recorded.created) {
      if (!sameGateTerms(gate, fresh)) throw new ServiceError(422, 'IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key made a gate with other terms', { gateId: gate._id });
      // Whatever the first attempt left half-done, the sweeper looks at it within a staleness period.
      await this.store.due.mark(gate._id, tenantId, new Date(Date.now() + this.runtime.config.sweeper.staleAfterMs));
      const commitment = await this.store.commitmentOf(gate._id);
      if (commitment) return this.resumedGateAnswer(gate, commitment);
    }
    failpoint('x402.create.recorded');
    const heads = await prepared.catch(() => undefined);
    await this.fundGate(gate, lock, recorded.created, heads);
    failpoint('x402.create.locked');
    // What a resumed create cannot rule out: the sweeper expired the gate (or a wind-down cancelled it) before its lock.
    const closed = recorded.created ? null : await this.store.commitmentOf(gate._id);
    if (closed) return this.resumedGateAnswer(gate, closed);
    // What this process now knows for good: the gate, that it is funded, that it has no quote yet.
    this.store.rememberGate(gate);
    remember(this.fundedGates, gate._id);
    if (recorded.created) this.store.quoteSlots.startEmpty(gate._id);
    return recorded.created ? { gate, status: 'held', funded: true, commitment: null, verification: null, quote: null, settlement: null } : this.gateState(gate, true);
  }

  private lockEntry(gate: GateDoc): NewLedgerEntry {
    return {
      _id: x402EntryIds.lock(gate._id),
      tenantId: gate.tenantId,
      kind: 'x402_escrow_lock',
      currency: gate.currency,
      legs: bucketMove(gate.escrowWalletId, 'available', 'escrow', gate.amount),
      ref: { gateId: gate._id },
    };
  }

  /**
   * Applies the gate's lock (a resumed gate's lock finishes the first attempt's, never a second one), then checks
   * whether a wind-down raced it: then the gate is cancelled, its lock returned, and the create refused (410).
   */
  private async fundGate(gate: GateDoc, lock: NewLedgerEntry, fresh: boolean, heads: PreparedEntry | undefined): Promise<void> {
    // A wind-down that ran while this gate was being funded may not have seen the lock. Read once the lock entry is
    // recorded, its fact is either seen here, or was recorded after the lock entry, so that its walk meets the lock
    // (pending or applied) and returns it: reading while the legs are posted misses nothing.
    let raced: Promise<string | null> = Promise.resolve(null);
    try {
      // A brand-new gate has a brand-new lock: the ledger skips looking for an earlier attempt (its insert still tells).
      await this.runtime.stores.ledger.apply(lock, {
        expectNew: fresh,
        ...(heads ? { prepared: heads } : {}),
        onRecorded: () => {
          raced = this.anyWoundDown([gate.payerAgentId, gate.payeeAgentId]);
          raced.catch(() => undefined); // awaited below; a failure must not go unhandled while the legs are posted
          failpoint('x402.create.lock-recorded');
        },
      });
    } catch (err) {
      await raced.catch(() => null);
      // Refused whole: the gate never held money, so it goes (its index entries point at nothing and are skipped).
      // Any other failure may come after the lock was recorded (an answer lost on the way back, say), and the
      // ledger's sweeper then finishes it: the gate stays, so the money it holds can be found, shown and returned.
      if (isInsufficientFunds(err)) await this.store.removeRefusedGate(gate._id);
      throw err;
    }
    const racedWindDown = await raced;
    if (racedWindDown) {
      await this.cancelGate(gate, racedWindDown);
      throw woundDownError(racedWindDown);
    }
  }

  /** A resumed create of a gate that has moved on: a cancelled one is refused as its first attempt was; else its state. */
  private async resumedGateAnswer(gate: GateDoc, commitment: CommitmentDoc): Promise<GateState> {
    if (commitment.kind === 'cancellation') {
      await this.cancelGate(gate, commitment.windDownOf); // finishes the return the first attempt may have left undone
      throw woundDownError(commitment.windDownOf);
    }
    if (commitment.kind === 'expired') await this.returnReserve(gate);
    return this.gateState(gate, true);
  }

  /** Opens the agent's wallet unless this process has seen it. */
  private async ensureAgentWallet(agentId: string, tenantId: string): Promise<void> {
    if (this.walletDocs.has(agentId)) return;
    this.rememberWallet(await this.runtime.stores.ledger.ensureWallet(agentId, tenantId, 'agent'));
  }

  private rememberWallet(wallet: WalletDoc): void {
    if (this.walletDocs.size > MEMO_LIMIT) this.walletDocs.clear();
    this.walletDocs.set(wallet._id, wallet);
  }

  /** The first of these agents whose wind-down fact is recorded, read now (not from any cache). */
  async anyWoundDown(agentIds: string[]): Promise<string | null> {
    const woundDown = await Promise.all(agentIds.map((id) => this.store.isWoundDown(id)));
    return agentIds[woundDown.indexOf(true)] ?? null;
  }

  async requireGate(tenantId: string, gateId: string): Promise<GateDoc> {
    const gate = await this.store.gateOfTenant(gateId, tenantId);
    if (!gate) throw errors.notFound('gate');
    return gate;
  }

  /** Funded means its escrow lock was applied (the ledger is the truth; a crash can leave a gate without one). */
  private async isFunded(gate: GateDoc): Promise<boolean> {
    if (this.fundedGates.has(gate._id)) return true;
    const funded = await this.runtime.stores.ledger.firstAttemptApplied(x402EntryIds.lock(gate._id));
    if (funded) remember(this.fundedGates, gate._id);
    return funded;
  }

  /** The gate's state from its facts; `full` adds the current quote and the settlement (for reads, not checks). */
  async gateState(gate: GateDoc, full = false): Promise<GateState> {
    const [funded, commitment, verification] = await Promise.all([
      this.isFunded(gate),
      this.store.commitmentOf(gate._id),
      this.store.verificationOf(gate._id),
    ]);
    let settlement: SettlementState | null = null;
    let quote: QuoteDoc | null = null;
    if (full) {
      const { settlements, ledger } = this.runtime.stores;
      const [s, current] = await Promise.all([settlements.get(gateSettlementId(gate._id)), this.store.currentQuote(gate._id)]);
      settlement = s && (await readSettlement(settlements, ledger, s));
      quote = current.quote;
    }
    return { gate, status: statusOf(funded, commitment, verification, settlement), funded, commitment, verification, quote, settlement };
  }

  /**
   * The gate's state for a check on the hot path: a verification is only ever recorded after the gate's commitment
   * (verify voids an uncommitted gate first), so without a commitment there is none to read.
   */
  private async checkState(gate: GateDoc): Promise<GateState> {
    const [funded, commitment] = await Promise.all([this.isFunded(gate), this.store.commitmentOf(gate._id)]);
    const verification = commitment ? await this.store.verificationOf(gate._id) : null;
    return { gate, status: statusOf(funded, commitment, verification, null), funded, commitment, verification, quote: null, settlement: null };
  }

  /** X402_GATE_TERMINAL naming the gate's exact state (read in full: refusals are off the hot path). */
  private async terminal(gate: GateDoc, what: string): Promise<ServiceError> {
    const { status } = await this.gateState(gate, true);
    return x402Error('X402_GATE_TERMINAL', `a ${status} gate ${what}`, { status });
  }

  async getGate(tenantId: string, gateId: string): Promise<GateState> {
    return this.gateState(await this.requireGate(tenantId, gateId), true);
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Quotes

  async quote(tenantId: string, input: { gateId: string; requestSha256: string; ttlSeconds?: number }): Promise<QuoteResult> {
    const gate = await this.requireGate(tenantId, input.gateId);
    const [lifecycle, checked] = await Promise.allSettled([this.requireLiveAgents(tenantId, [gate.payerAgentId, gate.payeeAgentId]), this.checkState(gate)]);
    valueOf(lifecycle);
    const state = valueOf(checked);
    if (isTerminal(state.status)) throw await this.terminal(gate, 'takes no quotes');
    const ttlSeconds = input.ttlSeconds ?? DEFAULT_QUOTE_TTL_SECONDS;
    let live: QuoteDoc | null = null;
    let created = false;
    const now = new Date();
    // Within the gate's chain (queued per gate): a live quote for the same request is the answer, unchanged.
    await this.store.quoteSlots.append(gate._id, async (slot, previous) => {
      const prior = previous && (await this.store.quoteOfTenant(previous.ref, tenantId));
      if (prior && prior.requestSha256 === input.requestSha256 && prior.expiresAt > now) {
        live = prior;
        return null;
      }
      if (state.status === 'authorized') return null; // an authorized gate is past quoting other requests
      created = true;
      const quoteId = newId('quo');
      const expiresAt = new Date(now.getTime() + ttlSeconds * 1000);
      live = {
        _id: quoteId,
        tenantId,
        gateId: gate._id,
        slot,
        requestSha256: input.requestSha256,
        quoteSha256: quoteSha256({ gateId: gate._id, quoteId, requestSha256: input.requestSha256, amount: gate.amount, currency: gate.currency, payeeAgentId: gate.payeeAgentId, expiresAt: expiresAt.toISOString() }),
        ttlSeconds,
        createdAt: now,
        expiresAt,
      };
      return { ref: quoteId };
    });
    const quote = live as QuoteDoc | null;
    if (!quote) throw x402Error('X402_GATE_TERMINAL', 'the gate is already authorized for another request', { status: 'authorized' });
    // The slot names the quote before the quote exists; a crash in between leaves a slot the next quote supersedes.
    if (created) await this.store.recordQuote(quote);
    else this.store.rememberQuote(quote);
    return this.quoteResult(gate, quote);
  }

  quoteResult(gate: GateDoc, quote: QuoteDoc): QuoteResult {
    const requirements = paymentRequirements(
      { gateId: gate._id, quoteId: quote._id, requestSha256: quote.requestSha256, amount: gate.amount, currency: gate.currency, payeeAgentId: gate.payeeAgentId, expiresAt: quote.expiresAt.toISOString() },
      this.runtime.config.x402.network,
      quote.ttlSeconds,
    );
    const resource = { url: `${this.runtime.config.publicBaseUrl}/x402/gate/${gate._id}`, description: gate.toolId ? `tool ${gate.toolId}` : 'x402 payment gate' };
    return { quote, gate, paymentRequirements: requirements, paymentRequired: paymentRequiredHeader(requirements, resource) };
  }

  /** The quote (this tenant's, from memory once seen) and the gate's current quote position. */
  private async readQuote(gate: GateDoc, quoteId: string): Promise<{ quote: QuoteDoc | null; head: number }> {
    const [quote, head] = await Promise.all([this.store.quoteOfTenant(quoteId, gate.tenantId), this.store.quoteSlots.head(gate._id)]);
    return { quote, head };
  }

  /** Quote checks in the contract's order: found (this tenant), of this gate and current, live, bound to the request. */
  private quoteChecks(gate: GateDoc, { quote, head }: { quote: QuoteDoc | null; head: number }, quoteId: string, requestSha256: string, now: Date): QuoteDoc {
    if (!quote) throw x402Error('X402_QUOTE_NOT_FOUND', 'no such quote', { quoteId });
    if (quote.gateId !== gate._id) throw x402Error('X402_QUOTE_MISMATCH', 'the quote belongs to another gate', { quoteId, gateId: gate._id });
    if (quote.slot !== head) throw x402Error('X402_QUOTE_MISMATCH', 'a newer quote has replaced this one', { quoteId, gateId: gate._id });
    if (quote.expiresAt <= now) throw x402Error('X402_QUOTE_EXPIRED', 'the quote has expired; ask for a new one', { quoteId, expiredAt: quote.expiresAt.toISOString() });
    if (quote.requestSha256 !== requestSha256) throw x402Error('X402_REQUEST_BINDING_MISMATCH', 'requestSha256 is not the request this quote was made for', { quoteId });
    return quote;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Wallet policies and decisions

  /** The wallet, from memory once seen. */
  private async knownWallet(walletId: string): Promise<WalletDoc | null> {
    const known = this.walletDocs.get(walletId);
    if (known) return known;
    const wallet = await this.runtime.stores.ledger.getWallet(walletId);
    if (wallet) this.rememberWallet(wallet);
    return wallet;
  }

  private async requireWallet(tenantId: string, walletId: string): Promise<WalletDoc> {
    const wallet = await this.knownWallet(walletId);
    if (!wallet || wallet.tenantId !== tenantId) throw errors.notFound('wallet');
    return wallet;
  }

  /** A new policy version, by insert: concurrent updates each get a version and the last one is in force. */
  async putPolicy(tenantId: string, walletId: string, policy: WalletPolicy): Promise<PolicyVersionDoc> {
    await this.requireWallet(tenantId, walletId);
    const doc = await this.store.policies.append(walletId, (version) => ({ tenantId, walletId, version, policy, at: new Date() }));
    await this.runtime.credentials.invalidate('policy', walletId); // every process reads the new version from now on
    return doc!;
  }

  /**
   * The policy in force, cached per process and invalidated on every process by each new version (through the
   * credential cache, which serves nothing while its invalidation channel is down: then every call reads it).
   */
  private policyInForce(walletId: string): Promise<PolicyVersionDoc | null> {
    return this.runtime.credentials.policy(walletId, () => this.store.policyOf(walletId));
  }

  async getPolicy(tenantId: string, walletId: string): Promise<PolicyVersionDoc> {
    await this.requireWallet(tenantId, walletId);
    const policy = await this.store.policyOf(walletId);
    if (!policy) throw errors.notFound('policy');
    return policy;
  }

  /**
   * Counts `amount` against the wallet's UTC day, once per decision key, unless it would pass the daily limit
   * (`enforce` false records it anyway: an approved escalation). The day's spends are a chain of inserted records
   * with running totals, so concurrent callers can never both take the last of the limit.
   */
  private async spendDaily(walletId: string, policy: WalletPolicy, decisionKey: string, amount: number, now: Date, enforce: boolean): Promise<PolicyBreach | null> {
    if (policy.dailyLimit === null && enforce) return null;
    let breach: PolicyBreach | null = null;
    try {
      await this.store.spends.append(`${walletId}#${utcDay(now)}`, (_seq, previous) => {
        const spent = previous?.total ?? 0;
        breach = enforce ? evaluateDailyLimit(policy, spent, amount) : null;
        return breach ? null : { ref: walletId, decisionKey, amount, total: spent + amount, at: now };
      });
    } catch (err) {
      if (err instanceof OtherKeyTaken) return null; // this decision was already counted (a concurrent repeat)
      throw err;
    }
    return breach;
  }

  private policyViolation(breach: PolicyBreach, walletId: string): ServiceError {
    return x402Error('X402_WALLET_POLICY_VIOLATION', breach.message, { walletId, ...breach });
  }

  async authorizeWallet(tenantId: string, walletId: string, input: { gateId: string; quoteId: string; requestSha256: string }): Promise<{ walletDecisionToken: string; expiresAt: Date }> {
    const [wallet, found] = await Promise.allSettled([this.requireWallet(tenantId, walletId), this.requireGate(tenantId, input.gateId)]);
    valueOf(wallet);
    const gate = valueOf(found);
    // The decision's id is the quote's once the quote checks pass; everything is read at once, checked in order.
    const decisionId = `${walletId}#${gate._id}#${input.quoteId}`;
    const [lifecycle, checked, quoted, decided, policy] = await Promise.allSettled([
      this.requireLiveAgents(tenantId, [gate.payerAgentId, gate.payeeAgentId]),
      this.checkState(gate),
      this.readQuote(gate, input.quoteId),
      this.store.walletDecisionOf(decisionId),
      this.policyInForce(walletId),
    ]);
    valueOf(lifecycle);
    const state = valueOf(checked);
    if (state.status !== 'held') throw await this.terminal(gate, 'takes no wallet decision');
    if (gate.sponsorWalletId !== walletId) {
      throw this.policyViolation({ rule: 'sponsorWallet', message: 'this wallet does not sponsor the gate' }, walletId);
    }
    const now = new Date();
    const quote = this.quoteChecks(gate, valueOf(quoted), input.quoteId, input.requestSha256, now);
    const existing = valueOf(decided);
    if (existing && existing.expiresAt > now) return { walletDecisionToken: existing.token, expiresAt: existing.expiresAt };

    const version = valueOf(policy);
    if (!version) throw this.policyViolation({ rule: 'policy', message: 'the wallet has no policy; sponsor wallets refuse until one is set' }, walletId);
    const call = { amount: gate.amount, currency: gate.currency, payeeAgentId: gate.payeeAgentId, toolId: gate.toolId };
    const breach = evaluateStaticPolicy(version.policy, call) ?? (await this.spendDaily(walletId, version.policy, decisionId, gate.amount, now, true));
    if (breach) throw this.policyViolation(breach, walletId);

    const expiresAt = new Date(Math.min(now.getTime() + WALLET_DECISION_TTL_SECONDS * 1000, quote.expiresAt.getTime()));
    const token = await this.sign({ walletId, gateId: gate._id, quoteId: quote._id, requestSha256: quote.requestSha256, policyVersion: version.version }, TOKEN_AUDIENCE.walletDecision, walletId, expiresAt);
    // An expired decision is replaced; a concurrent one that got there first is the answer.
    const recorded = await this.store.recordWalletDecision({ _id: decisionId, tenantId, token, expiresAt, at: now }, existing !== null);
    return { walletDecisionToken: recorded.token, expiresAt: recorded.expiresAt };
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Payment authorization

  private async sign(claims: Record<string, unknown>, audience: string, subject: string, expiresAt: Date, jti = newId('jti')): Promise<string> {
    const { keyId, privateKey } = this.runtime.keys.active;
    return new SignJWT(claims)
      .setProtectedHeader({ alg: 'EdDSA', kid: keyId, typ: 'JWT' })
      .setIssuer(this.runtime.config.publicBaseUrl)
      .setSubject(subject)
      .setAudience(audience)
      .setIssuedAt()
      .setExpirationTime(Math.floor(expiresAt.getTime() / 1000))
      .setJti(jti)
      .sign(privateKey);
  }

  /** A token this service signed for `audience`, or null (bad signature, other audience, expired, malformed). */
  private async verifyOwnToken(token: string, audience: string): Promise<JWTPayload | null> {
    try {
      const { payload } = await jwtVerify(token, this.jwks, { issuer: this.runtime.config.publicBaseUrl, audience, algorithms: ['EdDSA'] });
      return payload;
    } catch {
      return null;
    }
  }

  private authorizationOf(gate: GateDoc, a: AuthorizationDoc): PaymentAuthorization {
    return { authorizationRef: a.authorizationRef, token: a.token, tokenKid: a.tokenKid, expiresAt: a.expiresAt, reserve: { amount: gate.amount, currency: gate.currency, status: 'reserved' } };
  }

  /**
   * Checks in the contract's order: agent lifecycle, gate state, quote match and expiry, request binding, wallet
   * decision, policy limits; then claims the gate's one commitment. Every failure refuses (fails closed).
   *
   * The gate's commitment is read only when something must be known before the claim: an override or a policy spend
   * (each has an effect of its own), a repeat (this process has seen the commitment), or a failed check (the gate's
   * state is reported first). Otherwise the claim is the check: a funded gate without a commitment is open, and the
   * unique insert finds out whether it still has none, with one command fewer on every paid call.
   */
  async authorizePayment(
    tenantId: string,
    input: { gateId: string; quoteId: string; requestSha256: string; walletDecisionToken?: string; escalationOverrideToken?: string },
  ): Promise<PaymentAuthorization> {
    const gate = await this.requireGate(tenantId, input.gateId);
    let stateRead: Promise<GateState> | null = null;
    const readState = () => (stateRead ??= this.checkState(gate));
    if (input.escalationOverrideToken || gate.sponsorWalletId || this.store.knowsCommitment(gate._id)) void readState().catch(() => undefined);
    // Everything the checks read, read at once; the checks then run in the contract's order on what was read.
    const [lifecycle, funded, quoted, policy] = await Promise.allSettled([
      this.requireLiveAgents(tenantId, [gate.payerAgentId, gate.payeeAgentId]),
      this.isFunded(gate),
      this.readQuote(gate, input.quoteId),
      this.policyInForce(gate.escrowWalletId),
    ]);
    valueOf(lifecycle);
    const version = valueOf(policy);
    const state = stateRead !== null || version !== null ? await readState() : null;
    if (state ? isTerminal(state.status) : !valueOf(funded)) throw await this.terminal(gate, 'cannot be authorized');
    const now = new Date();
    const quote = await this.inGateOrder(gate, state, readState, () => {
      const checked = this.quoteChecks(gate, valueOf(quoted), input.quoteId, input.requestSha256, now);
      return this.checkWalletDecision(gate, checked, input.walletDecisionToken).then(() => checked);
    });

    let escalationId: string | null = null;
    if (input.escalationOverrideToken) escalationId = await this.checkOverride(gate, quote, input.escalationOverrideToken);

    const existing = state?.commitment;
    if (existing?.kind === 'authorization') return this.repeatAuthorization(gate, existing, quote);

    if (!escalationId) {
      const breach = await this.policyBreach(gate, quote, now, version);
      if (breach) {
        const escalation = await this.escalate(gate, quote, breach.walletId, breach.breach);
        throw x402Error('X402_AUTHORIZATION_ESCALATION_REQUIRED', `${breach.breach.message}; a person must approve this payment`, { escalationId: escalation.escalation._id, status: escalationStatus(escalation), rule: breach.breach.rule });
      }
    } else {
      if (!(await this.store.recordOverrideUse(escalationId, gate._id, now))) {
        throw x402Error('X402_OVERRIDE_REPLAYED', 'this override token has already been used', { escalationId });
      }
      const walletId = gate.escrowWalletId;
      if (version) await this.spendDaily(walletId, version.policy, `${walletId}#${gate._id}#${quote._id}`, gate.amount, now, false);
    }

    const authorizationRef = newId('azn');
    const jti = newId('jti');
    const expiresAt = quote.expiresAt;
    const token = await this.sign(
      { ...paymentTokenClaims({ authorizationRef, gateId: gate._id, quoteId: quote._id, requestSha256: quote.requestSha256, amount: gate.amount, currency: gate.currency, payee: gate.payeeAgentId, payer: gate.payerAgentId, network: this.runtime.config.x402.network }) },
      gate.payeeAgentId,
      gate.payerAgentId,
      expiresAt,
      jti,
    );
    const doc: AuthorizationDoc = { _id: gate._id, tenantId, at: now, kind: 'authorization', authorizationRef, quoteId: quote._id, requestSha256: quote.requestSha256, token, tokenKid: this.runtime.keys.active.keyId, jti, expiresAt, escalationId };
    failpoint('x402.authorize.checked');
    if (await this.store.recordAuthorization(doc)) {
      failpoint('x402.authorize.committed');
      return this.authorizationOf(gate, doc);
    }
    // The gate already had a commitment: the same authorization repeated (from another process), or it is closed.
    const committed = await this.checkState(gate);
    if (committed.commitment?.kind === 'authorization' && !isTerminal(committed.status)) return this.repeatAuthorization(gate, committed.commitment, quote);
    throw await this.terminal(gate, 'cannot be authorized');
  }

  /**
   * Runs checks that come after the gate's state in the contract's order. When the state was not read (the claim
   * would have checked it), a failing check reads it first: a closed gate is reported as closed, whatever else fails.
   */
  private async inGateOrder<T>(gate: GateDoc, state: GateState | null, readState: () => Promise<GateState>, checks: () => Promise<T>): Promise<T> {
    try {
      return await checks();
    } catch (err) {
      if (!state && isTerminal((await readState()).status)) throw await this.terminal(gate, 'cannot be authorized');
      throw err;
    }
  }

  /** A sponsored gate is authorized only with its sponsor wallet's decision for this very gate, quote and request. */
  private async checkWalletDecision(gate: GateDoc, quote: QuoteDoc, walletDecisionToken: string | undefined): Promise<void> {
    if (!gate.sponsorWalletId) return;
    const claims = walletDecisionToken ? await this.verifyOwnToken(walletDecisionToken, TOKEN_AUDIENCE.walletDecision) : null;
    if (!claims) throw x402Error('X402_WALLET_DECISION_REQUIRED', walletDecisionToken ? 'the wallet decision token is invalid or expired' : 'this gate is sponsored: authorize with the sponsor wallet first', { walletId: gate.sponsorWalletId, reason: walletDecisionToken ? 'invalid' : 'missing' });
    if (claims.walletId !== gate.sponsorWalletId || claims.gateId !== gate._id || claims.quoteId !== quote._id || claims.requestSha256 !== quote.requestSha256) {
      throw x402Error('X402_WALLET_DECISION_REQUIRED', 'the wallet decision was made for another gate, quote or request', { walletId: gate.sponsorWalletId, reason: 'mismatch' });
    }
  }

  /** A repeat while live gets the same token; the gate's one authorization is for one quote and request. */
  private repeatAuthorization(gate: GateDoc, a: AuthorizationDoc, quote: QuoteDoc): PaymentAuthorization {
    if (a.quoteId !== quote._id) throw x402Error('X402_QUOTE_MISMATCH', 'the gate is authorized under another quote', { quoteId: quote._id });
    return this.authorizationOf(gate, a);
  }

  /** The escrow wallet's policy limits (a payer's own wallet may have none: then nothing limits it). */
  private async policyBreach(gate: GateDoc, quote: QuoteDoc, now: Date, version: PolicyVersionDoc | null): Promise<{ walletId: string; breach: PolicyBreach } | null> {
    const walletId = gate.escrowWalletId;
    if (!version) return gate.sponsorWalletId ? { walletId, breach: { rule: 'policy', message: 'the sponsor wallet has no policy' } } : null;
    const call = { amount: gate.amount, currency: gate.currency, payeeAgentId: gate.payeeAgentId, toolId: gate.toolId };
    const staticBreach = evaluateStaticPolicy(version.policy, call);
    if (staticBreach) return { walletId, breach: staticBreach };
    // A sponsored call's day was counted by its wallet decision (same key, so never twice); a payer's is counted here.
    const daily = await this.spendDaily(walletId, version.policy, `${walletId}#${gate._id}#${quote._id}`, gate.amount, now, true);
    return daily ? { walletId, breach: daily } : null;
  }

  private async checkOverride(gate: GateDoc, quote: QuoteDoc, token: string): Promise<string> {
    const claims = await this.verifyOwnToken(token, TOKEN_AUDIENCE.escalationOverride);
    const invalid = (why: string) => x402Error('X402_OVERRIDE_INVALID', `the escalation override token is not valid here: ${why}`);
    if (!claims || typeof claims.sub !== 'string') throw invalid('bad signature, audience or expiry');
    if (claims.gateId !== gate._id || claims.quoteId !== quote._id) throw invalid('it was issued for another gate or quote');
    const escalationId = claims.sub;
    const [resolution, used] = await Promise.all([this.store.resolutionOf(escalationId), this.store.isOverrideUsed(escalationId)]);
    if (resolution?.action !== 'approve') throw invalid('the escalation is not approved');
    if (used) throw x402Error('X402_OVERRIDE_REPLAYED', 'this override token has already been used', { escalationId });
    return escalationId;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Escalations

  private async escalate(gate: GateDoc, quote: QuoteDoc, walletId: string, breach: PolicyBreach): Promise<EscalationState> {
    const _id = escalationIdFor(gate._id, quote._id);
    const doc: EscalationDoc = {
      _id,
      tenantId: gate.tenantId,
      gateId: gate._id,
      quoteId: quote._id,
      requestSha256: quote.requestSha256,
      walletId,
      payerAgentId: gate.payerAgentId,
      payeeAgentId: gate.payeeAgentId,
      amount: gate.amount,
      currency: gate.currency,
      breach,
      createdAt: new Date(),
    };
    if (await this.store.recordEscalation(doc)) {
      await this.store.tenantEscalations.append(gate.tenantId, () => ({ ref: _id }));
    }
    const state = await this.escalationState(_id);
    await emitEvent(this.runtime, gate.tenantId, 'x402.escalation.created', escalationEvent(state.escalation), `x402.escalation.created:${_id}`);
    return state;
  }

  private async escalationState(escalationId: string): Promise<EscalationState> {
    const [escalation, resolution] = await Promise.all([this.store.escalationOf(escalationId), this.store.resolutionOf(escalationId)]);
    if (!escalation) throw errors.notFound('escalation');
    return { escalation, resolution };
  }

  async getEscalation(tenantId: string, escalationId: string): Promise<EscalationState> {
    const escalation = await this.store.escalationOfTenant(escalationId, tenantId);
    if (!escalation) throw errors.notFound('escalation');
    return { escalation, resolution: await this.store.resolutionOf(escalationId) };
  }

  /** Ids of the escalations a gate can have: one per quote it issued (derived, so read by `_id`). */
  private async gateEscalationIds(gateId: string): Promise<string[]> {
    const head = await this.store.quoteSlots.head(gateId);
    const slots = await Promise.all(Array.from({ length: head }, (_, i) => this.store.quoteSlots.get(gateId, i + 1)));
    return slots.filter((s) => s !== null).map((s) => escalationIdFor(gateId, s!.ref));
  }

  async listEscalations(
    tenantId: string,
    query: { status?: 'pending' | 'approved' | 'denied'; gateId?: string; agentId?: string; limit?: number; cursor?: number },
  ): Promise<{ items: EscalationState[]; nextCursor: number | null }> {
    const limit = query.limit ?? 50;
    const matches = (e: EscalationState) =>
      (!query.status || escalationStatus(e) === query.status) &&
      (!query.gateId || e.escalation.gateId === query.gateId) &&
      (!query.agentId || e.escalation.payerAgentId === query.agentId || e.escalation.payeeAgentId === query.agentId);
    const load = async (ids: string[]) =>
      (await Promise.all(ids.map((id) => this.getEscalation(tenantId, id).catch(() => null)))).filter((e): e is EscalationState => e !== null);

    if (query.gateId) {
      // A gate's escalations are derived from its quotes: no index needed, and at most a handful.
      const gate = await this.store.gateOfTenant(query.gateId, tenantId);
      const all = gate ? (await load(await this.gateEscalationIds(gate._id))).filter(matches).reverse() : [];
      const start = query.cursor ?? 0;
      return { items: all.slice(start, start + limit), nextCursor: all.length > start + limit ? start + limit : null };
    }
    // Newest first down the tenant's index, one page of `_id` reads at a time.
    let seq = query.cursor ?? (await this.store.tenantEscalations.head(tenantId));
    const items: EscalationState[] = [];
    let scanned = 0;
    while (seq > 0 && items.length < limit && scanned < ESCALATION_SCAN_BUDGET) {
      const batch = Array.from({ length: Math.min(limit, seq, ESCALATION_SCAN_BUDGET - scanned) }, (_, i) => seq - i);
      const slots = await Promise.all(batch.map((s) => this.store.tenantEscalations.get(tenantId, s)));
      const loaded = await load(slots.filter((s) => s !== null).map((s) => s!.ref));
      for (const e of loaded) if (matches(e) && items.length < limit) items.push(e);
      // Stop exactly after the last record used, so the next page starts where this one ended.
      const lastUsed = items.length >= limit ? batch[slots.findIndex((s) => s?.ref === items.at(-1)!.escalation._id)]! : batch.at(-1)!;
      scanned += batch.length;
      seq = lastUsed - 1;
    }
    return { items, nextCursor: seq > 0 ? seq : null };
  }

  async resolveEscalation(
    tenantId: string,
    escalationId: string,
    input: { action: 'approve' | 'deny'; reason?: string },
  ): Promise<EscalationState & { escalationOverrideToken: string | null; overrideExpiresAt: Date | null }> {
    const { escalation } = await this.getEscalation(tenantId, escalationId);
    const resolution: ResolutionDoc = { _id: escalationId, action: input.action, reason: input.reason ?? null, by: { kind: 'tenant' }, at: new Date() };
    const recorded = await this.store.recordResolution(resolution);
    if (!recorded.won) {
      const winner = recorded.resolution;
      throw x402Error('X402_ESCALATION_TERMINAL', 'the escalation has already been resolved', { status: winner?.action === 'approve' ? 'approved' : 'denied' });
    }
    const state = { escalation, resolution };
    const type = input.action === 'approve' ? 'x402.escalation.approved' : 'x402.escalation.denied';
    await emitEvent(this.runtime, tenantId, type, escalationEvent(escalation, resolution), `${type}:${escalationId}`);
    if (input.action === 'deny') return { ...state, escalationOverrideToken: null, overrideExpiresAt: null };
    const overrideExpiresAt = new Date(resolution.at.getTime() + OVERRIDE_TTL_SECONDS * 1000);
    const escalationOverrideToken = await this.sign({ gateId: escalation.gateId, quoteId: escalation.quoteId }, TOKEN_AUDIENCE.escalationOverride, escalationId, overrideExpiresAt);
    return { ...state, escalationOverrideToken, overrideExpiresAt };
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Verify

  private settlementInput(gate: GateDoc) {
    return {
      tenantId: gate.tenantId,
      gateId: gate._id,
      payerWalletId: gate.escrowWalletId,
      payeeWalletId: gate.payeeAgentId,
      amount: gate.amount,
      currency: gate.currency,
      holdbackBps: gate.holdbackBps,
      disputeWindowSeconds: gate.disputeWindowSeconds,
    };
  }

  /**
   * Records the provider's report (first report wins) and has the x402-verify worker decide; waits briefly for it.
   * `decided` false means the worker is still on it: the caller answers 202 with the status URL. A success report
   * after the authorization's deadline (its token's expiry plus the grace), or once the payer or payee is wound down,
   * is refused (X402_AUTHORIZATION_EXPIRED, X402_AGENT_WOUND_DOWN): the gate is returned to the payer instead.
   */
  async verify(
    tenantId: string,
    input: { gateId: string; evidence: { responseSha256: string; providerSignature?: string }; verificationStatus?: VerificationStatus },
  ): Promise<{ state: GateState; decided: boolean }> {
    const gate = await this.requireGate(tenantId, input.gateId);
    const status = input.verificationStatus ?? 'verified';
    // The gate's commitment decides the path (from memory when this process authorized the gate or saw it). A
    // verification is only ever recorded after the commitment, and its unique insert below tells a first report
    // from a repeat, so it is read here only off the hot path (a gate nobody authorized). Whether an agent is wound
    // down comes from the credential cache, like every lifecycle check.
    const [funded, known, woundDown] = await Promise.all([
      this.isFunded(gate),
      this.store.commitmentOf(gate._id),
      status === 'verified' ? this.woundDownParty(gate) : null,
    ]);
    let commitment = known;
    if (commitment?.kind === 'cancellation' || commitment?.kind === 'expired') throw await this.terminal(gate, 'cannot be verified');
    if (commitment?.kind !== 'authorization') {
      const reported = commitment ? await this.store.verificationOf(gate._id) : null;
      if (reported) return this.repeatVerify(gate);
      if (!funded) throw await this.terminal(gate, 'cannot be verified');
      if (status === 'verified') {
        throw x402Error('X402_PAYMENT_NOT_AUTHORIZED', 'no payment was authorized on this gate; only a failed call can be reported', { status: statusOf(funded, commitment, null, null) });
      }
    }
    if (commitment?.kind === 'authorization' && status === 'verified') {
      const returned = woundDown ? 'wound_down' : Date.now() > authorizationDeadline(commitment.expiresAt, this.runtime.config.x402).getTime() ? 'expired' : null;
      if (returned) return this.returnInsteadOfPaying(gate, returned, woundDown);
    }
    if (!commitment) {
      // A failure report on a gate nobody authorized voids it (no authorization can follow); it is refunded. Due for
      // the sweeper first: a crash between the voiding and the report still ends refunded.
      await this.store.due.mark(gate._id, tenantId, new Date(Date.now() + this.runtime.config.sweeper.staleAfterMs));
      commitment = await this.store.recordVoiding(gate);
      // An authorization that got there first takes the failure report as any authorized gate does.
      if (commitment.kind === 'cancellation' || commitment.kind === 'expired') throw await this.terminal(gate, 'cannot be verified');
      failpoint('x402.verify.voided');
    }
    const verification: VerificationDoc = {
      _id: gate._id,
      tenantId,
      verificationStatus: status,
      evidence: { responseSha256: input.evidence.responseSha256, providerSignature: input.evidence.providerSignature ?? null },
      at: new Date(),
    };
    const [recorded, settlement] = await Promise.all([
      this.store.recordVerification(verification),
      this.runtime.stores.settlements.createForGate(gateSettlementId(gate._id), this.settlementInput(gate)),
    ]);
    if (!recorded.won) return this.answerRepeat(gate, status, recorded.verification);
    failpoint('x402.verify.reported');
    const outcome = await this.runVerifyJob(gate, true);
    if (!outcome) return this.verifiedState(gate);
    // The worker's answer carries the settlement as it left it: no need to read it all back.
    const settled: SettlementState = { doc: settlement, facts: { decision: outcome.decision }, view: outcome.view };
    const gateStatus = settledStatus(settled);
    // An authorized gate takes no other quote, so its current one is the quote it was authorized under (in memory).
    const quote = commitment?.kind === 'authorization' ? await this.store.quoteOfTenant(commitment.quoteId, tenantId) : (await this.store.currentQuote(gate._id)).quote;
    return { state: { gate, status: gateStatus, funded: true, commitment, verification, quote, settlement: settled }, decided: gateStatus !== 'settling' };
  }

  /** The gate's payer or payee if wound down (from the credential cache, as every lifecycle check), else null. */
  private async woundDownParty(gate: GateDoc): Promise<string | null> {
    const { agents } = this.runtime.stores;
    const parties = [gate.payerAgentId, gate.payeeAgentId];
    const lifecycles = await Promise.all(parties.map((id) => this.runtime.credentials.agentLifecycle(agents, id, (agentId) => this.store.isWoundDown(agentId))));
    return parties[lifecycles.findIndex((l) => l.woundDown)] ?? null;
  }

  /**
   * Fills the gate's verification slot with its return instead of a report (nobody may report any more): the same
   * unique insert a report makes, so exactly one of "paid" and "returned" wins. The x402-verify job then refunds
   * the payer. Answers the verification that holds the slot (this return, or a report that got there first).
   */
  async recordReturn(gate: GateDoc, outcome: 'expired' | 'wound_down'): Promise<VerificationDoc> {
    const { verification } = await this.store.recordVerification({ _id: gate._id, tenantId: gate.tenantId, verificationStatus: outcome, evidence: { responseSha256: null, providerSignature: null }, at: new Date() });
    return verification;
  }

  /** A success report that may no longer pay: the gate is returned (the worker refunds the payer) and the report refused. */
  private async returnInsteadOfPaying(gate: GateDoc, outcome: 'expired' | 'wound_down', woundDownAgent: string | null): Promise<{ state: GateState; decided: boolean }> {
    const verification = await this.recordReturn(gate, outcome);
    if (verification.verificationStatus === 'verified' || verification.verificationStatus === 'failed') return this.repeatVerify(gate);
    failpoint('x402.verify.returned');
    await this.runtime.producers.ensure('x402-verify', { tenantId: gate.tenantId, gateId: gate._id }, jobIdFor('x402-verify', gate._id));
    throw await this.refusalOf(gate, verification, woundDownAgent);
  }

  /** A repeated report: the first one stands, unless it was the gate's return and this one claims success (refused). */
  private async answerRepeat(gate: GateDoc, status: VerificationStatus, first: VerificationDoc): Promise<{ state: GateState; decided: boolean }> {
    if (status === 'verified' && (first.verificationStatus === 'expired' || first.verificationStatus === 'wound_down')) throw await this.refusalOf(gate, first, null);
    return this.repeatVerify(gate);
  }

  private async refusalOf(gate: GateDoc, returned: VerificationDoc, woundDownAgent: string | null): Promise<ServiceError> {
    if (returned.verificationStatus === 'wound_down') {
      return woundDownError(woundDownAgent ?? (await this.anyWoundDown([gate.payerAgentId, gate.payeeAgentId])) ?? gate.payerAgentId);
    }
    const commitment = await this.store.commitmentOf(gate._id);
    const deadline = commitment?.kind === 'authorization' ? authorizationDeadline(commitment.expiresAt, this.runtime.config.x402).toISOString() : null;
    return x402Error('X402_AUTHORIZATION_EXPIRED', 'the authorization expired before the call was reported; the payer is refunded', { gateId: gate._id, status: 'expired', reportableUntil: deadline });
  }

  /** A repeated report: the first report stands; answer the decision, or make sure a job is on it and wait. */
  private async repeatVerify(gate: GateDoc): Promise<{ state: GateState; decided: boolean }> {
    const first = await this.verifiedState(gate);
    if (first.decided) return first;
    await this.runVerifyJob(gate, false);
    return this.verifiedState(gate);
  }

  /** A verified gate's state read in full, and whether its decision is made. */
  private async verifiedState(gate: GateDoc): Promise<{ state: GateState; decided: boolean }> {
    const state = await this.gateState(gate, true);
    return { state, decided: state.status === 'released' || state.status === 'refunded' || state.status === 'expired' };
  }

  private ensureQueueEvents(): QueueEvents {
    if (this.queueEvents) return this.queueEvents;
    const events = new QueueEvents('x402-verify', { connection: { url: this.runtime.config.redisUrl }, prefix: bullPrefix(this.runtime.config.redisPrefix) });
    events.on('error', () => undefined); // it reconnects by itself; a missed event only means a 202
    const settle = (jobId: string, outcome: VerifyOutcome | null) => {
      const waiters = this.verifyWaiters.get(jobId);
      this.verifyWaiters.delete(jobId);
      for (const resolve of waiters ?? []) resolve(outcome);
    };
    events.on('completed', ({ jobId, returnvalue }) => {
      const value: unknown = typeof returnvalue === 'string' ? JSON.parse(returnvalue) : returnvalue;
      settle(jobId, value && typeof value === 'object' && 'decision' in value ? (value as VerifyOutcome) : null);
    });
    events.on('failed', ({ jobId }) => settle(jobId, null));
    this.queueEvents = events;
    return events;
  }

  /**
   * Enqueues the gate's verify job (or makes sure one runs, on a repeat) and waits for its completion event, at
   * most VERIFY_WAIT_MS; null when it did not finish in time. Listening starts before the job exists.
   */
  private async runVerifyJob(gate: GateDoc, first: boolean): Promise<VerifyOutcome | null> {
    await this.ensureQueueEvents().waitUntilReady();
    const jobId = jobIdFor('x402-verify', gate._id);
    let timer: NodeJS.Timeout | undefined;
    const done = new Promise<VerifyOutcome | null>((resolve) => {
      const waiter = (outcome: VerifyOutcome | null) => {
        clearTimeout(timer);
        resolve(outcome);
      };
      this.verifyWaiters.set(jobId, [...(this.verifyWaiters.get(jobId) ?? []), waiter]);
      timer = setTimeout(() => {
        const rest = (this.verifyWaiters.get(jobId) ?? []).filter((w) => w !== waiter);
        if (rest.length > 0) this.verifyWaiters.set(jobId, rest);
        else this.verifyWaiters.delete(jobId);
        resolve(null);
      }, VERIFY_WAIT_MS);
    });
    const payload = { tenantId: gate.tenantId, gateId: gate._id };
    try {
      if (first) await this.runtime.producers.enqueue('x402-verify', payload, jobId);
      else await this.runtime.producers.ensure('x402-verify', payload, jobId);
    } catch (err) {
      clearTimeout(timer);
      this.verifyWaiters.delete(jobId);
      throw err;
    }
    return done;
  }

  /**
   * The x402-verify job: decides from the gate's facts and records the decision (with its signed receipt) as the
   * settlement's fact, then lets the settlement machinery move the money. A refund is ruled with the decision.
   * Run twice, by two workers at once, it moves the money once: facts by unique insert, ledger ids derived.
   */
  async processVerify(tenantId: string, gateId: string): Promise<VerifyOutcome | { skipped: string }> {
    const { settlements } = this.runtime.stores;
    // All keyed by the gate id, so read at once (the settlement too: the request that reported created it).
    const [gate, verification, commitment, existing] = await Promise.all([
      this.store.gateOfTenant(gateId, tenantId),
      this.store.verificationOf(gateId),
      this.store.commitmentOf(gateId),
      settlements.get(gateSettlementId(gateId)),
    ]);
    if (!gate) return { skipped: 'no such gate' };
    if (!verification) return { skipped: 'nothing reported' };
    if (!commitment) throw new Error(`gate ${gateId} has a report but no commitment`);
    // A cancelled or expired gate's lock goes back by its unlock entry; it must never be refunded a second time here.
    if (commitment.kind === 'cancellation' || commitment.kind === 'expired') throw new MoneyInvariantError(`gate ${gateId} is ${commitment.kind} yet has a report`);
    const [s] = await Promise.all([
      existing ?? settlements.createForGate(gateSettlementId(gateId), this.settlementInput(gate)),
      this.ensureAgentWallet(gate.payeeAgentId, tenantId), // the release credits it
    ]);
    const authorization = commitment.kind === 'authorization' ? commitment : null;
    const verdict = verifyVerdict(authorization !== null, verification.verificationStatus);
    // The heads of the accounts the verdict moves money between, read beside the decision (see ledger.prepare).
    const movement = verdict === 'pass' ? { id: entryIds.release(s._id), to: s.payeeWalletId } : { id: entryIds.held(s._id, 'refund'), to: s.payerWalletId };
    const prepared = this.runtime.stores.ledger.prepare({ currency: s.currency, legs: [{ walletId: s.payerWalletId, bucket: 'escrow' }, { walletId: movement.to, bucket: 'available' }] });
    prepared.catch(() => undefined); // only a head start: apply reads again without it
    // A settlement still shown pending has most likely no decision yet: claim one straight away (losing the claim
    // hands back the winner's). Any other view means one was decided: read the facts.
    let facts: SettlementFacts | null = s.view.status === 'pending' ? null : await settlements.factsOf(s._id);
    let decidedNow = false;
    let decision = facts?.decision;
    if (!decision) {
      const decided = decideSettlement(
        { settlementId: s._id, amount: gate.amount, holdbackBps: gate.holdbackBps, disputeWindowSeconds: gate.disputeWindowSeconds },
        verdict,
        refundReason(authorization !== null, verification.verificationStatus),
        new Date(),
        (money) =>
          signReceipt(
            {
              schema: 'SettlementReceipt.v1',
              settlementId: s._id,
              gateId,
              authorizationRef: authorization?.authorizationRef ?? null,
              quoteId: authorization?.quoteId ?? null,
              requestSha256: authorization?.requestSha256 ?? null,
              responseSha256: verification.evidence.responseSha256,
              verificationStatus: verification.verificationStatus,
              payerWalletId: s.payerWalletId,
              payeeWalletId: s.payeeWalletId,
              amount: gate.amount,
              releasedNow: money.releasedNow,
              holdback: money.holdback,
              currency: gate.currency,
              verdict: money.verdict,
              decidedAt: money.decidedAt,
            },
            this.runtime.keys.active,
          ),
      );
      const claimed = await settlements.claim(s._id, 'decision', decided);
      decision = claimed.fact;
      decidedNow = claimed.won;
      failpoint('x402.verify-job.decided');
      // Won: every other fact needs the decision first, so there is none yet to read.
      facts = claimed.won ? { decision } : await settlements.factsOf(s._id);
    }
    // Claimed on every pass, so a crash between the two claims cannot leave a failed gate held.
    if (decision.verdict === 'fail') facts!.heldRuling = (await settlements.claim(s._id, 'heldRuling', { outcome: 'refund', at: decision.decidedAt })).fact;
    const heads = await prepared.catch(() => null);
    const settled = await advanceSettlement(this.runtime, s._id, undefined, { doc: s, facts: facts!, decidedNow, ...(heads ? { prepared: new Map([[movement.id, heads]]) } : {}) });
    if (!settled) throw new Error(`settlement ${s._id} vanished`);
    if (verification.verificationStatus === 'expired') {
      await emitEvent(this.runtime, tenantId, 'x402.gate.expired', gateExpiredEvent(gate, 'authorization_expired', settled.view.refundedAmount), `x402.gate.expired:${gateId}`);
    }
    // The gate's money is its settlement's now (final, or due in the settlement sweeper): the gate sweeper is done.
    await this.store.due.done(gateId);
    return { decision, view: settled.view };
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Wind-down

  /**
   * Cancels a gate nobody authorized and returns its escrow; answers the gate's commitment (a cancellation by this
   * wind-down, or whatever got there first). Due for the sweeper before the cancellation, so a crash between the
   * cancellation and the return (or a create that locks after it) still ends with the money returned.
   */
  async cancelGate(gate: GateDoc, agentId: string): Promise<CommitmentDoc | null> {
    await this.store.due.mark(gate._id, gate.tenantId, new Date(Date.now() + this.runtime.config.sweeper.staleAfterMs));
    const commitment = await this.store.recordCancellation(gate, agentId);
    if (commitment.kind !== 'cancellation') return commitment;
    failpoint('x402.cancel.committed');
    await this.returnReserve(gate);
    return commitment;
  }

  /**
   * Returns a cancelled or expired gate's lock (entry `x402:<gate>:unlock`, once): a lock left pending by a crash is
   * finished first. Answers what the lock is: `returned` (now or before), or `none` (refused or not recorded, so
   * nothing was ever held; a create still running may record it yet).
   */
  async returnReserve(gate: GateDoc): Promise<'returned' | 'none'> {
    const { ledger } = this.runtime.stores;
    let lock = await ledger.getEntry(x402EntryIds.lock(gate._id));
    if (lock?.state === 'pending') {
      lock = await ledger.resume(lock.entryId).catch((err) => {
        if (isInsufficientFunds(err)) return null; // refused: it never held anything
        throw err;
      });
    }
    if (lock?.state !== 'applied') return 'none';
    await ledger.apply({
      _id: x402EntryIds.unlock(gate._id),
      tenantId: gate.tenantId,
      kind: 'x402_escrow_unlock',
      currency: gate.currency,
      legs: bucketMove(gate.escrowWalletId, 'escrow', 'available', gate.amount),
      ref: { gateId: gate._id },
    });
    return 'returned';
  }

  /**
   * Winds an agent down: the wind-down is a fact (first call wins); every gate of the agent that nobody authorized
   * is cancelled and its escrow returned, its live quotes die with it, pending escalations are denied. Authorized
   * gates stay reserved for their verification. The summary is recorded once, so a repeat answers it unchanged.
   */
  async windDown(tenantId: string, agentId: string, input: { reasonCode?: string; reasonMessage?: string }): Promise<WindDownSummary> {
    const { agents } = this.runtime.stores;
    if (!(await agents.belongsTo(tenantId, agentId))) throw errors.notFound('agent');
    const recorded = await this.store.windDownSummaryOf(agentId);
    if (recorded) return recorded;
    await this.store.recordWindDown({ _id: agentId, tenantId, reasonCode: input.reasonCode ?? null, reasonMessage: input.reasonMessage ?? null, at: new Date() });
    failpoint('x402.wind-down.recorded');
    // Every process caches whether an agent is wound down (requireLiveAgents): tell them at once, before the slower
    // unwinding below, so that staleness is bounded by the pub/sub latency (and this answer comes after it). If the
    // publish fails this answers 503 with the fact recorded: a repeat (the summary is not recorded yet) publishes
    // again and finishes the unwinding; meanwhile commitments and the create's exact re-read keep the money right.
    await this.runtime.credentials.invalidate('agent', agentId, { required: true });
    const [fact] = await Promise.all([
      this.store.windDownOf(agentId),
      agents.markWoundDown(agentId),
    ]);
    await this.runtime.credentials.invalidate('agent', agentId); // so cached documents show that status too

    const summary: WindDownSummary = {
      agentId,
      status: 'wound_down',
      reasonCode: fact!.reasonCode,
      reasonMessage: fact!.reasonMessage,
      woundDownAt: fact!.at.toISOString(),
      gatesCancelled: [],
      gatesLeftReserved: [],
      quotesCancelled: [],
      escalationsDenied: [],
      escrowReturned: [],
    };
    const returned = new Map<string, { walletId: string; currency: string; amount: number }>();
    const head = await this.store.agentGates.head(agentId);
    const walked = new Set<string>();
    for (let seq = 1; seq <= head; seq++) {
      const slot = await this.store.agentGates.get(agentId, seq);
      if (!slot || walked.has(slot.ref)) continue; // a resumed create indexes its gate again
      walked.add(slot.ref);
      const gate = await this.store.gateById(slot.ref);
      if (!gate) continue; // a gate whose funding was refused
      const [existing, verification] = await Promise.all([this.store.commitmentOf(gate._id), this.store.verificationOf(gate._id)]);
      const commitment = existing ?? (verification ? null : await this.cancelGate(gate, agentId));
      if (commitment?.kind === 'cancellation' && commitment.windDownOf === agentId) {
        if (existing) await this.cancelGate(gate, agentId); // finish a return a crash may have left undone
        summary.gatesCancelled.push(gate._id);
        const key = `${gate.escrowWalletId}|${gate.currency}`;
        const entry = returned.get(key) ?? { walletId: gate.escrowWalletId, currency: gate.currency, amount: 0 };
        entry.amount += gate.amount;
        returned.set(key, entry);
        const { quote } = await this.store.currentQuote(gate._id);
        if (quote && quote.expiresAt > commitment.at) summary.quotesCancelled.push(quote._id);
      } else if (commitment?.kind === 'authorization' && !verification) {
        // No success report may come any more: the sweeper returns it at its next pass (verify refuses meanwhile).
        summary.gatesLeftReserved.push(gate._id);
        await this.store.due.mark(gate._id, gate.tenantId, new Date());
      }
      for (const escalationId of await this.gateEscalationIds(gate._id)) {
        const escalation = await this.store.escalationOf(escalationId);
        if (!escalation) continue;
        const deny: ResolutionDoc = { _id: escalationId, action: 'deny', reason: 'agent wound down', by: { kind: 'wind-down', agentId }, at: new Date() };
        const { resolution } = await this.store.recordResolution(deny);
        if (resolution?.by.kind === 'wind-down' && resolution.by.agentId === agentId) {
          summary.escalationsDenied.push(escalationId);
          await emitEvent(this.runtime, tenantId, 'x402.escalation.denied', escalationEvent(escalation, resolution), `x402.escalation.denied:${escalationId}`);
        }
      }
    }
    summary.escrowReturned = [...returned.values()];
    const final = await this.store.recordWindDownSummary(agentId, summary);
    await emitEvent(this.runtime, tenantId, 'x402.agent.wound_down', { ...final }, `x402.agent.wound_down:${agentId}`);
    return final;
  }

  async close(): Promise<void> {
    await this.queueEvents?.close().catch(() => undefined);
    this.queueEvents = null;
  }
}

/** The gate's status from its facts (the settlement, when read, tells how far a verified gate got). */
function statusOf(funded: boolean, commitment: CommitmentDoc | null, verification: VerificationDoc | null, settlement: SettlementState | null): GateStatus {
  if (commitment?.kind === 'cancellation') return 'cancelled';
  if (commitment?.kind === 'expired') return 'expired';
  if (verification) {
    const status = settlement ? settledStatus(settlement) : 'settling';
    // An authorization nobody reported in time: its refund is the gate's expiry.
    return status === 'refunded' && verification.verificationStatus === 'expired' ? 'expired' : status;
  }
  if (commitment?.kind === 'authorization') return 'authorized';
  return funded ? 'held' : 'unfunded';
}

/** A verified gate's status from its settlement: paid out, refunded, or still on its way. */
function settledStatus(s: SettlementState): GateStatus {
  if (!s.facts.decision) return 'settling';
  return s.view.status === 'completed' ? 'released' : s.view.status === 'refunded' ? 'refunded' : 'settling';
}

/** The `x402.gate.expired` event: whose reserve went back, how much, and why (`gate_ttl` or `authorization_expired`). */
export function gateExpiredEvent(gate: GateDoc, reason: 'gate_ttl' | 'authorization_expired', returned: number): Record<string, unknown> {
  return {
    gateId: gate._id,
    reason,
    payerAgentId: gate.payerAgentId,
    payeeAgentId: gate.payeeAgentId,
    escrowWalletId: gate.escrowWalletId,
    amount: returned,
    currency: gate.currency,
  };
}

export function escalationStatus(e: EscalationState): 'pending' | 'approved' | 'denied' {
  return !e.resolution ? 'pending' : e.resolution.action === 'approve' ? 'approved' : 'denied';
}

function escalationEvent(e: EscalationDoc, resolution?: ResolutionDoc): Record<string, unknown> {
  return {
    escalationId: e._id,
    gateId: e.gateId,
    quoteId: e.quoteId,
    walletId: e.walletId,
    payerAgentId: e.payerAgentId,
    payeeAgentId: e.payeeAgentId,
    amount: e.amount,
    currency: e.currency,
    rule: e.breach.rule,
    ...(resolution ? { reason: resolution.reason } : {}),
  };
}
