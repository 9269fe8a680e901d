import { Type, type Static } from 'typebox';
import { SCOPES } from '../../domain/scopes.ts';
import type { ApiKeyDoc } from '../../store/api-keys.ts';
import type { TenantDoc } from '../../store/tenants.ts';
import { TenantId, Timestamp } from './common.ts';

const RateLimitPolicy = Type.Object(
  {
    limit: Type.Integer({ minimum: 1, maximum: 10_000_000 }),
    windowSeconds: Type.Integer({ minimum: 1, maximum: 86_400 }),
  },
  { additionalProperties: false },
);
export const CreateTenant = Type.Object(
  { name: Type.String({ minLength: 1, maxLength: 200 }), rateLimit: Type.Optional(RateLimitPolicy) },
  { additionalProperties: false, examples: [{ name: 'Acme Research', rateLimit: { limit: 600, windowSeconds: 60 } }] },
);
export const Tenant = Type.Object({
  tenantId: Type.String(),
  name: Type.String(),
  rateLimit: Type.Union([RateLimitPolicy, Type.Null()]),
  createdAt: Timestamp,
});
const ScopeSchema = Type.Union(SCOPES.map((s) => Type.Literal(s)));
export const CreateApiKey = Type.Object(
  {
    tenantId: Type.String({ minLength: 1 }),
    scopes: Type.Array(ScopeSchema, { minItems: 1, maxItems: SCOPES.length }),
    description: Type.Optional(Type.String({ maxLength: 500 })),
    expiresAt: Type.Optional(Timestamp),
  },
  {
    additionalProperties: false,
    examples: [
      {
        tenantId: 'ten_8JcW2nQ5rT7yB4mK1xZ9pLs3',
        scopes: ['agents:write', 'runs:write', 'runs:read'],
        description: 'CI runner',
        expiresAt: '2027-01-01T00:00:00Z',
      },
    ],
  },
);
export const ApiKey = Type.Object({
  keyId: Type.String(),
  tenantId: Type.String(),
  scopes: Type.Array(Type.String()),
  description: Type.Union([Type.String(), Type.Null()]),
  status: Type.Union([Type.Literal('active'), Type.Literal('revoked'), Type.Literal('expired')]),
  expiresAt: Type.Union([Timestamp, Type.Null()]),
  createdAt: Timestamp,
  revokedAt: Type.Union([Timestamp, Type.Null()]),
  rotatedTo: Type.Union([Type.String(), Type.Null()]),
});
export const IssuedApiKey = Type.Intersect([
  ApiKey,
  Type.Object({ token: Type.String({ description: 'Shown once: `sk_<keyId>.<secret>`' }) }),
]);
export const ApiKeyParams = Type.Object({
  keyId: Type.String({
    pattern: '^(ak|key)_[A-Za-z0-9_-]{1,64}$',
    description: '`ak_…` (keys issued before API and agent key ids were told apart: `key_…`)',
  }),
});
export const Rotate = Type.Object(
  { gracePeriodSeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 604_800, default: 0 })) },
  { additionalProperties: false, examples: [{ gracePeriodSeconds: 3600 }] },
);
export const ListQuery = Type.Object({
  tenantId: Type.Optional(TenantId),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500, default: 100 })),
});

export function tenantView(t: TenantDoc): Static<typeof Tenant> {
  return { tenantId: t._id, name: t.name, rateLimit: t.rateLimit, createdAt: t.createdAt.toISOString() };
}

export function keyView(k: ApiKeyDoc, now = new Date()): Static<typeof ApiKey> {
  const expired = k.expiresAt !== null && k.expiresAt.getTime() <= now.getTime();
  return {
    keyId: k._id,
    tenantId: k.tenantId,
    scopes: k.scopes,
    description: k.description,
    status: k.status === 'revoked' ? 'revoked' : expired ? 'expired' : 'active',
    expiresAt: k.expiresAt?.toISOString() ?? null,
    createdAt: k.createdAt.toISOString(),
    revokedAt: k.revokedAt?.toISOString() ?? null,
    rotatedTo: k.rotatedTo,
  };
}

export const LedgerAuditQuery = Type.Object(
  {
    full: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'Recompute from the first posting of every account, ignoring (and checking) the audit checkpoints; writes nothing',
      }),
    ),
  },
  { additionalProperties: false },
);
const AuditViolation = Type.Object({
  kind: Type.String({
    description:
      'sum_mismatch, escrow_mismatch, escrow_unattributed, reserve_negative, reserve_owner_missing, reserve_owner_cancelled, reserve_owner_finished, reserve_overdue, entry_overdue, entry_unbalanced, leg_posted_twice, chain_broken, checkpoint_mismatch, settlement_stuck',
  }),
  currency: Type.Optional(Type.String()),
  walletId: Type.Optional(Type.String()),
  owner: Type.Optional(Type.String({ description: 'The settlement id of the run or gate that owns the reserve' })),
  detail: Type.String(),
  amount: Type.Optional(Type.Integer({ description: 'integer minor units' })),
});
const AuditCurrency = Type.Object({
  credits: Type.Integer({
    description: 'Everything ever credited (there are no payouts): equals available + escrow + legs in flight',
  }),
  available: Type.Integer(),
  escrow: Type.Integer(),
  openReserves: Type.Integer({ description: 'The sum of open reserves: equals escrow' }),
});
export const LedgerAudit = Type.Object({
  clean: Type.Boolean({ description: 'No violation, and every account was read to its end' }),
  complete: Type.Boolean({
    description: 'Every account was read to its end within the time budget; else the next audit goes on from there',
  }),
  violations: Type.Array(AuditViolation),
  currencies: Type.Record(Type.String(), AuditCurrency),
  checked: Type.Object({
    wallets: Type.Integer(),
    accounts: Type.Integer(),
    accountsBehind: Type.Integer(),
    postingsRead: Type.Integer(),
    openReserves: Type.Integer(),
    inFlightEntries: Type.Integer({ description: 'Ledger entries being applied, not yet overdue' }),
  }),
  incremental: Type.Boolean(),
  tookMs: Type.Integer(),
  at: Timestamp,
});
