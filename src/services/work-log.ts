import type { Runtime } from '../runtime.ts';

// Logs that follow the work: one info line per finished step of money and evidence, its `msg` one of WORK_STEPS
// (docs/operations.md lists them with their fields). Each is written after the step's durable fact is recorded,
// by the caller that recorded it; a caller that only finished a step another one recorded marks it `repeat: true`.
// Fields are ids, amounts (integer minor units) and outcomes only: never a key, token, signature or secret, which
// is why a field can only hold a plain value.

export const WORK_STEPS = [
  'run.finalized',
  'settlement.decided',
  'settlement.released',
  'settlement.refunded',
  'x402.gate.decided',
  'x402.session.opened',
  'x402.session.closed',
  'x402.escalation.decided',
] as const;

export type WorkStep = (typeof WORK_STEPS)[number];

export type StepFields = { tenantId: string } & Record<string, string | number | boolean | null | undefined>;

export function logStep(runtime: Pick<Runtime, 'logger'>, step: WorkStep, fields: StepFields): void {
  runtime.logger.info(fields, step);
}
