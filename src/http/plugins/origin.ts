// Host and Origin validation for routes that ask for it (`config.checkOrigin`: /mcp), before authentication: a page
// of another site, or a name rebound to this machine (DNS rebinding), is refused 403 before any key is looked at,
// and never reaches a tool.
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { serviceError } from '../../domain/errors.ts';
import { refusedOrigin } from '../../domain/origins.ts';
import type { Runtime } from '../../runtime.ts';
import { sendError } from './errors.ts';

declare module 'fastify' {
  interface FastifyContextConfig {
    checkOrigin?: boolean;
  }
}

export default fp(async function originPlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { config } = opts.runtime;
  const policy = {
    publicBaseUrl: config.publicBaseUrl,
    allowedOrigins: config.mcp.allowedOrigins,
    allowLoopback: config.mcp.allowLoopback,
  };
  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.config.checkOrigin !== true) return;
    const header = (name: string) => {
      const value = request.headers[name];
      return Array.isArray(value) ? value.join(',') : value;
    };
    const refusal = refusedOrigin(policy, { host: header('host'), origin: header('origin') });
    if (!refusal) return;
    return sendError(
      request,
      reply,
      serviceError('FORBIDDEN', `${refusal.reason}: this endpoint answers only its own host and allowed origins`, {
        header: refusal.header,
      }),
    );
  });
});
