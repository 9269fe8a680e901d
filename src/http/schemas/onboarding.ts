import { Type, type Static } from 'typebox';
import { decodeCursor, encodeCursor } from '../../store/paging.ts';
import {
  paidCallIndexId,
  type PaidCallAttemptDoc,
  type PaidCallResultDoc,
  type SmokeTestDoc,
} from '../../store/onboarding.ts';
import { errors } from '../../domain/errors.ts';
import { RUNTIME_TARGETS } from '../../domain/onboarding.ts';
import type { FirstPaidCallResult } from '../../services/first-paid-call.ts';
import { Cursor, TenantId, Timestamp } from './common.ts';

export const TenantParams = Type.Object({ tenantId: TenantId });

export const McpEnv = Type.Object(
  {
    SERVICE_BASE_URL: Type.String({ minLength: 1, maxLength: 2048 }),
    SERVICE_TENANT_ID: Type.String({ minLength: 1, maxLength: 128 }),
    SERVICE_API_KEY: Type.String({ minLength: 1, maxLength: 512 }),
  },
  { additionalProperties: false, description: 'Exactly the three variables of the MCP server' },
);

const McpLaunch = Type.Object(
  {
    command: Type.String({
      description: 'absolute path of the Node binary of the machine this service is installed on',
    }),
    args: Type.Array(Type.String(), {
      description: "the absolute path of this installation's `bin/agent-settlement.js`, then `mcp`",
    }),
    env: McpEnv,
  },
  { description: 'The stdio server: runs from any directory of the machine this package is installed on' },
);

const McpHttp = Type.Object(
  {
    type: Type.Literal('http'),
    url: Type.String({ description: "this service's MCP endpoint, `<PUBLIC_BASE_URL>/mcp` (Streamable HTTP)" }),
    headers: Type.Object({ Authorization: Type.String({ description: '`Bearer sk_…`: the runtime key' }) }),
  },
  { description: 'The same tools by URL, for MCP clients that take one' },
);

export const RuntimeBootstrap = Type.Object({
  tenantId: Type.String(),
  apiKey: Type.Object({
    keyId: Type.String({ description: '`ak_…`' }),
    scopes: Type.Array(Type.String()),
    expiresAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: "null: until revoked; the conformance matrix's key expires by itself after an hour",
    }),
  }),
  mcp: McpLaunch,
  mcpHttp: McpHttp,
  mcpConfigJson: Type.String({
    description: 'The `{"mcpServers": {...}}` document to paste (the stdio server), as a JSON string',
  }),
});

export const BuyerSession = Type.Object({
  tenantId: Type.String(),
  expiresAt: Timestamp,
  cookie: Type.Object(
    { name: Type.String(), path: Type.String(), sameSite: Type.Literal('Strict') },
    { description: 'The session itself is only in Set-Cookie (HttpOnly)' },
  ),
});

export const SmokeTestBody = Type.Object(
  { env: McpEnv },
  {
    additionalProperties: false,
    examples: [
      {
        env: {
          SERVICE_BASE_URL: 'http://127.0.0.1:3000',
          SERVICE_TENANT_ID: 'ten_8JcW2nQ5rT7yB4mK1xZ9pLs3',
          SERVICE_API_KEY: 'sk_ak_3vR8tY1uI6oP0aS5dF2gH7jK.secret-from-runtime-bootstrap',
        },
      },
    ],
  },
);
export const SmokeTestResult = Type.Object({
  smokeTestId: Type.String(),
  passed: Type.Boolean(),
  serverInfo: Type.Union([Type.Object({ name: Type.String(), version: Type.String() }), Type.Null()]),
  toolNames: Type.Array(Type.String()),
  call: Type.Union([
    Type.Object({ tool: Type.String(), isError: Type.Boolean(), result: Type.Unknown() }),
    Type.Null(),
  ]),
  durationMs: Type.Integer(),
});

export function smokeTestView(doc: SmokeTestDoc): Static<typeof SmokeTestResult> {
  const { passed, serverInfo, toolNames, call, durationMs } = doc.outcome;
  return { smokeTestId: doc._id, passed, serverInfo, toolNames, call, durationMs };
}

export const FirstPaidCallBody = Type.Object(
  {
    sponsorWalletId: Type.Optional(
      Type.String({
        pattern: '^[A-Za-z0-9][A-Za-z0-9._:-]{2,200}$',
        description: 'pay from this sponsor wallet (needs its x402 policy) instead of a funded test payer',
      }),
    ),
  },
  { additionalProperties: false, examples: [{ sponsorWalletId: 'acme-sponsor-main' }] },
);

const Step = Type.Object({
  step: Type.String(),
  ok: Type.Boolean(),
  ms: Type.Integer(),
  status: Type.Optional(Type.Integer()),
  code: Type.Optional(Type.String()),
});
export const FirstPaidCall = Type.Object({
  attemptId: Type.String(),
  result: Type.Union([Type.Literal('passed'), Type.Literal('degraded')]),
  ids: Type.Record(Type.String(), Type.Union([Type.String(), Type.Null()])),
  steps: Type.Array(Step),
  checks: Type.Record(Type.String(), Type.Boolean()),
  finishedAt: Timestamp,
});

export function firstPaidCallView(r: FirstPaidCallResult): Static<typeof FirstPaidCall> {
  return { ...r, finishedAt: r.finishedAt.toISOString() };
}

export const HistoryQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 50, default: 20 })),
  cursor: Type.Optional(Cursor(400)),
});
const HistoryItem = Type.Object({
  attemptId: Type.String(),
  status: Type.Union([
    Type.Literal('passed'),
    Type.Literal('degraded'),
    Type.Literal('failed'),
    Type.Literal('running'),
  ]),
  createdAt: Timestamp,
  sponsorWalletId: Type.Union([Type.String(), Type.Null()]),
  result: Type.Union([FirstPaidCall, Type.Null()]),
  lastFailure: Type.Union([
    Type.Object({
      step: Type.String(),
      at: Timestamp,
      status: Type.Union([Type.Integer(), Type.Null()]),
      code: Type.String(),
      steps: Type.Array(Step),
    }),
    Type.Null(),
  ]),
});
export const History = Type.Object({
  items: Type.Array(HistoryItem),
  nextCursor: Type.Union([Type.String(), Type.Null()]),
});

/** The history cursor names the slot to continue below; one not issued for this tenant is a 400. */
export function historyBefore(tenantId: string, cursor: string | undefined): number | null {
  if (!cursor) return null;
  const decoded = decodeCursor(cursor);
  const seq = decoded?.id.startsWith(`${tenantId}#`) ? Number(decoded.id.slice(tenantId.length + 1)) : NaN;
  if (!Number.isSafeInteger(seq) || seq < 1)
    throw errors.unprocessable('cursor is not one this API issued', {
      errors: [{ path: 'querystring.cursor', message: 'invalid' }],
    });
  return seq;
}

export function historyView(
  tenantId: string,
  page: {
    items: Array<{ seq: number; attempt: PaidCallAttemptDoc; result: PaidCallResultDoc | null }>;
    nextBefore: number | null;
  },
): Static<typeof History> {
  const last = page.items.at(-1);
  return {
    items: page.items.map(({ attempt, result }) => ({
      attemptId: attempt._id,
      status: result ? result.result : attempt.lastFailure ? 'failed' : 'running',
      createdAt: attempt.createdAt.toISOString(),
      sponsorWalletId: attempt.sponsorWalletId,
      result: result
        ? firstPaidCallView({
            attemptId: result._id,
            result: result.result,
            ids: result.ids,
            steps: result.steps,
            checks: result.checks,
            finishedAt: result.finishedAt,
          })
        : null,
      lastFailure: attempt.lastFailure ? { ...attempt.lastFailure, at: attempt.lastFailure.at.toISOString() } : null,
    })),
    nextCursor:
      page.nextBefore !== null
        ? encodeCursor({ at: last?.attempt.createdAt ?? new Date(0), id: paidCallIndexId(tenantId, page.nextBefore) })
        : null,
  };
}

const Target = Type.Union(RUNTIME_TARGETS.map((t) => Type.Literal(t)));
export const ConformanceBody = Type.Object(
  {
    targets: Type.Optional(
      Type.Array(Target, {
        minItems: 1,
        maxItems: RUNTIME_TARGETS.length,
        uniqueItems: true,
        description: 'default: all five',
      }),
    ),
  },
  { additionalProperties: false, examples: [{ targets: ['claude', 'cursor'] }] },
);
const Check = Type.Union([Type.Literal('passed'), Type.Literal('degraded'), Type.Literal('failed')]);
export const ConformanceMatrix = Type.Object({
  tenantId: Type.String(),
  ready: Type.Boolean({ description: 'true only when every requested runtime is ready' }),
  apiKey: Type.Object({
    keyId: Type.String({ description: '`ak_…`' }),
    scopes: Type.Array(Type.String()),
    expiresAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: "null: until revoked; the conformance matrix's key expires by itself after an hour",
    }),
  }),
  checks: Type.Object({
    bootstrap: Type.Object({ status: Check }),
    smokeTest: Type.Object(
      {
        status: Check,
        smokeTestId: Type.Union([Type.String(), Type.Null()]),
        step: Type.Union([Type.String(), Type.Null()]),
      },
      { description: 'The stdio configuration: `mcp.command` spawned with `mcp.env`, tools listed, whoami called' },
    ),
    mcpHttp: Type.Object(
      { status: Check, step: Type.Union([Type.String(), Type.Null()]), toolCount: Type.Integer({ minimum: 0 }) },
      {
        description: 'The URL configuration: `mcpHttp.url` connected to with its headers, tools listed, whoami called',
      },
    ),
    firstPaidCall: Type.Object({
      status: Check,
      attemptId: Type.String(),
      step: Type.Union([Type.String(), Type.Null()]),
      result: Type.Union([FirstPaidCall, Type.Null()]),
    }),
  }),
  targets: Type.Array(
    Type.Object({
      target: Target,
      transport: Type.Union([Type.Literal('stdio'), Type.Literal('http')], {
        description: 'which configuration the snippet carries: the stdio command or the URL',
      }),
      format: Type.Union([Type.Literal('toml'), Type.Literal('json')]),
      file: Type.String({ description: 'where that runtime reads the snippet' }),
      content: Type.String({ description: "the snippet, in the runtime's own format" }),
      ready: Type.Boolean({
        description: "this runtime's configuration started and listed its tools, and the first paid call passed",
      }),
    }),
  ),
});
