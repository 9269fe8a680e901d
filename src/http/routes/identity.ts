import type { FastifyInstance } from 'fastify';
import { errors } from '../../domain/errors.ts';
import { errorResponses } from '../schemas/common.ts';
import { WhoAmI } from '../schemas/identity.ts';

export async function identityRoutes(app: FastifyInstance) {
  // Any valid tenant key may ask who it is: a client (the MCP server) proves its credentials before anything else.
  app.get(
    '/v1/whoami',
    {
      config: { access: 'tenant' },
      schema: {
        tags: ['identity'],
        operationId: 'whoAmI',
        summary: 'The tenant, key id and scopes of the calling API key',
        response: { 200: WhoAmI, ...errorResponses(401, 403) },
      },
    },
    async (request) => {
      const principal = request.principal;
      if (principal?.kind !== 'key') throw errors.unauthenticated();
      return { tenantId: principal.tenantId, keyId: principal.credentialId, scopes: principal.scopes };
    },
  );
}
