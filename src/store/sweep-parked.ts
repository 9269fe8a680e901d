import type { RedisClient } from '../redis.ts';

/**
 * Items a sweeper parked (they failed look after look; see services/sweep-items.ts), in a Redis sorted set per
 * sweeper scored by when they were parked, so that every process (the ledger audit behind `GET /ops/ledger/audit`
 * among them) sees what a worker parked. An item is removed when it recovers; one whose worker died parked stays
 * until a reader finds its work finished and removes it.
 */
export class SweepParkedIndex {
  constructor(
    private readonly redis: RedisClient,
    private readonly prefix: string,
  ) {}

  private key(sweeper: string): string {
    return `${this.prefix}:{sweep-parked}:${sweeper}`;
  }

  async park(sweeper: string, id: string, at = Date.now()): Promise<void> {
    await this.redis.zadd(this.key(sweeper), 'NX', at, id);
  }

  async unpark(sweeper: string, id: string): Promise<void> {
    await this.redis.zrem(this.key(sweeper), id);
  }

  /** The sweeper's parked items, longest parked first, at most `limit`. */
  async list(sweeper: string, limit: number): Promise<Array<{ id: string; parkedAt: number }>> {
    const flat = await this.redis.zrange(this.key(sweeper), 0, limit - 1, 'WITHSCORES');
    const items: Array<{ id: string; parkedAt: number }> = [];
    for (let i = 0; i < flat.length; i += 2) items.push({ id: flat[i]!, parkedAt: Number(flat[i + 1]) });
    return items;
  }
}
