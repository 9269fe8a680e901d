import { createHash } from 'node:crypto';
import type { Collection, Db } from 'mongodb';
import { Cluster } from 'ioredis';
import type { RedisClient } from '../redis.ts';
import { insertFirst } from './mongo.ts';

/**
 * Which Redis server processes hold this deployment's keys: the run ids of the masters. Every event that can lose
 * Redis' last writes changes it: a restart (from an append-only file cut short, or empty) starts a new process, and a
 * failover promotes a replica, another process. A partition that heals without a failover loses nothing and keeps
 * it. MongoDB records each lineage once (a unique insert), and once more when what Redis may have lost was put back.
 */
interface LineageDoc {
  _id: string;
  runIds: string[];
  at: Date;
}

export class RedisLineageStore {
  private readonly lineages: Collection<LineageDoc>;

  constructor(
    db: Db,
    private readonly redis: RedisClient,
  ) {
    this.lineages = db.collection<LineageDoc>('redis_lineages');
  }

  /** The masters' run ids, sorted, and their digest (the lineage's `_id`). */
  async current(): Promise<{ id: string; runIds: string[] }> {
    const masters = this.redis instanceof Cluster ? this.redis.nodes('master') : [this.redis];
    const infos = await Promise.all(masters.map((node) => node.info('server')));
    const runIds = infos.map((info) => /^run_id:(\w+)/m.exec(info)?.[1] ?? 'unknown').sort();
    return { id: createHash('sha256').update(runIds.join(',')).digest('hex').slice(0, 32), runIds };
  }

  /** True once what a loss under this lineage may have cost was put back (see services/redis-loss.ts). */
  async reconciled(id: string): Promise<boolean> {
    return (await this.lineages.findOne({ _id: `${id}:reconciled` }, { projection: { _id: 1 } })) !== null;
  }

  /** Records the lineage (once) and, when `reconciled`, that its reconciliation finished. */
  async record(id: string, runIds: string[], reconciled: boolean): Promise<void> {
    await insertFirst(this.lineages, { _id: reconciled ? `${id}:reconciled` : id, runIds, at: new Date() });
  }
}
