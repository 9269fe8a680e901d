import type { Collection, Db } from 'mongodb';
import type { RateLimitPolicy } from '../config.ts';
import { newId } from '../domain/crypto.ts';

export interface TenantDoc {
  _id: string;
  name: string;
  /** Overrides the service-wide rate limit for every credential of this tenant. */
  rateLimit: RateLimitPolicy | null;
  createdAt: Date;
}

export class TenantStore {
  private readonly tenants: Collection<TenantDoc>;

  constructor(db: Db) {
    this.tenants = db.collection<TenantDoc>('tenants');
  }

  async create(input: { name: string; rateLimit?: RateLimitPolicy | null }): Promise<TenantDoc> {
    const doc: TenantDoc = {
      _id: newId('ten'),
      name: input.name,
      rateLimit: input.rateLimit ?? null,
      createdAt: new Date(),
    };
    await this.tenants.insertOne(doc);
    return doc;
  }

  get(tenantId: string): Promise<TenantDoc | null> {
    return this.tenants.findOne({ _id: tenantId });
  }

  list(limit: number): Promise<TenantDoc[]> {
    return this.tenants.find({}).sort({ createdAt: -1 }).limit(limit).toArray();
  }
}
