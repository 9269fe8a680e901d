// x402 escalations: a payment a wallet policy refuses becomes an escalation a person approves (with a one-time
// override token) or denies; listed newest first per tenant, or per gate from its quotes.
import { errors, x402Error } from '../domain/errors.ts';
import { escalationIdFor, OVERRIDE_TTL_SECONDS, TOKEN_AUDIENCE, type PolicyBreach } from '../domain/x402.ts';
import type { Runtime } from '../runtime.ts';
import type { EscalationDoc, GateDoc, QuoteDoc, ResolutionDoc } from '../store/x402.ts';
import { emitEvent } from './events.ts';
import type { X402Tokens } from './x402-tokens.ts';

/** Index records one escalation page may read past filtered-out ones before it hands back a cursor. */
const ESCALATION_SCAN_BUDGET = 500;

export interface EscalationState {
  escalation: EscalationDoc;
  resolution: ResolutionDoc | null;
}

export function escalationStatus(e: EscalationState): 'pending' | 'approved' | 'denied' {
  return !e.resolution ? 'pending' : e.resolution.action === 'approve' ? 'approved' : 'denied';
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
    ...(resolution ? { reason: resolution.reason } : {}),
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

  async escalate(gate: GateDoc, quote: QuoteDoc, walletId: string, breach: PolicyBreach): Promise<EscalationState> {
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
  async gateEscalationIds(gateId: string): Promise<string[]> {
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
    const escalationOverrideToken = await this.tokens.sign({ gateId: escalation.gateId, quoteId: escalation.quoteId }, TOKEN_AUDIENCE.escalationOverride, escalationId, overrideExpiresAt);
    return { ...state, escalationOverrideToken, overrideExpiresAt };
  }
}
