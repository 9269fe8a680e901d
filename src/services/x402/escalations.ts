// x402 escalations: a payment a wallet policy refuses becomes an escalation a person approves (with a one-time
// override token) or denies, with a reason, before its deadline; listed newest first per tenant, or per gate from
// its quotes. Nobody deciding by the deadline denies it by itself and returns the gate's reserve (the deadline sweep
// below). Every decision (a person's, the deadline's, a wind-down's) is the one unique insert of the escalation's
// resolution: whichever comes first is the escalation's fate, and the others change nothing.
import { errors, ServiceError, x402Error } from '../../domain/errors.ts';
import { failpoint } from '../../domain/failpoints.ts';
import { logStep } from '../work-log.ts';
import {
  escalationDeadline,
  escalationIdFor,
  OVERRIDE_TTL_SECONDS,
  TOKEN_AUDIENCE,
  type PolicyBreach,
} from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import type { Decider, EscalationDoc, GateDoc, QuoteDoc, ResolutionDoc } from '../../store/x402.ts';
import { emitEvent } from '../events.ts';
import { sweepDue, type DueLook } from '../sweep-items.ts';
import { gateExpiredEvent } from './gates.ts';
import type { X402Tokens } from './tokens.ts';
import type { X402Gates } from './gates.ts';

/** The reason a deadline's own denial records. */
export const DEADLINE_PASSED = 'deadline_passed';
/** At most this many escalations are decided by one bulk call. */
export const BULK_RESOLVE_LIMIT = 100;

/** Index records one escalation page may read past filtered-out ones before it hands back a cursor. */
const ESCALATION_SCAN_BUDGET = 500;

export interface EscalationState {
  escalation: EscalationDoc;
  resolution: ResolutionDoc | null;
}

export function escalationStatus(e: EscalationState): 'pending' | 'approved' | 'denied' {
  return !e.resolution ? 'pending' : e.resolution.action === 'approve' ? 'approved' : 'denied';
}

/** When the escalation is denied by itself (escalations raised before deadlines existed: the default after creation). */
export function deadlineOf(e: EscalationDoc): Date {
  return e.deadlineAt ?? escalationDeadline(e.createdAt, null);
}

/** Who decided, as one string: the API key id, `admin`, `deadline`, `wind-down:<agentId>` (or `tenant`, before keys were recorded). */
export function deciderName(by: Decider): string {
  switch (by.kind) {
    case 'api-key':
      return by.keyId;
    case 'wind-down':
      return `wind-down:${by.agentId}`;
    default:
      return by.kind;
  }
}

export function escalationEvent(e: EscalationDoc, resolution?: ResolutionDoc): Record<string, unknown> {
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
    deadlineAt: deadlineOf(e).toISOString(),
    ...(resolution ? { reason: resolution.reason, decidedBy: deciderName(resolution.by) } : {}),
  };
}

/** What the `x402.escalation.decided` log line says (services/work-log.ts): ids, the outcome, the amount. */
function decidedFields(e: EscalationDoc, resolution: ResolutionDoc) {
  return {
    tenantId: e.tenantId,
    escalationId: e._id,
    gateId: e.gateId,
    outcome: resolution.action === 'approve' ? 'approved' : 'denied',
    decidedBy: deciderName(resolution.by),
    rule: e.breach.rule,
    amount: e.amount,
    currency: e.currency,
    payerAgentId: e.payerAgentId,
    payeeAgentId: e.payeeAgentId,
  };
}

export class X402Escalations {
  constructor(
    private readonly runtime: Runtime,
    private readonly tokens: X402Tokens,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  async escalate(
    gate: GateDoc,
    quote: QuoteDoc,
    walletId: string,
    breach: PolicyBreach,
    timeoutSeconds: number | null,
  ): Promise<EscalationState> {
    const _id = escalationIdFor(gate._id, quote._id);
    const createdAt = new Date();
    const deadlineAt = escalationDeadline(createdAt, { escalationTimeoutSeconds: timeoutSeconds });
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
      createdAt,
      deadlineAt,
    };
    // Marked before the escalation is recorded, so the deadline sweep finds every one a crash leaves undecided. A
    // repeated breach finds the escalation recorded: it is marked due by its own deadline, not this call's.
    const existing = await this.store.escalationOf(_id);
    await this.store.escalationsDue.mark(_id, gate.tenantId, existing ? deadlineOf(existing) : deadlineAt, gate._id);
    if (await this.store.recordEscalation(doc)) {
      await this.store.tenantEscalations.append(gate.tenantId, () => ({ ref: _id }));
    }
    const state = await this.escalationState(_id);
    await emitEvent(
      this.runtime,
      gate.tenantId,
      'x402.escalation.created',
      escalationEvent(state.escalation),
      `x402.escalation.created:${_id}`,
    );
    return state;
  }

  private async escalationState(escalationId: string): Promise<EscalationState> {
    const [escalation, resolution] = await Promise.all([
      this.store.escalationOf(escalationId),
      this.store.resolutionOf(escalationId),
    ]);
    if (!escalation) throw errors.notFound('escalation');
    return { escalation, resolution };
  }

  async getEscalation(tenantId: string, escalationId: string): Promise<EscalationState> {
    const escalation = await this.store.escalationOfTenant(escalationId, tenantId);
    if (!escalation) throw errors.notFound('escalation');
    return { escalation, resolution: await this.store.resolutionOf(escalationId) };
  }

  /** Ids of the escalations a gate can have: one per quote it issued (derived, so read by `_id`). */
  async gateEscalationIds(gateId: string): Promise<string[]> {
    const head = await this.store.quoteSlots.head(gateId);
    const slots = await Promise.all(Array.from({ length: head }, (_, i) => this.store.quoteSlots.get(gateId, i + 1)));
    return slots.filter((s) => s !== null).map((s) => escalationIdFor(gateId, s!.ref));
  }

  async listEscalations(
    tenantId: string,
    query: {
      status?: 'pending' | 'approved' | 'denied';
      gateId?: string;
      agentId?: string;
      limit?: number;
      cursor?: number;
    },
  ): Promise<{ items: EscalationState[]; nextCursor: number | null }> {
    const limit = query.limit ?? 50;
    const matches = (e: EscalationState) =>
      (!query.status || escalationStatus(e) === query.status) &&
      (!query.gateId || e.escalation.gateId === query.gateId) &&
      (!query.agentId || e.escalation.payerAgentId === query.agentId || e.escalation.payeeAgentId === query.agentId);
    const load = async (ids: string[]) =>
      (await Promise.all(ids.map((id) => this.getEscalation(tenantId, id).catch(() => null)))).filter(
        (e): e is EscalationState => e !== null,
      );

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
      const lastUsed =
        items.length >= limit ? batch[slots.findIndex((s) => s?.ref === items.at(-1)!.escalation._id)]! : batch.at(-1)!;
      scanned += batch.length;
      seq = lastUsed - 1;
    }
    return { items, nextCursor: seq > 0 ? seq : null };
  }

  /**
   * A person's decision (`tenantId` null: the operator's, any tenant). Refused with 409, changing nothing, when the
   * escalation is already decided (X402_ESCALATION_TERMINAL) or its deadline passed (X402_ESCALATION_DEADLINE_PASSED:
   * the deadline sweep denies it). An approve that read the deadline just before it and a deadline denial race
   * through the one resolution insert; the loser changes nothing.
   */
  async resolveEscalation(
    tenantId: string | null,
    escalationId: string,
    input: { action: 'approve' | 'deny'; reason?: string },
    decidedBy: Decider = { kind: 'tenant' },
  ): Promise<EscalationState & { escalationOverrideToken: string | null; overrideExpiresAt: Date | null }> {
    const escalation =
      tenantId === null
        ? await this.store.escalationOf(escalationId)
        : await this.store.escalationOfTenant(escalationId, tenantId);
    if (!escalation) throw errors.notFound('escalation');
    const terminal = (winner: ResolutionDoc | null) =>
      x402Error('X402_ESCALATION_TERMINAL', 'the escalation has already been decided', {
        status: winner?.action === 'approve' ? 'approved' : 'denied',
        ...(winner
          ? { reason: winner.reason, decidedBy: deciderName(winner.by), decidedAt: winner.at.toISOString() }
          : {}),
      });
    const earlier = await this.store.resolutionOf(escalationId);
    if (earlier) throw terminal(earlier);
    const deadlineAt = deadlineOf(escalation);
    if (Date.now() >= deadlineAt.getTime()) {
      throw x402Error(
        'X402_ESCALATION_DEADLINE_PASSED',
        `the escalation's deadline passed at ${deadlineAt.toISOString()}: it is denied by itself (${DEADLINE_PASSED}) and its reserve returned`,
        { deadlineAt: deadlineAt.toISOString() },
      );
    }
    const resolution: ResolutionDoc = {
      _id: escalationId,
      action: input.action,
      reason: input.reason ?? null,
      by: decidedBy,
      at: new Date(),
    };
    const recorded = await this.store.recordResolution(resolution);
    if (!recorded.won) throw terminal(recorded.resolution);
    logStep(this.runtime, 'x402.escalation.decided', decidedFields(escalation, resolution));
    const state = { escalation, resolution };
    const type = input.action === 'approve' ? 'x402.escalation.approved' : 'x402.escalation.denied';
    await emitEvent(
      this.runtime,
      escalation.tenantId,
      type,
      escalationEvent(escalation, resolution),
      `${type}:${escalationId}`,
    );
    if (input.action === 'deny') return { ...state, escalationOverrideToken: null, overrideExpiresAt: null };
    const overrideExpiresAt = new Date(resolution.at.getTime() + OVERRIDE_TTL_SECONDS * 1000);
    const escalationOverrideToken = await this.tokens.sign(
      { gateId: escalation.gateId, quoteId: escalation.quoteId },
      TOKEN_AUDIENCE.escalationOverride,
      escalationId,
      overrideExpiresAt,
    );
    return { ...state, escalationOverrideToken, overrideExpiresAt };
  }

  /**
   * One decision on many escalations (the console sends the ids of the rows a person selected under a filter): each
   * id is decided on its own, and the answer says per id what happened; one refused id never stops the others.
   */
  async resolveEscalations(
    tenantId: string | null,
    escalationIds: string[],
    input: { action: 'approve' | 'deny'; reason?: string },
    decidedBy: Decider,
  ): Promise<BulkOutcome[]> {
    const ids = [...new Set(escalationIds)];
    if (ids.length < 1 || ids.length > BULK_RESOLVE_LIMIT)
      throw errors.unprocessable(`between 1 and ${BULK_RESOLVE_LIMIT} escalation ids`);
    const outcomes: BulkOutcome[] = [];
    for (const escalationId of ids) {
      try {
        const r = await this.resolveEscalation(tenantId, escalationId, input, decidedBy);
        outcomes.push({
          escalationId,
          outcome: input.action === 'approve' ? 'approved' : 'denied',
          state: r,
          escalationOverrideToken: r.escalationOverrideToken,
          overrideExpiresAt: r.overrideExpiresAt,
        });
      } catch (err) {
        if (!(err instanceof ServiceError)) throw err;
        const outcome =
          err.code === 'X402_ESCALATION_TERMINAL'
            ? 'already_decided'
            : err.code === 'X402_ESCALATION_DEADLINE_PASSED'
              ? 'deadline_passed'
              : err.code === 'NOT_FOUND'
                ? 'not_found'
                : null;
        if (!outcome) throw err;
        outcomes.push({ escalationId, outcome, message: err.message });
      }
    }
    return outcomes;
  }
}

export type BulkOutcome =
  | {
      escalationId: string;
      outcome: 'approved' | 'denied';
      state: EscalationState;
      escalationOverrideToken: string | null;
      overrideExpiresAt: Date | null;
    }
  | { escalationId: string; outcome: 'already_decided' | 'deadline_passed' | 'not_found'; message: string };

export interface EscalationSweepSummary {
  looked: number;
  /** Denied by this sweep because their deadline passed (their gates' reserves returned). */
  denied: number;
  failed: number;
}

/**
 * The escalations' deadlines: reads only the escalations that have fallen due (their due index, then each by `_id`).
 * Past its deadline an undecided escalation is denied (`deadline_passed`, decided by `deadline`) by the same insert a
 * person's decision races through; then its gate's one commitment takes the expiry (racing an authorization) and,
 * if the expiry won, the reserve goes back; then the `x402.escalation.denied` event. Every step is a unique insert or
 * a ledger entry with a derived id, and the due record goes last, so a crash anywhere is finished by the next look.
 */
export class X402EscalationDeadlines {
  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  /** Sweeps `partition` of the deadlines (every partition when none is given; see sweepDue). */
  async sweep(partition?: number): Promise<EscalationSweepSummary> {
    const summary: EscalationSweepSummary = { looked: 0, denied: 0, failed: 0 };
    const counts = await sweepDue(
      this.runtime,
      'x402-escalations',
      this.store.escalationsDue,
      this.runtime.config.sweeper.intervalMs,
      (id) => this.decideAtDeadline(id, summary),
      partition,
    );
    return Object.assign(summary, counts);
  }

  private async decideAtDeadline(escalationId: string, summary: EscalationSweepSummary): Promise<DueLook> {
    const escalation = await this.store.escalationOf(escalationId);
    if (!escalation) return 'done'; // its escalate died before recording it: nothing waits
    let resolution = await this.store.resolutionOf(escalationId);
    if (!resolution) {
      const deadlineAt = deadlineOf(escalation);
      if (Date.now() < deadlineAt.getTime()) return { lookAgainAt: deadlineAt };
      const deny: ResolutionDoc = {
        _id: escalationId,
        action: 'deny',
        reason: DEADLINE_PASSED,
        by: { kind: 'deadline' },
        at: new Date(),
      };
      const recorded = await this.store.recordResolution(deny);
      resolution = recorded.resolution!;
      if (recorded.won) summary.denied++;
      if (recorded.won) logStep(this.runtime, 'x402.escalation.decided', decidedFields(escalation, resolution));
      failpoint('x402.escalation.deadline.denied');
    }
    // A person or a wind-down decided first: their decision is carried out by its own path.
    if (resolution.by.kind !== 'deadline') return 'done';
    await this.returnGateReserve(escalation);
    await emitEvent(
      this.runtime,
      escalation.tenantId,
      'x402.escalation.denied',
      escalationEvent(escalation, resolution),
      `x402.escalation.denied:${escalationId}`,
    );
    return 'done';
  }

  /** The gate waiting on the escalation expires (unless it was authorized, cancelled or voided first) and its lock goes back. */
  private async returnGateReserve(escalation: EscalationDoc): Promise<void> {
    const gate = await this.store.gateById(escalation.gateId);
    if (!gate) return;
    const commitment = await this.store.recordExpiry(gate);
    failpoint('x402.escalation.deadline.expired');
    if (commitment.kind !== 'expired') return; // the gate's own paths (and its sweep) carry out what won
    // Nothing locked yet (a create still running): the gate's sweep returns it once the create recorded it.
    if ((await this.gates.returnReserve(gate)) === 'none') return;
    failpoint('x402.escalation.deadline.returned');
    await emitEvent(
      this.runtime,
      gate.tenantId,
      'x402.gate.expired',
      gateExpiredEvent(gate, 'escalation_deadline', gate.amount),
      `x402.gate.expired:${gate._id}`,
    );
  }
}
