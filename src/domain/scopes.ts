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
