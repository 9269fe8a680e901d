export const SCOPES = [
  'agents:write',
  'agents:read',
  'runs:write',
  'runs:read',
  'x402:write',
  'x402:read',
  'wallets:write',
  'wallets:read',
  'webhooks:write',
  'webhooks:read',
  'onboarding',
  'ops',
] as const;

export type Scope = (typeof SCOPES)[number];

/** A write scope implies its read scope. */
const IMPLIED: Partial<Record<Scope, Scope[]>> = {
  'agents:write': ['agents:read'],
  'runs:write': ['runs:read'],
  'x402:write': ['x402:read'],
  'wallets:write': ['wallets:read'],
  'webhooks:write': ['webhooks:read'],
};

export function grants(held: readonly string[], needed: Scope): boolean {
  for (const scope of held) {
    if (scope === needed) return true;
    if (IMPLIED[scope as Scope]?.includes(needed)) return true;
  }
  return false;
}

/**
 * A scope a route used to need and still accepts for a while, so keys issued under the old rule keep working while
 * their owners add the new scope. Each use is signalled (response headers `Deprecation` and `Sunset`, RFC 9745 and
 * RFC 8594, and one log line per key and route per process); from `until` on the old scope is refused like any other.
 */
export interface DeprecatedScope {
  scope: Scope;
  /** When the route stopped needing `scope` (RFC 3339). */
  since: string;
  /** The end of the window (RFC 3339): from then on only the route's own scope passes. */
  until: string;
}

/** Reading one agent needed `runs:read` before every read of a kind needed that kind's read scope. */
export const AGENT_READ_WITH_RUNS_READ: DeprecatedScope = {
  scope: 'runs:read',
  since: '2026-11-28T00:00:00Z',
  until: '2027-06-01T00:00:00Z',
};

/** Whether `held` passes through a deprecated scope at `now`: only inside its window, and only when it grants it. */
export function grantsDeprecated(held: readonly string[], deprecated: DeprecatedScope, now: Date): boolean {
  return now.getTime() < Date.parse(deprecated.until) && grants(held, deprecated.scope);
}
