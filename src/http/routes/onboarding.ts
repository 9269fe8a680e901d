import type { FastifyInstance } from 'fastify';
import type { Static } from 'typebox';
import { RUNTIME_TARGETS } from '../../domain/onboarding.ts';
import type { Runtime } from '../../runtime.ts';
import { firstPaidCallHistory, paidCallAttemptId, runFirstPaidCall } from '../../services/first-paid-call.ts';
import { bootstrapRuntime, conformanceMatrix, smokeTest } from '../../services/onboarding.ts';
import { parseIdempotencyKey } from '../plugins/idempotency.ts';
import { tenantOf } from '../plugins/auth.ts';
import { emptyBodyIsObject, errorResponses } from '../schemas/common.ts';
import {
  ConformanceBody,
  ConformanceMatrix,
  FirstPaidCall,
  FirstPaidCallBody,
  firstPaidCallView,
  History,
  historyBefore,
  HistoryQuery,
  historyView,
  RuntimeBootstrap,
  SmokeTestBody,
  SmokeTestResult,
  smokeTestView,
  TenantParams,
} from '../schemas/onboarding.ts';

export async function onboardingRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const runtime = opts.runtime;
  const tags = ['onboarding'];
  // x-api-key (admin key, or a tenant key with `onboarding`) or the buyer session cookie, bound to {tenantId}.
  const access = 'onboarding' as const;
  const prefix = '/v1/tenants/:tenantId/onboarding';

  app.post<{ Params: Static<typeof TenantParams> }>(
    `${prefix}/runtime-bootstrap`,
    {
      config: { access },
      schema: {
        tags,
        operationId: 'bootstrapRuntime',
        summary: 'Issue a runtime API key and the MCP configuration carrying it (the key is shown once)',
        params: TenantParams,
        response: { 201: RuntimeBootstrap, ...errorResponses(401, 403, 404) },
      },
    },
    async (request, reply) => reply.status(201).send(await bootstrapRuntime(runtime, tenantOf(request))),
  );

  app.post<{ Params: Static<typeof TenantParams>; Body: Static<typeof SmokeTestBody> }>(
    `${prefix}/runtime-bootstrap/smoke-test`,
    {
      config: { access },
      schema: {
        tags,
        operationId: 'runSmokeTest',
        summary:
          'Start the MCP server with this env on the smoke-test queue: initialize, tools/list and a whoami call; 502 names the failing step',
        params: TenantParams,
        body: SmokeTestBody,
        response: { 200: SmokeTestResult, ...errorResponses(400, 401, 403, 404, { 502: ['MCP_SMOKE_TEST_FAILED'] }) },
      },
    },
    async (request) => smokeTestView(await smokeTest(runtime, tenantOf(request), request.body.env)),
  );

  app.post<{ Params: Static<typeof TenantParams>; Body: Static<typeof FirstPaidCallBody> }>(
    `${prefix}/first-paid-call`,
    {
      config: { access },
      preValidation: emptyBodyIsObject,
      schema: {
        tags,
        operationId: 'runFirstPaidCall',
        summary:
          'A real x402 paid call through this API; retrying with the same Idempotency-Key resumes the same attempt',
        params: TenantParams,
        body: FirstPaidCallBody,
        response: {
          200: FirstPaidCall,
          ...errorResponses(400, 401, 403, 404, { 409: ['TRANSITION_ILLEGAL'], 502: ['SETTLD_API_CALL_FAILED'] }),
        },
      },
    },
    async (request) => {
      const idempotencyKey = parseIdempotencyKey(
        request.headers['idempotency-key'] ?? request.headers['x-idempotency-key'],
      );
      const tenantId = tenantOf(request);
      const attemptId = paidCallAttemptId(tenantId, idempotencyKey);
      return firstPaidCallView(
        await runFirstPaidCall(runtime, tenantId, { attemptId, sponsorWalletId: request.body.sponsorWalletId ?? null }),
      );
    },
  );

  app.get<{ Params: Static<typeof TenantParams>; Querystring: Static<typeof HistoryQuery> }>(
    `${prefix}/first-paid-call/history`,
    {
      config: { access },
      schema: {
        tags,
        operationId: 'listFirstPaidCalls',
        summary: 'First paid call attempts, newest first (paged)',
        params: TenantParams,
        querystring: HistoryQuery,
        response: { 200: History, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const tenantId = tenantOf(request);
      const page = await firstPaidCallHistory(
        runtime,
        tenantId,
        request.query.limit ?? 20,
        historyBefore(tenantId, request.query.cursor),
      );
      return historyView(tenantId, page);
    },
  );

  app.post<{ Params: Static<typeof TenantParams>; Body: Static<typeof ConformanceBody> }>(
    `${prefix}/conformance-matrix`,
    {
      config: {
        access,
        tenantRateLimit: { name: 'conformance-matrix', policy: runtime.config.onboarding.conformanceRateLimit },
      },
      preValidation: emptyBodyIsObject,
      schema: {
        tags,
        operationId: 'runConformanceMatrix',
        summary:
          "Bootstrap, smoke test and first paid call once; each runtime's configuration snippet with the checks (rate-limited per tenant)",
        params: TenantParams,
        body: ConformanceBody,
        response: { 200: ConformanceMatrix, ...errorResponses(400, 401, 403, 404, 429) },
      },
    },
    async (request) => {
      const matrix = await conformanceMatrix(runtime, tenantOf(request), request.body.targets ?? [...RUNTIME_TARGETS]);
      const paid = matrix.checks.firstPaidCall;
      return {
        ...matrix,
        checks: {
          ...matrix.checks,
          firstPaidCall: { ...paid, result: paid.result ? firstPaidCallView(paid.result) : null },
        },
      };
    },
  );
}
