import type { RateLimitPolicy } from '../config.ts';
import { errors } from '../domain/errors.ts';
import type { Scope } from '../domain/scopes.ts';
import type { Runtime } from '../runtime.ts';
import type { ApiKeyDoc, IssuedKey } from '../store/api-keys.ts';
import type { TenantDoc } from '../store/tenants.ts';

export function createTenant(
  runtime: Runtime,
  input: { name: string; rateLimit?: RateLimitPolicy | null },
): Promise<TenantDoc> {
  return runtime.stores.tenants.create(input);
}

export function listTenants(runtime: Runtime, limit: number): Promise<TenantDoc[]> {
  return runtime.stores.tenants.list(limit);
}

/** Issues an API key for an existing tenant; the token (secret included) is in the result only, never stored. */
export async function issueApiKey(
  runtime: Runtime,
  input: { tenantId: string; scopes: Scope[]; description?: string; expiresAt?: Date | null },
): Promise<IssuedKey> {
  if (!(await runtime.stores.tenants.get(input.tenantId))) throw errors.notFound('tenant');
  if (input.expiresAt && input.expiresAt.getTime() <= Date.now()) {
    throw errors.unprocessable('expiresAt must be in the future', {
      errors: [{ path: 'body.expiresAt', message: 'must be in the future' }],
    });
  }
  return runtime.stores.apiKeys.issue(input);
}

export function listApiKeys(runtime: Runtime, filter: { tenantId?: string }, limit: number): Promise<ApiKeyDoc[]> {
  return runtime.stores.apiKeys.list(filter, limit);
}

/** Issues a successor key; the old one keeps working for the grace period, then stops on every process. */
export async function rotateApiKey(
  runtime: Runtime,
  keyId: string,
  gracePeriodSeconds: number,
): Promise<{ issued: IssuedKey; old: ApiKeyDoc }> {
  const rotated = await runtime.stores.apiKeys.rotate(keyId, gracePeriodSeconds);
  if (!rotated) throw errors.notFound('API key');
  if ('refused' in rotated) {
    const { status, rotatedTo } = rotated.refused;
    throw errors.transitionIllegal(
      rotatedTo ? `this key was already rotated to ${rotatedTo}` : `a ${status} key cannot be rotated`,
      rotatedTo ? 'rotated' : status,
    );
  }
  await runtime.credentials.invalidate('key', keyId);
  return rotated;
}

/** Revokes a key now, on every API process within the invalidation latency. */
export async function revokeApiKey(runtime: Runtime, keyId: string): Promise<ApiKeyDoc> {
  const key = await runtime.stores.apiKeys.revoke(keyId);
  if (!key) throw errors.notFound('API key');
  await runtime.credentials.invalidate('key', keyId);
  return key;
}
