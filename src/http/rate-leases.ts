import { RateLimiterRes, type RateLimiterRedis } from 'rate-limiter-flexible';

// A credential's budget is counted in Redis so that every API process draws on one budget. A caller at a high rate
// would cost a Redis round trip per request (a tenth of a paid session call's CPU in the API); instead a process
// takes a lease of a few points at once and spends them itself. The Redis counter still counts every point handed
// out, and a lease is granted only the points the budget still had, so all processes together never let through
// more than the limit. A lease lives at most a second (and never past its window), as does a refusal a process
// remembers, so what others spent, or a budget reset, shows within a second. What a lease costs: points a process
// held when its lease ended are used by no one, so with N processes serving one credential it may be refused up to
// N x (lease - 1) requests short of its limit. A lease is at most 1% of the limit (at most 64 points), so budgets
// under 200 are drawn one point at a time, exactly as before; a caller slower than a lease a second draws one.

/** One request's draw: whether it may go on, what the budget has left (as this process knows it), when it renews. */
export interface Draw {
  allowed: boolean;
  remaining: number;
  msBeforeNext: number;
}

/** A lease is at most this fraction of the limit... */
const LEASE_SHARE_OF_LIMIT = 0.01;
/** ...and at most this many points. */
const MAX_LEASE = 64;
/** How long a lease (or a remembered refusal) lasts: one spent sooner makes the next twice as large, else half. */
export const LEASE_LIFETIME_MS = 1_000;
/** Leases kept per limiter before the expired ones are dropped. */
const LEASES_KEPT = 100_000;

interface Lease {
  /** Points granted to this process and not spent yet. */
  left: number;
  /** What the budget had left after the grant, outside this process. */
  remainingOutside: number;
  /** When the lease ends (epoch ms): its lifetime, or its window's end if sooner. */
  until: number;
  /** When the window this lease belongs to ends (epoch ms). */
  windowEnds: number;
  size: number;
  /** The draw taking the next lease: the others wait for it instead of taking leases of their own. */
  taking: Promise<void> | null;
}

export class LeasedLimiter {
  private readonly leases = new Map<string, Lease>();
  readonly maxLease: number;

  constructor(
    private readonly limiter: RateLimiterRedis,
    private readonly points: number,
    /** Whether this process's Redis connection is up. */
    private readonly connected: () => boolean,
  ) {
    this.maxLease = Math.max(1, Math.min(MAX_LEASE, Math.floor(points * LEASE_SHARE_OF_LIMIT)));
  }

  /** One point from this process's lease for `subject`, taking the next lease when it is spent or over. */
  async draw(subject: string): Promise<Draw> {
    // With Redis gone, a lease must not keep requests going: the draw asks Redis, fails, and the API answers 503 as
    // it does for any request during an outage.
    if (!this.connected()) return this.drawOne(subject);
    for (;;) {
      const lease = this.leases.get(subject);
      if (lease?.taking) {
        await lease.taking;
        continue;
      }
      const now = Date.now();
      const answer = lease && now < lease.until ? this.spend(lease) : null;
      if (answer) return answer;
      // Waiters resume beside the taker: when they spent all the new lease brought in, the taker goes round again.
      const taken = this.spend(await this.takeLease(subject, lease, now));
      if (taken) return taken;
    }
  }

  /** One point straight from Redis: what every route but a leased one draws, and a leased one while Redis is down. */
  async drawOne(subject: string): Promise<Draw> {
    try {
      const result = await this.limiter.consume(subject, 1);
      return { allowed: true, remaining: result.remainingPoints, msBeforeNext: result.msBeforeNext };
    } catch (rejection) {
      if (!(rejection instanceof RateLimiterRes)) throw rejection;
      return { allowed: false, remaining: 0, msBeforeNext: rejection.msBeforeNext };
    }
  }

  /** One point of the lease, or the refusal once the budget is spent everywhere; null when the lease is just empty. */
  private spend(lease: Lease): Draw | null {
    const msBeforeNext = Math.max(0, lease.windowEnds - Date.now());
    if (lease.left > 0) {
      lease.left -= 1;
      return { allowed: true, remaining: lease.remainingOutside + lease.left, msBeforeNext };
    }
    // Refused here for the rest of the lease, without asking Redis again.
    if (lease.remainingOutside === 0) return { allowed: false, remaining: 0, msBeforeNext };
    return null;
  }

  /** Takes the next lease for `subject`: twice the last one when that was spent within its lifetime, else half. */
  private async takeLease(subject: string, previous: Lease | undefined, now: number): Promise<Lease> {
    const size = previous && now < previous.until ? Math.min(this.maxLease, previous.size * 2) : Math.max(1, Math.floor((previous?.size ?? 1) / 2));
    const lease: Lease = { left: 0, remainingOutside: 0, until: 0, windowEnds: 0, size, taking: null };
    lease.taking = (async () => {
      let result: RateLimiterRes;
      try {
        result = await this.limiter.consume(subject, size);
      } catch (rejection) {
        if (!(rejection instanceof RateLimiterRes)) throw rejection; // Redis unreachable: the caller answers 503.
        result = rejection;
      }
      // The counter went up by `size` whether or not the budget had that much: this process owns what it had.
      lease.left = Math.max(0, Math.min(size, this.points - (result.consumedPoints - size)));
      lease.remainingOutside = Math.max(0, this.points - result.consumedPoints);
      const at = Date.now();
      lease.windowEnds = at + result.msBeforeNext;
      lease.until = Math.min(lease.windowEnds, at + LEASE_LIFETIME_MS);
    })().finally(() => {
      lease.taking = null;
    });
    lease.taking.catch(() => {
      if (this.leases.get(subject) === lease) this.leases.delete(subject); // the next draw tries again
    });
    if (this.leases.size >= LEASES_KEPT) this.dropExpired(now);
    this.leases.set(subject, lease);
    await lease.taking;
    return lease;
  }

  private dropExpired(now: number): void {
    for (const [subject, lease] of this.leases) if (!lease.taking && lease.until <= now) this.leases.delete(subject);
    if (this.leases.size >= LEASES_KEPT) this.leases.clear(); // still full: points held now go unused this window
  }
}
