import type { Runtime } from '../runtime.ts';
import { X402GateExpiry } from '../services/x402/expiry.ts';
import { RedisLossWatch } from '../services/redis-loss.ts';
import { x402Service } from '../services/x402/service.ts';
import type { QueueProcessor } from './runner.ts';

/**
 * Decides a verified x402 gate and moves its money through the settlement machinery (see X402Service.processVerify).
 * Safe to run twice or on two workers at once: every step is a unique insert or a ledger entry with a derived id.
 * Its sweep returns the reserves of gates past their deadline and finishes what a crash left half-done
 * (services/x402-expiry.ts), denies the escalations past their deadline (services/x402-escalations.ts), then closes the payment sessions past their expiry (services/x402-sessions.ts).
 */
export function createX402VerifyProcessor(runtime: Runtime): QueueProcessor<'x402-verify'> {
  const service = x402Service(runtime);
  const expiry = new X402GateExpiry(runtime, service);
  const redisLoss = new RedisLossWatch(runtime, service.sessions);
  return {
    process: ({ tenantId, gateId, report }) => service.verification.processVerify(tenantId, gateId, report),
    // First what Redis may have lost (a look that costs one INFO unless its masters changed; partition 0's sweep
    // does it for all); then the partition's share of the gates, with the escalations' and the sessions' beside it.
    sweepsPerPartition: true,
    sweep: async (partition) => {
      const redis =
        partition === undefined || partition === 0
          ? await redisLoss.look().catch((err: unknown) => {
              runtime.logger.warn({ err }, 'could not check whether Redis lost writes; the next sweep looks again');
              return null;
            })
          : null;
      return {
        ...(await expiry.sweep(partition)),
        escalations: await service.escalationDeadlines.sweep(partition),
        sessions: await service.sessions.sweep(partition),
        redisReconciled: redis?.reconciled ?? false,
      };
    },
  };
}
