// x402 verification: the provider reports the served call (first report wins; a report that may no longer pay
// returns the gate instead), and the x402-verify job decides from the gate's facts through the one settlement
// decision (domain/settlement.ts), signs the receipt and hands the money to the settlement machinery.
import { QueueEvents } from 'bullmq';
import { BSON } from 'mongodb';
import { errors, x402Error, type ServiceError } from '../../domain/errors.ts';
import { failpoint } from '../../domain/failpoints.ts';
import { logStep } from '../work-log.ts';
import { holdbackOf, MoneyInvariantError } from '../../domain/money.ts';
import { receiptMoney, signReceipt } from '../../domain/receipt.ts';
import {
  decideSettlement,
  entryIds,
  releaseCredits,
  type DecisionFact,
  type SettlementView,
} from '../../domain/settlement.ts';
import { authorizationDeadline, refundReason, verifyVerdict, type VerificationStatus } from '../../domain/x402.ts';
import { watchRedis } from '../../outages.ts';
import { jobIdFor } from '../../queues/index.ts';
import { createRedisClient, type RedisClient } from '../../redis.ts';
import type { Runtime } from '../../runtime.ts';
import { accountOf, type ReportedHead } from '../../store/ledger.ts';
import type { SettlementState } from '../../store/settlements.ts';
import type { GateDoc, VerificationDoc } from '../../store/x402.ts';
import { emitEvent } from '../events.ts';
import { advanceSettlement } from '../settlement.ts';
import {
  gateExpiredEvent,
  gateSettlementId,
  settledStatus,
  statusOf,
  woundDownError,
  type GateState,
  type X402Gates,
} from './gates.ts';

/** How long verify waits for its job before answering 202 with the status URL. */
const VERIFY_WAIT_MS = 2_000;

/** What the x402-verify job answers (through its completion event) to the request waiting for it. */
export interface VerifyOutcome {
  decision: DecisionFact;
  view: SettlementView;
  /**
   * Where the job left the chains of the accounts its movement posted to: every API process learns them from the
   * completion, so the payer's next gate needs no look past its remembered heads (the lock posts to these accounts).
   */
  heads?: ReportedHead[];
}

/** The job's copy of the gate's report, when it has one and it is this gate's (else the job reads the report). */
function reportCopy(report: string | undefined, tenantId: string, gateId: string): VerificationDoc | null {
  if (report === undefined) return null;
  try {
    const copy = BSON.EJSON.parse(report) as VerificationDoc;
    return copy._id === gateId && copy.tenantId === tenantId ? copy : null;
  } catch {
    return null;
  }
}

export class X402Verification {
  /** One listener per partition of the x402-verify queue that a verify of this process waited on, each with its connection. */
  private readonly queueEvents = new Map<number, { events: QueueEvents; connection: RedisClient }>();
  /** Callers waiting for an x402-verify job, by job id (one listener on the queue's events serves them all). */
  private readonly verifyWaiters = new Map<string, Array<(result: VerifyOutcome | null) => void>>();

  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

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
      gateRunId: gate.runId ?? null,
      test: gate.test === true,
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
    input: {
      gateId: string;
      evidence: { responseSha256: string; providerSignature?: string };
      verificationStatus?: VerificationStatus;
      amount?: number;
    },
  ): Promise<{ state: GateState; decided: boolean }> {
    const gate = await this.gates.requireGate(tenantId, input.gateId);
    const status = input.verificationStatus ?? 'verified';
    if (input.amount !== undefined && status === 'failed') {
      throw errors.unprocessable('a failed call is not charged: send amount only with verificationStatus verified', {
        errors: [{ path: 'body.amount', message: 'only with verified' }],
      });
    }
    // Checked before anything is read or recorded: a capture above the authorization moves nothing, ever.
    if (input.amount !== undefined && input.amount > gate.amount) {
      throw x402Error(
        'X402_CAPTURE_EXCEEDS_AUTHORIZATION',
        `the call cannot be charged ${input.amount}: the gate authorized at most ${gate.amount}`,
        { gateId: gate._id, amount: input.amount, authorized: gate.amount },
      );
    }
    // The gate's commitment decides the path (from memory when this process authorized the gate or saw it). A
    // verification is only ever recorded after the commitment, and its unique insert below tells a first report
    // from a repeat, so it is read here only off the hot path (a gate nobody authorized). Whether an agent is wound
    // down comes from the credential cache, like every lifecycle check.
    const [funded, known, woundDown] = await Promise.all([
      this.gates.isFunded(gate),
      this.store.commitmentOf(gate._id),
      status === 'verified' ? this.gates.woundDownParty(gate) : null,
    ]);
    let commitment = known;
    if (commitment?.kind === 'cancellation' || commitment?.kind === 'expired')
      throw await this.gates.terminal(gate, 'cannot be verified');
    if (commitment?.kind !== 'authorization') {
      const reported = commitment ? await this.store.verificationOf(gate._id) : null;
      if (reported) return this.repeatVerify(gate);
      if (!funded) throw await this.gates.terminal(gate, 'cannot be verified');
      if (status === 'verified') {
        throw x402Error(
          'X402_PAYMENT_NOT_AUTHORIZED',
          'no payment was authorized on this gate; only a failed call can be reported',
          { status: statusOf(funded, commitment, null, null) },
        );
      }
    }
    if (commitment?.kind === 'authorization' && status === 'verified') {
      const returned = woundDown
        ? 'wound_down'
        : Date.now() > authorizationDeadline(commitment.expiresAt, this.runtime.config.x402).getTime()
          ? 'expired'
          : null;
      if (returned) return this.returnInsteadOfPaying(gate, returned, woundDown);
    }
    if (!commitment) {
      // A failure report on a gate nobody authorized voids it (no authorization can follow); it is refunded. Due for
      // the sweeper first: a crash between the voiding and the report still ends refunded.
      await this.store.due.mark(gate._id, tenantId, new Date(Date.now() + this.runtime.config.sweeper.staleAfterMs));
      commitment = await this.store.recordVoiding(gate);
      // An authorization that got there first takes the failure report as any authorized gate does.
      if (commitment.kind === 'cancellation' || commitment.kind === 'expired')
        throw await this.gates.terminal(gate, 'cannot be verified');
      failpoint('x402.verify.voided');
    }
    // Where this process left the payer's chains (its lock posted there): the job then need not read past them.
    const ledgerHeads = this.runtime.stores.ledger.knownHeadsOf(
      (['escrow', 'available'] as const).map((bucket) => accountOf(gate.escrowWalletId, gate.currency, bucket)),
    );
    // The settlement before the report, so that the report can carry it and the job need not read it: its terms
    // never change (its state is its facts, which every pass reads or claims).
    const settlement = await this.runtime.stores.settlements.createForGate(
      gateSettlementId(gate._id),
      this.settlementInput(gate),
    );
    failpoint('x402.verify.settlement-stored');
    const verification: VerificationDoc = {
      _id: gate._id,
      tenantId,
      verificationStatus: status,
      evidence: {
        responseSha256: input.evidence.responseSha256,
        providerSignature: input.evidence.providerSignature ?? null,
      },
      ...(input.amount !== undefined ? { captured: input.amount } : {}),
      at: new Date(),
      ...(ledgerHeads.length > 0 ? { ledgerHeads } : {}),
      ...(commitment ? { against: { gate, commitment, settlement } } : {}),
    };
    const recorded = await this.store.recordVerification(verification);
    if (!recorded.won) return this.answerRepeat(gate, status, recorded.verification);
    logStep(this.runtime, 'x402.gate.decided', {
      tenantId,
      gateId: gate._id,
      settlementId: settlement._id,
      verificationStatus: status,
      authorized: commitment?.kind === 'authorization',
      amount: gate.amount,
      captured: status === 'verified' ? (input.amount ?? gate.amount) : 0,
      currency: gate.currency,
      payerAgentId: gate.payerAgentId,
      payeeAgentId: gate.payeeAgentId,
    });
    failpoint('x402.verify.reported');
    const outcome = await this.runVerifyJob(gate, true, verification);
    if (!outcome) return this.verifiedState(gate);
    // The worker's answer carries the settlement as it left it: no need to read it all back.
    const settled: SettlementState = { doc: settlement, facts: { decision: outcome.decision }, view: outcome.view };
    const gateStatus = settledStatus(settled);
    // An authorized gate takes no other quote, so its current one is the quote it was authorized under (in memory).
    const quote =
      commitment?.kind === 'authorization'
        ? await this.store.quoteOfTenant(commitment.quoteId, tenantId)
        : (await this.store.currentQuote(gate._id)).quote;
    return {
      state: { gate, status: gateStatus, funded: true, commitment, verification, quote, settlement: settled },
      decided: gateStatus !== 'settling',
    };
  }

  /**
   * Fills the gate's verification slot with its return instead of a report (nobody may report any more): the same
   * unique insert a report makes, so exactly one of "paid" and "returned" wins. The x402-verify job then refunds
   * the payer. Answers the verification that holds the slot (this return, or a report that got there first).
   */
  async recordReturn(gate: GateDoc, outcome: 'expired' | 'wound_down'): Promise<VerificationDoc> {
    const { verification } = await this.store.recordVerification({
      _id: gate._id,
      tenantId: gate.tenantId,
      verificationStatus: outcome,
      evidence: { responseSha256: null, providerSignature: null },
      at: new Date(),
    });
    return verification;
  }

  /** A success report that may no longer pay: the gate is returned (the worker refunds the payer) and the report refused. */
  private async returnInsteadOfPaying(
    gate: GateDoc,
    outcome: 'expired' | 'wound_down',
    woundDownAgent: string | null,
  ): Promise<{ state: GateState; decided: boolean }> {
    const verification = await this.recordReturn(gate, outcome);
    if (verification.verificationStatus === 'verified' || verification.verificationStatus === 'failed')
      return this.repeatVerify(gate);
    failpoint('x402.verify.returned');
    await this.runtime.producers.ensure(
      'x402-verify',
      { tenantId: gate.tenantId, gateId: gate._id },
      jobIdFor('x402-verify', gate._id),
    );
    throw await this.refusalOf(gate, verification, woundDownAgent);
  }

  /** A repeated report: the first one stands, unless it was the gate's return and this one claims success (refused). */
  private async answerRepeat(
    gate: GateDoc,
    status: VerificationStatus,
    first: VerificationDoc,
  ): Promise<{ state: GateState; decided: boolean }> {
    if (status === 'verified' && (first.verificationStatus === 'expired' || first.verificationStatus === 'wound_down'))
      throw await this.refusalOf(gate, first, null);
    return this.repeatVerify(gate);
  }

  private async refusalOf(
    gate: GateDoc,
    returned: VerificationDoc,
    woundDownAgent: string | null,
  ): Promise<ServiceError> {
    if (returned.verificationStatus === 'wound_down') {
      return woundDownError(
        woundDownAgent ?? (await this.gates.anyWoundDown([gate.payerAgentId, gate.payeeAgentId])) ?? gate.payerAgentId,
      );
    }
    const commitment = await this.store.commitmentOf(gate._id);
    const deadline =
      commitment?.kind === 'authorization'
        ? authorizationDeadline(commitment.expiresAt, this.runtime.config.x402).toISOString()
        : null;
    return x402Error(
      'X402_AUTHORIZATION_EXPIRED',
      'the authorization expired before the call was reported; the payer is refunded',
      { gateId: gate._id, status: 'expired', reportableUntil: deadline },
    );
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
    const state = await this.gates.gateState(gate, true);
    return { state, decided: state.status === 'released' || state.status === 'refunded' || state.status === 'expired' };
  }

  private ensureQueueEvents(partition: number): QueueEvents {
    const known = this.queueEvents.get(partition);
    if (known) return known.events;
    const { redisUrl } = this.runtime.config;
    // A connection of its own (its reads block), built like every other client: a Redis Cluster URL gets a cluster
    // client, and the partition's own name and hash-tagged prefix, or the events of its jobs are never seen and every
    // verify waits out its 2 s and answers 202. Back within 2 s of Redis (BullMQ's own retry waits up to 20 s
    // between attempts, each second a 202 instead of a decision).
    const connection = createRedisClient(redisUrl, {
      maxRetriesPerRequest: null,
      retryStrategy: (attempt: number) => Math.min(attempt * 200, 2_000),
    });
    watchRedis(connection, this.runtime.outages);
    const { layout } = this.runtime.producers;
    const events = new QueueEvents(layout.name('x402-verify', partition), {
      connection,
      prefix: layout.prefix('x402-verify', partition),
    });
    this.queueEvents.set(partition, { events, connection });
    // It reconnects by itself and a missed event only means a 202; its failures still count into the outage.
    events.on('error', (err) => {
      if (!this.runtime.outages.absorb(err))
        this.runtime.logger.warn({ err: err.message }, 'x402-verify queue events failed');
    });
    const settle = (jobId: string, outcome: VerifyOutcome | null) => {
      const waiters = this.verifyWaiters.get(jobId);
      this.verifyWaiters.delete(jobId);
      for (const resolve of waiters ?? []) resolve(outcome);
    };
    events.on('completed', ({ jobId, returnvalue }) => {
      const value: unknown = typeof returnvalue === 'string' ? JSON.parse(returnvalue) : returnvalue;
      if (value && typeof value === 'object' && 'heads' in value)
        this.runtime.stores.ledger.learnReportedHeads(value.heads);
      settle(jobId, value && typeof value === 'object' && 'decision' in value ? (value as VerifyOutcome) : null);
    });
    events.on('failed', ({ jobId }) => settle(jobId, null));
    return events;
  }

  /**
   * Enqueues the gate's verify job (or makes sure one runs, on a repeat) and waits for its completion event, at
   * most VERIFY_WAIT_MS; null when it did not finish in time. Listening starts before the job exists. A first
   * report's job carries the report as recorded (a fact: it never changes), so the job need not read it.
   */
  private async runVerifyJob(gate: GateDoc, first: boolean, report?: VerificationDoc): Promise<VerifyOutcome | null> {
    const payload = { tenantId: gate.tenantId, gateId: gate._id };
    const partition = this.runtime.producers.layout.partitionFor('x402-verify', payload);
    await this.ensureQueueEvents(partition).waitUntilReady();
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
    try {
      if (first)
        await this.runtime.producers.enqueue(
          'x402-verify',
          report ? { ...payload, report: BSON.EJSON.stringify(report) } : payload,
          jobId,
        );
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
  async processVerify(tenantId: string, gateId: string, report?: string): Promise<VerifyOutcome | { skipped: string }> {
    const { settlements } = this.runtime.stores;
    // The report first (the job's copy of it when its request sent one): it carries copies of the gate and the
    // commitment it was made against and of the settlement its request stored, so those come from memory; a report
    // without them (a return a sweeper recorded) has them read, at once.
    const verification = reportCopy(report, tenantId, gateId) ?? (await this.store.verificationOf(gateId));
    if (!verification) return { skipped: 'nothing reported' };
    this.store.rememberFactsOf(verification);
    const copied =
      verification.against?.settlement?._id === gateSettlementId(gateId) ? verification.against.settlement : null;
    const [gate, commitment, existing] = await Promise.all([
      this.store.gateOfTenant(gateId, tenantId),
      this.store.commitmentOf(gateId),
      copied ?? settlements.get(gateSettlementId(gateId)),
    ]);
    if (!gate) return { skipped: 'no such gate' };
    if (!commitment) throw new Error(`gate ${gateId} has a report but no commitment`);
    // A cancelled or expired gate's lock goes back by its unlock entry; it must never be refunded a second time here.
    if (commitment.kind === 'cancellation' || commitment.kind === 'expired')
      throw new MoneyInvariantError(`gate ${gateId} is ${commitment.kind} yet has a report`);
    const [s] = await Promise.all([
      existing ?? settlements.createForGate(gateSettlementId(gateId), this.settlementInput(gate)),
      this.gates.ensureAgentWallet(gate.payeeAgentId, tenantId), // the release credits it
    ]);
    const authorization = commitment.kind === 'authorization' ? commitment : null;
    const verdict = verifyVerdict(authorization !== null, verification.verificationStatus);
    // The heads of the accounts the verdict moves money between, read beside the decision (see ledger.prepare): the
    // release's credits as the decision will split them (a metered call charged less than its hold also credits the
    // rest back to the payer), or the refund's.
    const captured = verification.captured ?? gate.amount;
    this.runtime.stores.ledger.learnReportedHeads(verification.ledgerHeads);
    const movement =
      verdict === 'pass'
        ? {
            id: entryIds.release(s._id),
            to: releaseCredits(s, {
              verdict,
              captured,
              releaseNow: holdbackOf(captured, gate.holdbackBps).releaseNow,
            }).map((c) => c.walletId),
          }
        : { id: entryIds.held(s._id, 'refund'), to: [s.payerWalletId] };
    const movementLegs = [
      { walletId: s.payerWalletId, bucket: 'escrow' as const },
      ...movement.to.map((walletId) => ({ walletId, bucket: 'available' as const })),
    ];
    const prepared = this.runtime.stores.ledger.prepare({ currency: s.currency, legs: movementLegs });
    prepared.catch(() => undefined); // only a head start: apply reads again without it
    // The decision is claimed straight away, with nothing read first: losing the claim (a job run again, or a
    // second worker) hands back the winner's, and the other facts are read then.
    const decided = decideSettlement(
      {
        settlementId: s._id,
        amount: gate.amount,
        holdbackBps: gate.holdbackBps,
        disputeWindowSeconds: gate.disputeWindowSeconds,
        captured: verification.captured ?? gate.amount,
      },
      verdict,
      refundReason(authorization !== null, verification.verificationStatus),
      new Date(),
      (money) =>
        signReceipt(
          {
            ...receiptMoney(
              {
                settlementId: s._id,
                payerWalletId: s.payerWalletId,
                payeeWalletId: s.payeeWalletId,
                amount: gate.amount,
                currency: gate.currency,
              },
              money,
            ),
            gateId,
            authorizationRef: authorization?.authorizationRef ?? null,
            quoteId: authorization?.quoteId ?? null,
            requestSha256: authorization?.requestSha256 ?? null,
            responseSha256: verification.evidence.responseSha256,
            verificationStatus: verification.verificationStatus,
            captured: money.captured,
          },
          this.runtime.keys.active,
        ),
    );
    const { won: decidedNow, facts } = await settlements.claimDecision(s._id, decided);
    const decision = facts.decision;
    failpoint('x402.verify-job.decided');
    // Claimed on every pass, so a crash between the two claims cannot leave a failed gate held.
    if (decision.verdict === 'fail')
      facts.heldRuling = (
        await settlements.claim(s._id, 'heldRuling', { outcome: 'refund', at: decision.decidedAt })
      ).fact;
    const heads = await prepared.catch(() => null);
    const settled = await advanceSettlement(this.runtime, s._id, undefined, {
      doc: s,
      facts,
      decidedNow,
      ...(heads ? { prepared: new Map([[movement.id, heads]]) } : {}),
    });
    if (!settled) throw new Error(`settlement ${s._id} vanished`);
    if (verification.verificationStatus === 'expired') {
      await emitEvent(
        this.runtime,
        tenantId,
        'x402.gate.expired',
        gateExpiredEvent(gate, 'authorization_expired', settled.view.refundedAmount),
        `x402.gate.expired:${gateId}`,
        { test: gate.test === true },
      );
    }
    // The gate's money is its settlement's now (final, or due in the settlement sweeper): the gate sweeper is done.
    await this.store.due.done(gateId);
    const accounts = movementLegs.map((l) => accountOf(l.walletId, s.currency, l.bucket));
    return { decision, view: settled.view, heads: this.runtime.stores.ledger.knownHeadsOf(accounts) };
  }

  async close(): Promise<void> {
    const listeners = [...this.queueEvents.values()];
    this.queueEvents.clear();
    for (const { events, connection } of listeners) {
      await events.close().catch(() => undefined);
      // Handed to BullMQ as a client, so BullMQ leaves closing it to its owner.
      connection.disconnect();
    }
  }
}
