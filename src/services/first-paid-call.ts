// The first paid call: a real x402 payment through this service's own HTTP API (contract sections 8 and 10), as a
// buyer's runtime would make it. Every step carries an idempotency key derived from the attempt, agent ids and the
// funding reference derive from it too, and the attempt's credential is derived (never stored), so running an
// attempt again after a crash anywhere repeats no effect: the money moves once.
import { createHmac } from 'node:crypto';
import { createLocalJWKSet, jwtVerify, type JSONWebKeySet } from 'jose';
import { tenantNamespace } from '../domain/agent-ids.ts';
import { canonicalize } from '../domain/canonical-json.ts';
import { newId, parsePrivateKey, publicKeyOf, sha256Hex } from '../domain/crypto.ts';
import { errors, serviceError } from '../domain/errors.ts';
import type { Scope } from '../domain/scopes.ts';
import type { Runtime } from '../runtime.ts';
import { isDuplicateKey } from '../store/mongo.ts';
import type { PaidCallResultDoc, PaidCallStep } from '../store/onboarding.ts';
import { revokeApiKey } from './tenants.ts';

/** Fault injection for tests: called after each completed step; throwing there simulates a crash between steps. */
export type Failpoint = (step: string) => void;
const noFailpoint: Failpoint = () => undefined;

const AMOUNT = 100;
const CURRENCY = 'USD';
const TOOL_ID = 'onboarding.first-paid-call';
/** An attempt can be resumed while its credential lives (well inside the idempotency retention of its steps). */
const ATTEMPT_CREDENTIAL_TTL_MS = 60 * 60 * 1000;
const CALL_TIMEOUT_MS = 15_000;
const SETTLEMENT_WAIT_MS = 15_000;
const PAID_CALL_SCOPES: Scope[] = ['agents:write', 'x402:write', 'wallets:write'];

export interface FirstPaidCallResult {
  attemptId: string;
  result: 'passed' | 'degraded';
  ids: Record<string, string | null>;
  steps: PaidCallStep[];
  checks: Record<string, boolean>;
  finishedAt: Date;
}

class StepFailed extends Error {
  constructor(
    readonly step: string,
    readonly status: number | null,
    readonly code: string,
    message: string,
    /** What the refused step's Retry-After said, when it said a number of seconds. */
    readonly retryAfterSeconds: number | null = null,
  ) {
    super(message);
  }
}

interface Caller {
  /** `acceptCodes`: error codes this step counts as done (an earlier run of the attempt already did it). */
  call(
    step: string,
    method: 'GET' | 'POST',
    path: string,
    options?: { body?: unknown; idempotencyKey?: string; acceptCodes?: string[] },
  ): Promise<{ status: number; body: Record<string, any> }>;
}

function caller(baseUrl: string, bearer: string): Caller {
  return {
    async call(step, method, path, options = {}) {
      const headers: Record<string, string> = { accept: 'application/json', authorization: `Bearer ${bearer}` };
      if (options.body !== undefined) headers['content-type'] = 'application/json';
      if (options.idempotencyKey) headers['idempotency-key'] = options.idempotencyKey;
      let res: Response;
      let body: Record<string, any>;
      try {
        res = await fetch(`${baseUrl}${path}`, {
          method,
          headers,
          body: options.body === undefined ? null : JSON.stringify(options.body),
          signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
        });
        body = (await res.json().catch(() => ({}))) as Record<string, any>;
      } catch (err) {
        // The reason names no header: the bearer is a credential.
        const cause = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).name;
        throw new StepFailed(step, null, 'SERVICE_UNREACHABLE', `${method} ${path} got no answer (${cause})`);
      }
      if (
        (res.status >= 200 && res.status < 300) ||
        (typeof body.code === 'string' && options.acceptCodes?.includes(body.code))
      )
        return { status: res.status, body };
      const retryAfter = Number(res.headers.get('retry-after'));
      throw new StepFailed(
        step,
        res.status,
        typeof body.code === 'string' ? body.code : `HTTP_${res.status}`,
        `${method} ${path} answered ${res.status}${typeof body.message === 'string' ? `: ${body.message}` : ''}`,
        Number.isSafeInteger(retryAfter) && retryAfter > 0 ? retryAfter : null,
      );
    },
  };
}

/** Key material derived from the service's session secret: the same attempt always gets the same, nobody else can. */
function derive(runtime: Runtime, purpose: string, attemptId: string): Buffer {
  return createHmac('sha256', runtime.config.onboarding.sessionSecret)
    .update(`first-paid-call\n${purpose}\n${attemptId}`)
    .digest();
}

/** The attempt's own tenant key: id and secret derive from the attempt, so a resumed attempt presents the same one. */
async function attemptCredential(
  runtime: Runtime,
  tenantId: string,
  attemptId: string,
  createdAt: Date,
): Promise<{ keyId: string; token: string }> {
  const keyId = `ak_fpc${derive(runtime, 'key-id', attemptId).toString('hex').slice(0, 24)}`;
  const secret = derive(runtime, 'key-secret', attemptId).toString('base64url');
  const existing = await runtime.stores.apiKeys.get(keyId);
  if (!existing) {
    try {
      await runtime.stores.apiKeys.issue({
        id: keyId,
        secret,
        tenantId,
        scopes: PAID_CALL_SCOPES,
        description: `first paid call ${attemptId}`,
        expiresAt: new Date(createdAt.getTime() + ATTEMPT_CREDENTIAL_TTL_MS),
      });
    } catch (err) {
      if (!isDuplicateKey(err)) throw err; // issued concurrently by another run of this attempt
    }
  } else if (existing.tenantId !== tenantId) {
    throw errors.notFound('first paid call attempt');
  }
  return { keyId, token: `sk_${keyId}.${secret}` };
}

/** The attempt id: derived from the caller's Idempotency-Key when there is one, so retrying the request resumes it. */
export function paidCallAttemptId(tenantId: string, idempotencyKey: string | null): string {
  return idempotencyKey ? `fpc_${sha256Hex(`${tenantId}\n${idempotencyKey}`).slice(0, 24)}` : newId('fpc');
}

/**
 * A sponsor wallet named by the caller must be one of theirs: a wrong id is the caller's mistake (404 before any
 * step runs), while a real wallet that cannot pay (no money, no policy) fails its step with 502 as the contract says.
 */
async function requireSponsorWallet(runtime: Runtime, tenantId: string, walletId: string): Promise<void> {
  const wallet = await runtime.stores.ledger.getWallet(walletId);
  if (wallet?.tenantId !== tenantId || wallet.kind !== 'sponsor') throw errors.notFound('sponsor wallet');
}

/**
 * Runs (or resumes) one attempt. A finished attempt answers with its recorded result. A failing API step answers
 * 502 SETTLD_API_CALL_FAILED naming the step, and is recorded on the attempt for the history.
 */
export async function runFirstPaidCall(
  runtime: Runtime,
  tenantId: string,
  input: { attemptId: string; sponsorWalletId?: string | null },
  failpoint: Failpoint = noFailpoint,
): Promise<FirstPaidCallResult> {
  const store = runtime.stores.onboarding;
  if (!(await runtime.stores.tenants.get(tenantId))) throw errors.notFound('tenant');
  const known = await store.attempt(input.attemptId);
  if (known && known.tenantId !== tenantId) throw errors.notFound('first paid call attempt');
  if (!known && input.sponsorWalletId) await requireSponsorWallet(runtime, tenantId, input.sponsorWalletId);
  // Starts the attempt, or returns it (finishing its history slot if a crash interrupted that).
  const attempt = await store.startAttempt({
    attemptId: input.attemptId,
    tenantId,
    sponsorWalletId: input.sponsorWalletId ?? null,
  });
  const finished = await store.result(attempt._id);
  if (finished) return resultView(finished);
  if (Date.now() - attempt.createdAt.getTime() > ATTEMPT_CREDENTIAL_TTL_MS) {
    throw errors.transitionIllegal('this attempt is too old to resume; start a new one', 'expired');
  }

  const attemptId = attempt._id;
  const sponsorWalletId = attempt.sponsorWalletId;
  const base = runtime.config.publicBaseUrl;
  const credential = await attemptCredential(runtime, tenantId, attemptId, attempt.createdAt);
  const api = caller(base, credential.token);
  const ops = caller(base, runtime.config.adminKey); // crediting is an ops action; the admin key never leaves this process
  const steps: PaidCallStep[] = [];
  const idem = (step: string) => `${attemptId}:${step}`;
  const step = async <T>(name: string, work: () => Promise<T>): Promise<T> => {
    const t0 = performance.now();
    let value: T;
    try {
      value = await work();
    } catch (err) {
      steps.push({
        step: name,
        ok: false,
        ms: Math.round(performance.now() - t0),
        ...(err instanceof StepFailed
          ? { code: err.code, ...(err.status !== null ? { status: err.status } : {}) }
          : {}),
      });
      throw err;
    }
    steps.push({ step: name, ok: true, ms: Math.round(performance.now() - t0) });
    failpoint(name);
    return value;
  };

  try {
    const register = (role: 'payer' | 'payee') =>
      step(`register-${role}`, async () => {
        const agentId = `${tenantNamespace(tenantId)}:agent:${attemptId}-${role}`;
        const publicKey = publicKeyOf(
          parsePrivateKey(derive(runtime, `agent-${role}`, attemptId).toString('base64url')),
        ).raw.toString('base64url');
        // The agent id is the attempt's own, so AGENT_EXISTS means an earlier run of this attempt registered it.
        await api.call(`register-${role}`, 'POST', '/v1/agents', {
          body: { agentId, publicKey, displayName: `first paid call ${role}` },
          idempotencyKey: idem(`register-${role}`),
          acceptCodes: ['AGENT_EXISTS'],
        });
        return agentId;
      });
    const payerAgentId = await register('payer');
    const payeeAgentId = await register('payee');

    let fundingEntryId: string | null = null;
    if (!sponsorWalletId) {
      fundingEntryId = await step('fund', async () => {
        const res = await ops.call('fund', 'POST', `/ops/wallets/${encodeURIComponent(payerAgentId)}/credit`, {
          body: { amount: AMOUNT, currency: CURRENCY, reference: `${attemptId}-fund` },
          idempotencyKey: idem('fund'),
        });
        return String(res.body.entryId);
      });
    }

    const gate = await step('gate-create', async () => {
      // Test traffic: its events reach only webhook endpoints that subscribe to test events, marked `"test": true`.
      const body = {
        payerAgentId,
        payeeAgentId,
        amount: AMOUNT,
        currency: CURRENCY,
        holdbackBps: 0,
        toolId: TOOL_ID,
        test: true,
        ...(sponsorWalletId ? { sponsorWalletId } : {}),
      };
      return (await api.call('gate-create', 'POST', '/x402/gate/create', { body, idempotencyKey: idem('gate-create') }))
        .body;
    });
    const gateId = String(gate.gateId);

    // The paid request, bound to the payment by its hash.
    const request = { tool: TOOL_ID, attemptId, input: { question: 'ping' } };
    const requestSha256 = sha256Hex(canonicalize(request));
    const quote = await step(
      'quote',
      async () =>
        (
          await api.call('quote', 'POST', '/x402/gate/quote', {
            body: { gateId, requestSha256, ttlSeconds: 300 },
            idempotencyKey: idem('quote'),
          })
        ).body,
    );
    const quoteId = String(quote.quoteId);

    let walletDecisionToken: string | undefined;
    if (sponsorWalletId) {
      walletDecisionToken = await step('wallet-authorize', async () => {
        const res = await api.call(
          'wallet-authorize',
          'POST',
          `/x402/wallets/${encodeURIComponent(sponsorWalletId)}/authorize`,
          { body: { gateId, quoteId, requestSha256 }, idempotencyKey: idem('wallet-authorize') },
        );
        return String(res.body.walletDecisionToken);
      });
    }

    const authorization = await step('authorize-payment', async () => {
      const body = { gateId, quoteId, requestSha256, ...(walletDecisionToken ? { walletDecisionToken } : {}) };
      return (
        await api.call('authorize-payment', 'POST', '/x402/gate/authorize-payment', {
          body,
          idempotencyKey: idem('authorize-payment'),
        })
      ).body;
    });

    // The provider: checks the payment token against the service's published keys (issued by this service, addressed
    // to the payee, for exactly this gate, quote, request and price), serves, and hashes its answer.
    const served = await step('provider-serve', async () => {
      const jwks = (await api.call('provider-serve', 'GET', '/.well-known/jwks.json')).body as JSONWebKeySet;
      let accepted = false;
      try {
        const { payload } = await jwtVerify(String(authorization.token), createLocalJWKSet(jwks), {
          issuer: base,
          audience: payeeAgentId,
          algorithms: ['EdDSA'],
        });
        accepted =
          payload.gateId === gateId &&
          payload.quoteId === quoteId &&
          payload.requestSha256 === requestSha256 &&
          payload.amount === AMOUNT &&
          payload.currency === CURRENCY &&
          payload.payee === payeeAgentId;
      } catch {
        accepted = false;
      }
      const response = { tool: TOOL_ID, attemptId, output: accepted ? { answer: 'pong' } : null };
      return { accepted, responseSha256: sha256Hex(canonicalize(response)) };
    });

    const verified = await step('verify', async () => {
      const body = {
        gateId,
        evidence: { responseSha256: served.responseSha256 },
        verificationStatus: served.accepted ? 'verified' : 'failed',
      };
      return (await api.call('verify', 'POST', '/x402/gate/verify', { body, idempotencyKey: idem('verify') })).body;
    });

    const settled = await step('settlement', async () => {
      const deadline = Date.now() + SETTLEMENT_WAIT_MS;
      let view = verified;
      while (view.status !== 'released' && view.status !== 'refunded' && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 200));
        view = (await api.call('settlement', 'GET', `/x402/gate/${encodeURIComponent(gateId)}`)).body;
      }
      const payee = (await api.call('settlement', 'GET', `/v1/wallets/${encodeURIComponent(payeeAgentId)}`)).body;
      return { view, payeeAvailable: Number(payee.balances?.[CURRENCY]?.available ?? 0) };
    });

    const released = Number(settled.view.settlement?.releasedAmount ?? 0);
    const checks = {
      paymentTokenVerified: served.accepted,
      settled: settled.view.status === 'released',
      payeePaid: released === AMOUNT && settled.payeeAvailable >= released,
    };
    const doc: PaidCallResultDoc = {
      _id: attemptId,
      tenantId,
      result: Object.values(checks).every(Boolean) ? 'passed' : 'degraded',
      ids: {
        attemptId,
        payerAgentId,
        payeeAgentId,
        sponsorWalletId,
        fundingEntryId,
        gateId,
        quoteId,
        authorizationRef: authorization.authorizationRef ? String(authorization.authorizationRef) : null,
        settlementId: settled.view.settlement?.settlementId ? String(settled.view.settlement.settlementId) : null,
      },
      steps,
      checks,
      finishedAt: new Date(),
    };
    const recorded = await store.recordResult(doc);
    await revokeApiKey(runtime, credential.keyId); // the attempt is over; its credential is not needed again
    return resultView(recorded);
  } catch (err) {
    if (!(err instanceof StepFailed)) throw err;
    await store.recordFailure(attemptId, { step: err.step, steps, at: new Date(), status: err.status, code: err.code });
    // A step told to wait (rate limited, or a backend briefly away) has not failed: the caller retries later with the
    // same Idempotency-Key and the attempt resumes at that step. Saying 502 would send them looking for a defect.
    if (err.status === 429 || err.status === 503) {
      const code = err.status === 429 ? 'RATE_LIMITED' : 'UNAVAILABLE';
      throw serviceError(
        code,
        `the first paid call must wait at ${err.step}: ${err.message}; retry with the same Idempotency-Key to resume`,
        {
          step: err.step,
          attemptId,
          retryAfterSeconds: err.retryAfterSeconds ?? 1,
          steps,
        },
      );
    }
    throw serviceError('SETTLD_API_CALL_FAILED', `the first paid call failed at ${err.step}: ${err.message}`, {
      step: err.step,
      attemptId,
      status: err.status,
      code: err.code,
      steps,
    });
  }
}

function resultView(doc: PaidCallResultDoc): FirstPaidCallResult {
  return {
    attemptId: doc._id,
    result: doc.result,
    ids: doc.ids,
    steps: doc.steps,
    checks: doc.checks,
    finishedAt: doc.finishedAt,
  };
}

export async function firstPaidCallHistory(runtime: Runtime, tenantId: string, limit: number, before: number | null) {
  return runtime.stores.onboarding.history(tenantId, limit, before);
}
