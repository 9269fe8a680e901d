import type { Collection, Document, Filter, FindOptions, OptionalUnlessRequiredId, UpdateFilter } from 'mongodb';

/** Every tenant-owned record carries its tenant. */
export interface TenantOwned {
  tenantId: string;
}

/**
 * A collection seen through one tenant: every read and write adds `tenantId` to its filter and every insert stamps
 * it, so forgetting the tenant is not something a repository can do by accident. Another tenant's record is simply
 * not found, which the API reports as 404.
 */
export class TenantScopedCollection<T extends TenantOwned & Document> {
  constructor(
    private readonly collection: Collection<T>,
    readonly tenantId: string,
  ) {}

  private scope(filter: Filter<T>): Filter<T> {
    return { ...filter, tenantId: this.tenantId } as Filter<T>;
  }

  findOne(filter: Filter<T>, options?: FindOptions) {
    return this.collection.findOne(this.scope(filter), options);
  }

  find(filter: Filter<T>, options?: FindOptions) {
    return this.collection.find(this.scope(filter), options);
  }

  insertOne(doc: Omit<T, 'tenantId'>) {
    return this.collection.insertOne({ ...doc, tenantId: this.tenantId } as unknown as OptionalUnlessRequiredId<T>);
  }

  updateOne(filter: Filter<T>, update: UpdateFilter<T>) {
    return this.collection.updateOne(this.scope(filter), update);
  }

  findOneAndUpdate(filter: Filter<T>, update: UpdateFilter<T>) {
    return this.collection.findOneAndUpdate(this.scope(filter), update, { returnDocument: 'after' });
  }
}
