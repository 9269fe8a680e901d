import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import { errors, ServiceError, serviceError } from '../../domain/errors.ts';
import type { Runtime } from '../../runtime.ts';
import { sessionCharges } from '../../services/x402/session-charges.ts';
import { x402Service } from '../../services/x402/service.ts';
import { tenantOf } from '../plugins/auth.ts';
import { idempotencyKeyOf } from '../plugins/idempotency.ts';
import { errorResponses, type ErrorCodes } from '../schemas/common.ts';
import { SessionChargeList, SessionChargesQuery, sessionChargesView } from '../schemas/x402-session-charges.ts';
import {
  Acknowledgements,
  AcknowledgementsBody,
  Charge,
  ChargeBody,
  chargeView,
  OpenSessionBody,
  Session,
  SessionDisputeBody,
  SessionDisputeOpened,
  SessionParams,
  sessionView,
  Statement,
  statementView,
} from '../schemas/x402-sessions.ts';

const sessionErrors = (...statuses: Array<number | ErrorCodes>) => errorResponses(400, 401, 403, 404, ...statuses);

/** x402 payment sessions: open (reserve a budget), charge per call (one request each), close (settle, return the rest). */
export async function x402SessionRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const service = x402Service(opts.runtime);
  app.addHook('onClose', () => service.close());
  const tags = ['x402 sessions'];

  app.post<{ Body: Static<typeof OpenSessionBody> }>(
    '/x402/sessions',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'openSession',
        summary:
          'Open a payment session: reserve a budget toward one payee or an allow-list, with a per-call maximum and an expiry',
        body: OpenSessionBody,
        response: {
          201: Session,
          ...sessionErrors(402, 410, {
            409: ['X402_WALLET_POLICY_VIOLATION'],
            422: ['VALIDATION_FAILED', 'IDEMPOTENCY_KEY_REUSED'],
          }),
        },
      },
    },
    async (request, reply) =>
      reply
        .status(201)
        .send(sessionView(await service.sessions.open(tenantOf(request), request.body, request.idempotencyScope))),
  );

  app.get<{ Params: Static<typeof SessionParams> }>(
    '/x402/sessions/:sessionId',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'getSession',
        summary: 'A session: its status, what it spent, what is left',
        params: SessionParams,
        response: { 200: Session, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => sessionView(await service.sessions.get(tenantOf(request), request.params.sessionId)),
  );

  app.post<{ Params: Static<typeof SessionParams>; Body: Static<typeof ChargeBody> }>(
    '/x402/sessions/:sessionId/charges',
    {
      // Idempotent by itself (the payment id, or the Idempotency-Key as one): the generic replay layer stays out.
      config: { access: 'x402:write', nativeIdempotency: true },
      schema: {
        tags,
        operationId: 'chargeSession',
        summary:
          'Charge one paid call against the session (one request): debits the budget and answers a signed receipt; the same payment id is charged once',
        params: SessionParams,
        body: ChargeBody,
        response: {
          201: Charge,
          ...sessionErrors(410, {
            409: [
              'X402_SESSION_CLOSED',
              'X402_SESSION_EXPIRED',
              'X402_SESSION_BUDGET_EXCEEDED',
              'X402_SESSION_LIMIT_EXCEEDED',
              'X402_SESSION_PAYEE_NOT_ALLOWED',
              'X402_SESSION_PAYMENT_REUSED',
              'X402_PAYEE_MISMATCH',
              'X402_REQUEST_BINDING_MISMATCH',
              'X402_USAGE_ABOVE_LIMIT',
            ],
            422: [
              'VALIDATION_FAILED',
              'X402_USAGE_METRIC_UNKNOWN',
              'X402_USAGE_COUNT_INVALID',
              'X402_USAGE_RECORD_INVALID',
              'X402_USAGE_PAYEE_SIGNATURE_INVALID',
              'X402_USAGE_PAYER_SIGNATURE_INVALID',
              'X402_USAGE_RECORD_MISMATCH',
              'X402_USAGE_ABOVE_CAP',
              'X402_USAGE_NOT_PRICED',
              'X402_USAGE_AND_AMOUNT',
              'X402_USAGE_REQUIRED',
            ],
          }),
        },
      },
    },
    async (request, reply) => {
      // Parsed even beside a body paymentId: a malformed key is 400 on every POST (contract section 4).
      const key = idempotencyKeyOf(request);
      const keyed = request.body.paymentId === undefined && key !== null;
      const paymentId = request.body.paymentId ?? key;
      // The schema cannot say "one of the body's paymentId and the header": a request without either satisfies it (422).
      if (!paymentId)
        throw errors.unprocessable(
          'a charge needs a paymentId (or an Idempotency-Key): it is what makes a retry charge once',
          { errors: [{ path: 'body.paymentId', message: 'required without an Idempotency-Key' }] },
        );
      const answer = await service.sessions
        .charge(tenantOf(request), request.params.sessionId, { ...request.body, paymentId })
        .catch((err: unknown) => {
          // A key sent as a header answers as on every other POST: same key, other request is 422 (contract section 4).
          if (keyed && err instanceof ServiceError && err.code === 'X402_SESSION_PAYMENT_REUSED') {
            throw serviceError(
              'IDEMPOTENCY_KEY_REUSED',
              'this Idempotency-Key was used for a different charge',
              err.details,
            );
          }
          throw err;
        });
      if (keyed && answer.repeated) reply.header('idempotent-replayed', 'true');
      return reply.status(201).send(chargeView(answer));
    },
  );

  app.post<{ Params: Static<typeof SessionParams> }>(
    '/x402/sessions/:sessionId/close',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'closeSession',
        summary:
          'Close a session: charges stop, the unspent budget goes back at once, each payee is settled; the statement is signed',
        params: SessionParams,
        response: { 200: Session, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => sessionView(await service.sessions.close(tenantOf(request), request.params.sessionId)),
  );

  app.get<{ Params: Static<typeof SessionParams> }>(
    '/x402/sessions/:sessionId/statement',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'getSessionStatement',
        summary:
          "A closed session's signed statement: every charge, the totals, the refund (verifiable offline with /.well-known/jwks.json)",
        params: SessionParams,
        response: { 200: Statement, ...errorResponses(400, 401, 403, 404, { 409: ['TRANSITION_ILLEGAL'] }) },
      },
    },
    async (request) => {
      const { close, charges } = await service.sessions.statement(tenantOf(request), request.params.sessionId);
      return statementView(close, charges);
    },
  );

  app.get<{ Params: Static<typeof SessionParams>; Querystring: Static<typeof SessionChargesQuery> }>(
    '/x402/sessions/:sessionId/charges',
    {
      config: { access: 'x402:read' },
      schema: {
        tags,
        operationId: 'listSessionCharges',
        summary:
          "A session's charges, newest first, while it runs and after (each seq the budget handed out: charged, or void)",
        params: SessionParams,
        querystring: SessionChargesQuery,
        response: { 200: SessionChargeList, ...errorResponses(400, 401, 403, 404, { 422: ['VALIDATION_FAILED'] }) },
      },
    },
    async (request) =>
      sessionChargesView(
        await sessionCharges(opts.runtime, service.sessions, tenantOf(request), request.params.sessionId, {
          limit: request.query.limit ?? 50,
          cursor: request.query.cursor,
        }),
      ),
  );

  app.post<{ Params: Static<typeof SessionParams>; Body: Static<typeof AcknowledgementsBody> }>(
    '/x402/sessions/:sessionId/acknowledgements',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'acknowledgeSessionUsage',
        summary:
          "The payer acknowledges charges' usage after reading the responses (its agent's signatures over the usage records); idempotent",
        params: SessionParams,
        body: AcknowledgementsBody,
        response: {
          200: Acknowledgements,
          ...sessionErrors({
            409: ['X402_USAGE_ACK_AFTER_CLOSE'],
            422: [
              'VALIDATION_FAILED',
              'X402_USAGE_NOT_PRICED',
              'X402_USAGE_NOT_METERED',
              'X402_USAGE_PAYER_SIGNATURE_INVALID',
            ],
          }),
        },
      },
    },
    async (request) => ({
      acknowledgements: await service.sessions.acknowledge(
        tenantOf(request),
        request.params.sessionId,
        request.body.acknowledgements,
      ),
    }),
  );

  app.post<{ Params: Static<typeof SessionParams>; Body: Static<typeof SessionDisputeBody> }>(
    '/x402/sessions/:sessionId/disputes',
    {
      config: { access: 'x402:write' },
      schema: {
        tags,
        operationId: 'disputeSession',
        summary:
          'Dispute what a payee was paid at the close, inside the dispute window: freezes its holdback for an ops ruling',
        params: SessionParams,
        body: SessionDisputeBody,
        response: {
          201: SessionDisputeOpened,
          ...errorResponses(400, 401, 403, 404, {
            409: ['TRANSITION_ILLEGAL', 'X402_USAGE_ACKNOWLEDGED'],
            422: ['VALIDATION_FAILED'],
          }),
        },
      },
    },
    async (request, reply) =>
      reply.status(201).send(await service.sessions.dispute(tenantOf(request), request.params.sessionId, request.body)),
  );
}
