/** Event types receivers can subscribe to (contract section 9). */
export const EVENT_TYPES = [
  'run.finalized',
  'settlement.completed',
  'settlement.held',
  'settlement.refunded',
  'settlement.holdback_released',
  'dispute.opened',
  'dispute.resolved',
  'escrow.returned',
  'x402.escalation.created',
  'x402.escalation.approved',
  'x402.escalation.denied',
  'x402.agent.wound_down',
  'x402.gate.expired',
  'x402.session.opened',
  'x402.session.closed',
  'x402.session.expired',
  /** Sent to one endpoint on request (POST /v1/webhooks/{id}/test), whatever it subscribes to. */
  'webhook.test',
] as const;

export type EventType = (typeof EVENT_TYPES)[number];

/**
 * What every settlement and dispute event names as the thing settled, in one shape whatever it is: the run, the
 * x402 gate or the x402 session, each key present and null when it does not apply. A gate names the run it pays
 * for when it was created for one (`gateRunId`); a session settlement names none (its internal run id is never shown).
 */
export interface SettlementSubject {
  runId: string | null;
  gateId: string | null;
  sessionId: string | null;
}

export function settlementSubject(settlement: {
  runId: string;
  gateId?: string | null;
  sessionId?: string | null;
  gateRunId?: string | null;
}): SettlementSubject {
  const gateId = settlement.gateId ?? null;
  const sessionId = settlement.sessionId ?? null;
  if (gateId) return { runId: settlement.gateRunId ?? null, gateId, sessionId };
  return { runId: sessionId ? null : settlement.runId, gateId, sessionId };
}
