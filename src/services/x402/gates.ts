// x402 gates: creating and funding a gate (its escrow lock, raced against a wind-down), the gate's state from its
// facts, and the two ways its reserve goes back outside a settlement (a cancellation, an expiry). Also the reads every
// other x402 flow checks first: the agents' lifecycle, the gate, whether it is funded. See service.ts.
import { idFromIdempotency, newId } from '../../domain/crypto.ts';
import { errors, ServiceError, serviceError, x402Error } from '../../domain/errors.ts';
import { settlementSubject } from '../../domain/events.ts';
import { failpoint } from '../../domain/failpoints.ts';
import { firstGateCheck, type GateStatus } from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import type { AgentDoc } from '../../store/agents.ts';
import type { NewLedgerEntry, PreparedEntry, WalletDoc } from '../../store/ledger.ts';
import { bucketMove, isInsufficientFunds } from '../../store/ledger.ts';
import { readSettlement, type SettlementState } from '../../store/settlements.ts';
import type { CommitmentDoc, GateDoc, QuoteDoc, VerificationDoc } from '../../store/x402.ts';

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
  /** The tenant's run this payment is for (see GateDoc.runId). */
  runId?: string;
  /** Test traffic (see GateDoc.test). */
  test?: boolean;
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

export function isTerminal(status: GateStatus): boolean {
  return (
    status === 'settling' ||
    status === 'released' ||
    status === 'refunded' ||
    status === 'cancelled' ||
    status === 'expired' ||
    status === 'unfunded'
  );
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
    a.disputeWindowSeconds === b.disputeWindowSeconds &&
    (a.runId ?? null) === (b.runId ?? null)
  );
}

/** A wound-down agent's refusal (410), as the lifecycle check words it. */
export function woundDownError(agentId: string): ServiceError {
  return x402Error('X402_AGENT_WOUND_DOWN', `agent ${agentId} is wound down`, { agentId, status: 'wound_down' });
}

/** The value of a settled read, or its error: reads go out together, their failures are met in the checks' order. */
export function valueOf<T>(result: PromiseSettledResult<T>): T {
  if (result.status === 'rejected') throw result.reason;
  return result.value;
}

const MEMO_LIMIT = 100_000;
function remember(set: Set<string>, id: string) {
  if (set.size > MEMO_LIMIT) set.clear();
  set.add(id);
}

/** The gate's status from its facts (the settlement, when read, tells how far a verified gate got). */
export function statusOf(
  funded: boolean,
  commitment: CommitmentDoc | null,
  verification: VerificationDoc | null,
  settlement: SettlementState | null,
): GateStatus {
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
export function settledStatus(s: SettlementState): GateStatus {
  if (!s.facts.decision) return 'settling';
  return s.view.status === 'completed' ? 'released' : s.view.status === 'refunded' ? 'refunded' : 'settling';
}

/** The `x402.gate.expired` event: whose reserve went back, how much, and why (`gate_ttl` or `authorization_expired`). */
export function gateExpiredEvent(
  gate: GateDoc,
  reason: 'gate_ttl' | 'authorization_expired' | 'escalation_deadline',
  returned: number,
): Record<string, unknown> {
  return {
    ...settlementSubject({ runId: gate._id, gateId: gate._id, gateRunId: gate.runId ?? null }),
    reason,
    payerAgentId: gate.payerAgentId,
    payeeAgentId: gate.payeeAgentId,
    escrowWalletId: gate.escrowWalletId,
    amount: returned,
    currency: gate.currency,
  };
}

/** The gates' own flow plus the reads the other flows check first; its memory (funded gates, wallets) serves them all. */
export class X402Gates {
  /** Facts that never change back once true, remembered to save a read on the hot path. */
  private readonly fundedGates = new Set<string>();
  /** Wallets never change once opened (nor are they removed): one seen once is served from memory. */
  private readonly walletDocs = new Map<string, WalletDoc>();

  constructor(private readonly runtime: Runtime) {}

  private get store() {
    return this.runtime.stores.x402;
  }

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
  async requireLiveAgents(tenantId: string, agentIds: string[]): Promise<AgentDoc[]> {
    const { agents } = this.runtime.stores;
    const found = await Promise.all(
      agentIds.map(async (id) => {
        const { agent, woundDown } = await this.runtime.credentials.agentLifecycle(agents, id, (agentId) =>
          this.store.isWoundDown(agentId),
        );
        return { id, agent, windDown: woundDown };
      }),
    );
    for (const { id, agent } of found) if (!agent || agent.tenantId !== tenantId) throw errors.notFound(`agent ${id}`);
    for (const { id, agent, windDown } of found) {
      if (windDown)
        throw x402Error('X402_AGENT_WOUND_DOWN', `agent ${id} is wound down`, { agentId: id, status: 'wound_down' });
      if (agent!.status === 'frozen')
        throw x402Error('X402_AGENT_WOUND_DOWN', `agent ${id} is frozen`, { agentId: id, status: 'frozen' });
    }
    return found.map((f) => f.agent!);
  }

  /** The first of these agents whose wind-down fact is recorded, read now (not from any cache). */
  async anyWoundDown(agentIds: string[]): Promise<string | null> {
    const woundDown = await Promise.all(agentIds.map((id) => this.store.isWoundDown(id)));
    return agentIds[woundDown.indexOf(true)] ?? null;
  }

  /** The gate's payer or payee if wound down (from the credential cache, as every lifecycle check), else null. */
  async woundDownParty(gate: GateDoc): Promise<string | null> {
    const { agents } = this.runtime.stores;
    const parties = [gate.payerAgentId, gate.payeeAgentId];
    const lifecycles = await Promise.all(
      parties.map((id) =>
        this.runtime.credentials.agentLifecycle(agents, id, (agentId) => this.store.isWoundDown(agentId)),
      ),
    );
    return parties[lifecycles.findIndex((l) => l.woundDown)] ?? null;
  }

  /**
   * Creates a gate and locks its amount. With an Idempotency-Key (`idempotencyScope`) the gate id derives from the
   * key, so a retry after a crash or a 5xx (which frees the key) resumes that gate and its one lock instead of
   * making a second; a retry asking for other terms is 422 IDEMPOTENCY_KEY_REUSED.
   */
  async createGate(
    tenantId: string,
    input: CreateGateInput,
    idempotencyScope: string | null = null,
  ): Promise<GateState> {
    if (input.payerAgentId === input.payeeAgentId) {
      throw errors.unprocessable('payer and payee must be different agents', {
        errors: [{ path: 'body.payeeAgentId', message: 'equals payerAgentId' }],
      });
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
      runId: input.runId ?? null,
      test: input.test === true,
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
    if (input.runId && !(await this.runtime.stores.runs.get(tenantId, input.runId))) throw errors.notFound('run');
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
      if (!sameGateTerms(gate, fresh))
        throw serviceError('IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key made a gate with other terms', {
          gateId: gate._id,
        });
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
    return recorded.created
      ? { gate, status: 'held', funded: true, commitment: null, verification: null, quote: null, settlement: null }
      : this.gateState(gate, true);
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
  private async fundGate(
    gate: GateDoc,
    lock: NewLedgerEntry,
    fresh: boolean,
    heads: PreparedEntry | undefined,
  ): Promise<void> {
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
  async ensureAgentWallet(agentId: string, tenantId: string): Promise<void> {
    if (this.walletDocs.has(agentId)) return;
    this.rememberWallet(await this.runtime.stores.ledger.ensureWallet(agentId, tenantId, 'agent'));
  }

  private rememberWallet(wallet: WalletDoc): void {
    if (this.walletDocs.size > MEMO_LIMIT) this.walletDocs.clear();
    this.walletDocs.set(wallet._id, wallet);
  }

  /** The wallet, from memory once seen. */
  async knownWallet(walletId: string): Promise<WalletDoc | null> {
    const known = this.walletDocs.get(walletId);
    if (known) return known;
    const wallet = await this.runtime.stores.ledger.getWallet(walletId);
    if (wallet) this.rememberWallet(wallet);
    return wallet;
  }

  async requireGate(tenantId: string, gateId: string): Promise<GateDoc> {
    const gate = await this.store.gateOfTenant(gateId, tenantId);
    if (!gate) throw errors.notFound('gate');
    return gate;
  }

  /** Funded means its escrow lock was applied (the ledger is the truth; a crash can leave a gate without one). */
  async isFunded(gate: GateDoc): Promise<boolean> {
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
      const [s, current] = await Promise.all([
        settlements.get(gateSettlementId(gate._id)),
        this.store.currentQuote(gate._id),
      ]);
      settlement = s && (await readSettlement(settlements, ledger, s));
      quote = current.quote;
    }
    return {
      gate,
      status: statusOf(funded, commitment, verification, settlement),
      funded,
      commitment,
      verification,
      quote,
      settlement,
    };
  }

  /**
   * The gate's state for a check on the hot path: a verification is only ever recorded after the gate's commitment
   * (verify voids an uncommitted gate first), so without a commitment there is none to read.
   */
  async checkState(gate: GateDoc): Promise<GateState> {
    const [funded, commitment] = await Promise.all([this.isFunded(gate), this.store.commitmentOf(gate._id)]);
    const verification = commitment ? await this.store.verificationOf(gate._id) : null;
    return {
      gate,
      status: statusOf(funded, commitment, verification, null),
      funded,
      commitment,
      verification,
      quote: null,
      settlement: null,
    };
  }

  /** X402_GATE_TERMINAL naming the gate's exact state (read in full: refusals are off the hot path). */
  async terminal(gate: GateDoc, what: string): Promise<ServiceError> {
    const { status } = await this.gateState(gate, true);
    return x402Error('X402_GATE_TERMINAL', `a ${status} gate ${what}`, { status });
  }

  async getGate(tenantId: string, gateId: string): Promise<GateState> {
    return this.gateState(await this.requireGate(tenantId, gateId), true);
  }

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
}
