import type { FastifyRequest } from 'fastify';
import { Type, type TSchema } from 'typebox';
import { CURRENCY_PATTERN, MAX_AMOUNT } from '../../domain/money.ts';

// Shared pieces of the route schemas; each area has its own module beside this one.

export const ErrorBody = Type.Object(
  {
    code: Type.String({ description: 'UPPER_SNAKE error code' }),
    message: Type.String(),
    details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
    requestId: Type.String(),
  },
  { $id: 'ErrorBody', description: 'Every error response' },
);

/**
 * A paging cursor as this API issues them (base64url), so a request the document allows always fits the URL limit:
 * every query and path parameter is bounded, and URLs past the limit (414) break the schema.
 */
export const Cursor = (maxLength: number, description = '`nextCursor` of the previous page') =>
  Type.String({ pattern: `^[A-Za-z0-9_-]{1,${maxLength}}$`, description });

export const TenantId = Type.String({ pattern: '^[A-Za-z0-9_-]{1,128}$', description: '`ten_…`' });

export const Timestamp = Type.String({ format: 'date-time', description: 'RFC 3339 UTC' });

/** Error codes a route answers under a status, beside the ones the platform gives every route (plugins/contract.ts). */
export type ErrorCodes = Partial<Record<number, readonly string[]>>;

/** Where a route's own error codes ride on its response schema until the contract plugin lists them. */
export const ERROR_CODES_KEY = 'x-error-codes';

/**
 * Standard error responses a route can produce, keyed by status; `{ 409: ['AGENT_EXISTS'] }` names the codes a
 * status carries on this route, so the document lists them for every operation.
 */
export function errorResponses(...statuses: Array<number | ErrorCodes>): Record<number, TSchema> {
  const responses: Record<number, TSchema> = {};
  for (const entry of statuses) {
    if (typeof entry === 'number') responses[entry] ??= Type.Ref('ErrorBody');
    else
      for (const [status, codes] of Object.entries(entry))
        responses[Number(status)] = Type.Ref('ErrorBody', { [ERROR_CODES_KEY]: [...(codes ?? [])] });
  }
  return responses;
}

export const IdempotencyHeaders = Type.Object({
  'idempotency-key': Type.Optional(
    Type.String({ description: '1-255 chars of [A-Za-z0-9._:-]; replays the first response' }),
  ),
});

/** preValidation hook for POSTs whose body is optional: no body at all is read as `{}` (a JSON `null` is not). */
export async function emptyBodyIsObject(request: FastifyRequest): Promise<void> {
  if (request.body === undefined) request.body = {};
}

export const AGENT_ID_PATTERN = '^[a-z0-9][a-z0-9._-]{0,63}:agent:[A-Za-z0-9._-]{1,128}$';
export const AgentId = Type.String({ pattern: AGENT_ID_PATTERN });
export const Amount = Type.Integer({ minimum: 1, maximum: MAX_AMOUNT, description: 'integer minor units' });
export const Currency = Type.String({ pattern: CURRENCY_PATTERN });
