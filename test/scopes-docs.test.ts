import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { grants, SCOPES } from '../src/domain/scopes.ts';

// The README's scope table and the OpenAPI document's `x-required-scope` say the same thing, and the document keeps
// the rule the table states: every read of a kind needs that kind's read scope (reading one agent needed runs:read
// while listing agents needed agents:read, and agents:read was missing from the README).
const root = new URL('..', import.meta.url);
const readme = readFileSync(new URL('README.md', root), 'utf8');
const document = JSON.parse(readFileSync(new URL('openapi/openapi.json', root), 'utf8')) as {
  paths: Record<string, Record<string, { operationId: string; 'x-required-scope'?: string }>>;
};

/** Credentials that are not tenant scopes: any tenant key (`tenant`), the admin key itself (`admin`). */
const NOT_SCOPES = new Set(['tenant', 'admin']);

const operations = Object.entries(document.paths).flatMap(([path, item]) =>
  Object.entries(item).map(([method, op]) => ({ method: method.toUpperCase(), path, ...op })),
);

function readmeScopeTable(): Array<{ scope: string; implies: string[] }> {
  const start = readme.indexOf('| scope | implies |');
  expect(start, 'the README has a scope table').toBeGreaterThan(-1);
  const rows = readme.slice(start).split('\n').slice(2);
  const table = rows.slice(
    0,
    rows.findIndex((line) => !line.startsWith('|')),
  );
  return table.map((line) => {
    const [scope, implies] = line.split('|').slice(1, 3);
    return {
      scope: /`([^`]+)`/.exec(scope!)![1]!,
      implies: [...implies!.matchAll(/`([^`]+)`/g)].map((m) => m[1]!),
    };
  });
}

/**
 * The kind a path reads: its last static segment that names one (`/v1/runs/{runId}/deliveries` reads webhook
 * deliveries, `/x402/wallets/{walletId}/policy` a wallet's policy).
 */
const KIND_SCOPE: Record<string, string> = {
  agents: 'agents:read',
  runs: 'runs:read',
  artifacts: 'runs:read',
  settlement: 'runs:read',
  settlements: 'runs:read',
  disputes: 'runs:read',
  verification: 'runs:read',
  wallets: 'wallets:read',
  webhooks: 'webhooks:read',
  deliveries: 'webhooks:read',
  endpoints: 'webhooks:read',
  gate: 'x402:read',
  gates: 'x402:read',
  escalations: 'x402:read',
  sessions: 'x402:read',
  facilitator: 'x402:read',
};

function readScopeOfPath(path: string): string | undefined {
  const kinds = path
    .split('/')
    .filter((s) => s && !s.startsWith('{'))
    .reverse();
  const kind = kinds.find((s) => s in KIND_SCOPE);
  return kind && KIND_SCOPE[kind];
}

describe('scopes: the README, the OpenAPI document and the rule agree', () => {
  it('lists every scope the service knows, with the read scope each write scope implies', () => {
    const table = readmeScopeTable();
    const listed = table.flatMap((row) => [row.scope, ...row.implies]);
    expect([...listed].sort()).toEqual([...SCOPES].sort());
    for (const { scope, implies } of table) {
      for (const other of SCOPES) {
        expect(grants([scope], other), `${scope} grants ${other}`).toBe(other === scope || implies.includes(other));
      }
    }
  });

  it('lists exactly the scopes the operations require', () => {
    const required = new Set(operations.flatMap((op) => op['x-required-scope'] ?? []));
    const tenantScopes = [...required].filter((s) => !NOT_SCOPES.has(s)).sort();
    const table = readmeScopeTable();
    expect(tenantScopes).toEqual([...new Set(table.flatMap((row) => [row.scope, ...row.implies]))].sort());
    // And nothing requires a scope the service cannot grant.
    for (const scope of tenantScopes) expect(SCOPES as readonly string[]).toContain(scope);
  });

  it("has every tenant read (GET) need its kind's read scope, and every change a write scope", () => {
    const reads = operations.filter(
      (op) => op.method === 'GET' && op['x-required-scope'] && !NOT_SCOPES.has(op['x-required-scope']),
    );
    const wrong = reads
      .filter((op) => !['ops', 'onboarding'].includes(op['x-required-scope']!))
      .map((op) => ({ op: `${op.method} ${op.path}`, scope: op['x-required-scope'], kind: readScopeOfPath(op.path) }))
      .filter((r) => r.scope !== r.kind);
    expect(wrong).toEqual([]);
    expect(reads.find((op) => op.operationId === 'getAgent')?.['x-required-scope']).toBe('agents:read');

    // POSTs that only look something up (a payment's status by the body a provider sent to settle) read.
    const lookups = new Set(['getFacilitatorPaymentStatus']);
    const changesWithReadScope = operations
      .filter((op) => op.method !== 'GET' && op['x-required-scope']?.endsWith(':read') && !lookups.has(op.operationId))
      .map((op) => `${op.method} ${op.path}`);
    expect(changesWithReadScope).toEqual([]);
  });
});
