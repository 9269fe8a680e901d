import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import type { Runtime } from '../../runtime.ts';
import { X402FacilitatorService } from '../../services/x402/facilitator.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses } from '../schemas/common.ts';
import {
  FacilitatorBody,
  PaymentParams,
  PaymentStatusResponse,
  SettleResponse,
  SupportedResponse,
  VerifyResponse,
} from '../schemas/x402-facilitator.ts';

/** The x402 v2 facilitator API: a refused payment is a 200 with the protocol's reason, as stock clients expect. */
export async function x402FacilitatorRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const service = new X402FacilitatorService(opts.runtime);
  app.addHook('onClose', () => service.close());
  const tags = ['x402 facilitator'];

  app.post<{ Body: Static<typeof FacilitatorBody> }>(
    '/x402/facilitator/verify',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'verifyFacilitatorPayment',
        summary:
          'Verify an escrow-gate payment before serving: the token offline against the key ring, its bindings, the gate',
        body: FacilitatorBody,
        response: { 200: VerifyResponse, ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => service.verify(tenantOf(request), request.body),
  );

  app.post<{ Body: Static<typeof FacilitatorBody> }>(
    '/x402/facilitator/settle',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'settleFacilitatorPayment',
        summary: "Settle a served escrow-gate payment through the gate's verify; a repeat answers the same settlement",
        body: FacilitatorBody,
        response: { 200: SettleResponse, ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => service.settle(tenantOf(request), request.body),
  );

  app.get<{ Params: Static<typeof PaymentParams> }>(
    '/x402/facilitator/payments/:paymentId',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'getFacilitatorPayment',
        summary:
          'Where a payment stands (after a settle whose answer was lost): unknown, authorized, settling, settled or refused, with the answer settle gave',
        params: PaymentParams,
        response: { 200: PaymentStatusResponse, ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => service.paymentStatus(tenantOf(request), request.params.paymentId),
  );

  app.post<{ Body: Static<typeof FacilitatorBody> }>(
    '/x402/facilitator/status',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'getFacilitatorPaymentStatus',
        summary: 'The same lookup with the body settle was sent (what a resource server has at hand); moves nothing',
        body: FacilitatorBody,
        response: { 200: PaymentStatusResponse, ...errorResponses(400, 401, 403, 422) },
      },
    },
    async (request) => service.paymentStatusOf(tenantOf(request), request.body),
  );

  // Public, as the x402 facilitator API has it (stock tools ask it without a key); rate limited per IP like the other
  // public routes. It names the deployment's schemes and network only.
  app.get(
    '/x402/facilitator/supported',
    {
      config: { access: 'public' },
      schema: {
        tags,
        operationId: 'getFacilitatorSupported',
        summary:
          "The payment kinds this facilitator settles (public): x402 v2, schemes escrow-gate and escrow-session, this deployment's CAIP-2 network, and the legacy network ids still accepted, with the end of their window",
        response: { 200: SupportedResponse },
      },
    },
    async () => service.supported(),
  );
}
