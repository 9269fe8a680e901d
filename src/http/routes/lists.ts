import type { FastifyInstance } from 'fastify';
import type { Scope } from '../../domain/scopes.ts';
import type { Runtime } from '../../runtime.ts';
import { listPage } from '../../services/lists.ts';
import { x402Service } from '../../services/x402/service.ts';
import { LIST_KINDS, type ListKind } from '../../store/list-index.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses } from '../schemas/common.ts';
import { LIST_SHAPES, listPageSchema, listQuery, type ListQueryParams } from '../schemas/lists.ts';

/** The read scope each list needs of a tenant key (a write scope implies its read). */
const READ_SCOPE: Record<ListKind, Scope> = {
  runs: 'runs:read',
  agents: 'agents:read',
  settlements: 'runs:read',
  disputes: 'runs:read',
  gates: 'x402:read',
  escalations: 'x402:read',
  sessions: 'x402:read',
};

const upperFirst = (s: string) => s[0]!.toUpperCase() + s.slice(1);

/**
 * Every list twice: `GET /v1/<kind>` for a tenant key (its tenant only) and `GET /ops/<kind>` for the operator
 * (every tenant, or one with `tenantId`). The admin credential belongs to no tenant, so it reads under /ops like
 * every other operator route, and a tenant route never takes a tenant from the query.
 */
export async function listRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const x402 = x402Service(runtime);
  app.addHook('onClose', () => x402.close());

  for (const kind of LIST_KINDS) {
    const shape = LIST_SHAPES[kind];
    const response = {
      200: listPageSchema(shape.item),
      ...errorResponses(400, 401, 403, { 422: ['VALIDATION_FAILED'] }),
    };
    const page = async (tenantId: string | null, q: ListQueryParams) => {
      const { items, nextCursor } = await listPage(runtime, x402, kind, { ...q, tenantId });
      return { items: items.map((s) => (shape.view as (x: unknown) => unknown)(s)), nextCursor };
    };

    app.get<{ Querystring: ListQueryParams }>(
      `/v1/${shape.path}`,
      {
        config: { access: READ_SCOPE[kind] },
        schema: {
          tags: ['lists'],
          operationId: `listTenant${upperFirst(kind)}`,
          summary: `${shape.noun} of the tenant, newest first (paged; filters by status, agent and creation time)`,
          querystring: listQuery(shape.statuses, false),
          response,
        },
      },
      async (request) => page(tenantOf(request), request.query),
    );

    app.get<{ Querystring: ListQueryParams }>(
      `/ops/${shape.path}`,
      {
        config: { access: 'admin' },
        schema: {
          tags: ['ops'],
          operationId: `listAll${upperFirst(kind)}`,
          summary: `${shape.noun} of every tenant (or of \`tenantId\`), newest first (paged)`,
          querystring: listQuery(shape.statuses, true),
          response,
        },
      },
      async (request) => page(request.query.tenantId ?? null, request.query),
    );
  }
}
