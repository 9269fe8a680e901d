import { MongoClient } from 'mongodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testEnv } from '../helpers/context.ts';

/**
 * Lookups by `_id` must use the `_id` index on the server the project runs: on FerretDB that needs the build patch
 * in scripts/install-ferretdb.sh (without it every lookup scans its collection, so cost grows with the data).
 */
describe('lookups by _id use the _id index', () => {
  let client: MongoClient;
  const env = testEnv();
  beforeAll(async () => {
    client = new MongoClient(env.vars.MONGO_URL!);
    await client.connect();
  });
  afterAll(async () => {
    await client
      .db()
      .dropDatabase()
      .catch(() => undefined);
    await client.close();
  });

  it('plans findOne({_id}) as an index search, among 50,000 documents, and any other filter as a scan', async () => {
    const coll = client.db().collection<{ _id: string; n: number }>('plan_probe');
    for (let batch = 0; batch < 10; batch++) {
      await coll.insertMany(Array.from({ length: 5_000 }, (_, i) => ({ _id: `doc_${batch}_${i}`, n: i })));
    }
    const plan = (filter: Record<string, unknown>) => client.db().command({ explain: { find: 'plan_probe', filter } });
    const byId = await plan({ _id: 'doc_7_4242' });
    const byOther = await plan({ _id: 'doc_7_4242', n: 4242 });
    if (byId.serverInfo?.ferretdbVersion) {
      expect(byId.queryPlanner.Plan.join(' ')).toMatch(/SEARCH .* USING INDEX .*__id_/);
      expect(byOther.queryPlanner.Plan.join(' ')).toMatch(/SCAN/);
    } else {
      expect(JSON.stringify(byId.queryPlanner.winningPlan)).toMatch(/IDHACK|EXPRESS_IXSCAN|IXSCAN/);
    }
    expect(await coll.findOne({ _id: 'doc_7_4242' })).toEqual({ _id: 'doc_7_4242', n: 4242 });
  });
});
