// The x402 gates' deadlines: every funded gate's reserve ends paid, refunded or returned, at the latest one sweep
// after its deadline. The sweeper reads only the gates that have fallen due (the gates' due index, then each gate by
// `_id`) and decides each by the same unique inserts the requests race through, so it can never take a fate a
// request already took:
// - a held gate (funded, nobody authorized it) past its deadline (the gate TTL, or its current quote if that lives
//   longer) gets the commitment `expired`, racing authorization, cancellation and voiding for the gate's one
//   commitment; whichever won is then carried out;
// - an authorized gate past its token's expiry plus the grace, or whose payer or payee is wound down, gets its
//   verification slot filled with its return, racing the provider's report; the verify decision then refunds it;
// - half-done work is finished: a cancelled or expired gate's lock is returned (also a lock its create recorded after
//   the cancellation), a voided gate whose report was lost is refunded, a reported gate is decided and settled.
import { failpoint } from '../../domain/failpoints.ts';
import { authorizationDeadline, heldGateDeadline } from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import type { CommitmentDoc, GateDoc, VerificationDoc } from '../../store/x402.ts';
import { emitEvent } from '../events.ts';
import { sweepDue, type DueLook } from '../sweep-items.ts';
import { gateExpiredEvent } from './gates.ts';
import type { X402Service } from './service.ts';

/** A create records its lock right after its gate: a closed gate this old without a lock entry never gets one. */
const LOCK_GRACE_MS = 60_000;

export interface GateSweepSummary {
  /** Gates looked at. */
  looked: number;
  /** Reserves returned because their deadline passed (held gates' unlocks, authorized gates' refunds). */
  expired: number;
  /** Locks of cancelled gates returned (a wind-down's return a crash left undone). */
  returned: number;
  /** Reported gates (or voided ones whose report was lost) decided and handed to their settlement. */
  settled: number;
  /** Gates whose look failed: each backs off alone and is counted; the sweep went on. */
  failed: number;
}

export class X402GateExpiry {
  constructor(
    private readonly runtime: Runtime,
    private readonly x402: X402Service,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  /** Looks at every gate that has fallen due; one failing gate never stops the others. */
  async sweep(partition?: number): Promise<GateSweepSummary> {
    const summary: GateSweepSummary = { looked: 0, expired: 0, returned: 0, settled: 0, failed: 0 };
    const counts = await sweepDue(
      this.runtime,
      'x402-gates',
      this.store.due,
      this.runtime.config.sweeper.intervalMs,
      (gateId) => this.settleGate(gateId, summary),
      partition,
    );
    return Object.assign(summary, counts);
  }

  /** Carries out whatever the gate's facts say is due now. */
  private async settleGate(gateId: string, summary: GateSweepSummary): Promise<DueLook> {
    const gate = await this.store.gateById(gateId);
    if (!gate) return 'done'; // its create died before recording it, or its funding was refused: nothing held
    const [commitment, verification] = await Promise.all([
      this.store.commitmentOf(gateId),
      this.store.verificationOf(gateId),
    ]);
    if (verification || commitment?.kind === 'voided') return this.settleReported(gate, verification, summary);
    if (commitment?.kind === 'cancellation' || commitment?.kind === 'expired')
      return this.returnClosed(gate, commitment, summary);
    if (commitment?.kind === 'authorization') return this.expireAuthorized(gate, commitment, summary);
    return this.expireHeld(gate, summary);
  }

  /** A reported gate is decided and settled; a voided one whose report a crash lost is refunded like any failure. */
  private async settleReported(
    gate: GateDoc,
    verification: VerificationDoc | null,
    summary: GateSweepSummary,
  ): Promise<DueLook> {
    if (!verification) {
      await this.store.recordVerification({
        _id: gate._id,
        tenantId: gate.tenantId,
        verificationStatus: 'failed',
        evidence: { responseSha256: null, providerSignature: null },
        at: new Date(),
      });
    }
    await this.x402.verification.processVerify(gate.tenantId, gate._id);
    summary.settled++;
    return 'done';
  }

  /** A cancelled or expired gate's lock goes back (once, by its unlock entry), with an event for an expiry. */
  private async returnClosed(gate: GateDoc, commitment: CommitmentDoc, summary: GateSweepSummary): Promise<DueLook> {
    const lock = await this.x402.gates.returnReserve(gate);
    if (lock === 'none') {
      // Nothing locked yet: a create still running may record its lock (it then finds the gate closed) until the grace.
      const graceEnds = gate.createdAt.getTime() + LOCK_GRACE_MS;
      return Date.now() < graceEnds ? { lookAgainAt: new Date(graceEnds) } : 'done';
    }
    if (commitment.kind === 'expired') {
      await emitEvent(
        this.runtime,
        gate.tenantId,
        'x402.gate.expired',
        gateExpiredEvent(gate, 'gate_ttl', gate.amount),
        `x402.gate.expired:${gate._id}`,
        { test: gate.test === true },
      );
      summary.expired++;
    } else {
      summary.returned++;
    }
    return 'done';
  }

  /**
   * An authorized gate nobody reported by its deadline, or whose payer or payee is wound down (no success report may
   * come any more), is returned: its verification slot takes the return and the decision refunds the payer.
   */
  private async expireAuthorized(
    gate: GateDoc,
    authorization: Extract<CommitmentDoc, { kind: 'authorization' }>,
    summary: GateSweepSummary,
  ): Promise<DueLook> {
    const deadline = authorizationDeadline(authorization.expiresAt, this.runtime.config.x402);
    const woundDown = await this.x402.gates.anyWoundDown([gate.payerAgentId, gate.payeeAgentId]);
    if (!woundDown && Date.now() < deadline.getTime()) return { lookAgainAt: deadline };
    const won = await this.x402.verification.recordReturn(gate, woundDown ? 'wound_down' : 'expired');
    failpoint('x402.expire.returned');
    await this.x402.verification.processVerify(gate.tenantId, gate._id);
    if (won.verificationStatus === 'expired') summary.expired++;
    else summary.settled++;
    return 'done';
  }

  /** A held gate past its deadline expires (a wound-down party's gate is cancelled at once); then its lock goes back. */
  private async expireHeld(gate: GateDoc, summary: GateSweepSummary): Promise<DueLook> {
    const woundDown = await this.x402.gates.anyWoundDown([gate.payerAgentId, gate.payeeAgentId]);
    if (woundDown) {
      // The create raced the wind-down and died before it could see it (the wind-down's walk missed the gate).
      await this.x402.gates.cancelGate(gate, woundDown);
      return this.settleGate(gate._id, summary);
    }
    const { quote } = await this.store.currentQuote(gate._id);
    const deadline = heldGateDeadline(gate.createdAt, quote?.expiresAt ?? null, this.runtime.config.x402).getTime();
    const now = Date.now();
    if (now < deadline) {
      // An authorization may come first, with a deadline as near as the grace: look again by then at the latest.
      const { authorizationGraceSeconds } = this.runtime.config.x402;
      return {
        lookAgainAt: new Date(
          Math.min(deadline, now + Math.max(authorizationGraceSeconds * 1000, this.runtime.config.sweeper.intervalMs)),
        ),
      };
    }
    await this.store.recordExpiry(gate);
    failpoint('x402.expire.committed');
    // Whichever commitment won (the expiry, or an authorization or cancellation just before it) is carried out.
    return this.settleGate(gate._id, summary);
  }
}
