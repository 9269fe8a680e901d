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
