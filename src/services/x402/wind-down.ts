// x402 wind-down: an agent's wind-down is a fact (first call wins); its gates nobody authorized are cancelled and
// their escrow returned, their quotes die, pending escalations are denied; authorized gates wait for their
// verification (or the sweeper's return). The summary is recorded once.
import { errors } from '../../domain/errors.ts';
import { failpoint } from '../../domain/failpoints.ts';
import type { Runtime } from '../../runtime.ts';
import type { ResolutionDoc, WindDownSummary } from '../../store/x402.ts';
import { emitEvent } from '../events.ts';
import { escalationEvent, type X402Escalations } from './escalations.ts';
import type { X402Gates } from './gates.ts';
import type { X402Sessions } from './sessions.ts';

export class X402WindDown {
  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
    private readonly escalations: X402Escalations,
    private readonly sessions: X402Sessions,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  /**
   * Winds an agent down: the wind-down is a fact (first call wins); every gate of the agent that nobody authorized
   * is cancelled and its escrow returned, its live quotes die with it, pending escalations are denied. Authorized
   * gates stay reserved for their verification. The summary is recorded once, so a repeat answers it unchanged.
   */
  async windDown(
    tenantId: string,
    agentId: string,
    input: { reasonCode?: string; reasonMessage?: string },
  ): Promise<WindDownSummary> {
    const { agents } = this.runtime.stores;
    if (!(await agents.belongsTo(tenantId, agentId))) throw errors.notFound('agent');
    const recorded = await this.store.windDownSummaryOf(agentId);
    if (recorded) return recorded;
    await this.store.recordWindDown({
      _id: agentId,
      tenantId,
      reasonCode: input.reasonCode ?? null,
      reasonMessage: input.reasonMessage ?? null,
      at: new Date(),
    });
    failpoint('x402.wind-down.recorded');
    // Every process caches whether an agent is wound down (requireLiveAgents): tell them at once, before the slower
    // unwinding below, so that staleness is bounded by the pub/sub latency (and this answer comes after it). If the
    // publish fails this answers 503 with the fact recorded: a repeat (the summary is not recorded yet) publishes
    // again and finishes the unwinding; meanwhile commitments and the create's exact re-read keep the money right.
    await this.runtime.credentials.invalidate('agent', agentId, { required: true });
    const [fact] = await Promise.all([this.store.windDownOf(agentId), agents.markWoundDown(agentId)]);
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
      sessionsClosed: [],
      escrowReturned: [],
    };
    const returned = new Map<string, { walletId: string; currency: string; amount: number }>();
    const head = await this.store.agentGates.head(agentId);
    const walked = new Set<string>();
    for (let seq = 1; seq <= head; seq++) {
      const slot = await this.store.agentGates.get(agentId, seq);
      if (!slot || walked.has(slot.ref)) continue; // a resumed create indexes its gate again
      walked.add(slot.ref);
      if (slot.ref.startsWith('ses_')) {
        // A payment session the agent pays or is paid by: it closes (its charges settle, the rest goes back).
        const close = await this.sessions.windDown(slot.ref, agentId);
        if (close?.reason === 'wound_down' && close.woundDownAgentId === agentId) {
          summary.sessionsClosed!.push(slot.ref);
          const { walletId, currency, refunded } = close.statement.body;
          const key = `${walletId}|${currency}`;
          const entry = returned.get(key) ?? { walletId, currency, amount: 0 };
          entry.amount += refunded;
          returned.set(key, entry);
        }
        continue;
      }
      const gate = await this.store.gateById(slot.ref);
      if (!gate) continue; // a gate whose funding was refused
      const [existing, verification] = await Promise.all([
        this.store.commitmentOf(gate._id),
        this.store.verificationOf(gate._id),
      ]);
      const commitment = existing ?? (verification ? null : await this.gates.cancelGate(gate, agentId));
      if (commitment?.kind === 'cancellation' && commitment.windDownOf === agentId) {
        if (existing) await this.gates.cancelGate(gate, agentId); // finish a return a crash may have left undone
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
      for (const escalationId of await this.escalations.gateEscalationIds(gate._id)) {
        const escalation = await this.store.escalationOf(escalationId);
        if (!escalation) continue;
        const deny: ResolutionDoc = {
          _id: escalationId,
          action: 'deny',
          reason: 'agent wound down',
          by: { kind: 'wind-down', agentId },
          at: new Date(),
        };
        const { resolution } = await this.store.recordResolution(deny);
        if (resolution?.by.kind === 'wind-down' && resolution.by.agentId === agentId) {
          summary.escalationsDenied.push(escalationId);
          await emitEvent(
            this.runtime,
            tenantId,
            'x402.escalation.denied',
            escalationEvent(escalation, resolution),
            `x402.escalation.denied:${escalationId}`,
          );
        }
      }
    }
    summary.escrowReturned = [...returned.values()];
    const final = await this.store.recordWindDownSummary(agentId, summary);
    await emitEvent(this.runtime, tenantId, 'x402.agent.wound_down', { ...final }, `x402.agent.wound_down:${agentId}`);
    return final;
  }
}
