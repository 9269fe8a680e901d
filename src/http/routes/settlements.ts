import type { FastifyInstance, FastifyReply } from 'fastify';
import { Type, type Static } from 'typebox';
import { canonicalize } from '../../domain/canonical-json.ts';
import { newId } from '../../domain/crypto.ts';
import { errors } from '../../domain/errors.ts';
import { jobIdFor } from '../../queues/index.ts';
import type { Runtime } from '../../runtime.ts';
import { emitEvent } from '../../services/events.ts';
import type { RunSettlementTerms } from '../../store/runs.ts';
import { readSettlement, type SettlementDoc, type SettlementState } from '../../store/settlements.ts';
import { disputeSplit } from '../../domain/money.ts';
import { tenantOf } from '../plugins/auth.ts';
import { errorResponses, Timestamp } from '../schemas.ts';
import { AGENT_ID_PATTERN } from './agents.ts';
import { Amount, Currency } from '../schemas/wallets.ts';

export const SettlementTermsSchema = Type.Object(
  {
    payerAgentId: Type.String({ pattern: AGENT_ID_PATTERN }),
    amount: Amount,
    currency: Currency,
    holdbackBps: Type.Optional(Type.Integer({ minimum: 0, maximum: 10_000, default: 0 })),
    disputeWindowSeconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 2_592_000, default: 86_400 })),
  },
  { additionalProperties: false },
);
type SettlementTermsInput = Static<typeof SettlementTermsSchema>;

export function escrowLockId(runId: string): string {
  return `escrow:${runId}:lock`;
}

export function settlementTerms(input: SettlementTermsInput): RunSettlementTerms {
  return {
    payerAgentId: input.payerAgentId,
    amount: input.amount,
    currency: input.currency,
    holdbackBps: input.holdbackBps ?? 0,
    disputeWindowSeconds: input.disputeWindowSeconds ?? 86_400,
  };
}

/**
 * Locks the run's amount in the payer's escrow, once per run (the entry id derives from the run), or throws 402
 * INSUFFICIENT_FUNDS having moved nothing. The payer must be an agent of the caller's tenant: one tenant can never
 * commit another's money.
 */
export async function lockEscrow(runtime: Runtime, tenantId: string, runId: string, payeeAgentId: string, terms: RunSettlementTerms): Promise<void> {
  const { agents, ledger } = runtime.stores;
  if (terms.payerAgentId === payeeAgentId) {
    throw errors.validation('the payer must be another agent than the one doing the work', { errors: [{ path: 'body.settlement.payerAgentId', message: 'equals the run agent' }] });
  }
  const payer = await agents.get(tenantId, terms.payerAgentId);
  if (!payer) throw errors.notFound('payer agent');
  await ledger.ensureWallet(payer._id, tenantId, 'agent');
  const lock = await ledger.apply({
    _id: escrowLockId(runId),
    tenantId,
    kind: 'escrow_lock',
    currency: terms.currency,
    legs: [
      { walletId: payer._id, bucket: 'available', delta: -terms.amount },
      { walletId: payer._id, bucket: 'escrow', delta: terms.amount },
    ],
    ref: { runId },
  });
  // One lock per run: a lock already made under other terms is not this one.
  if (lock.currency !== terms.currency || lock.legs[1]!.walletId !== payer._id || lock.legs[1]!.delta !== terms.amount) {
    throw errors.conflict('TRANSITION_ILLEGAL', 'escrow for this run is already locked under other terms', { status: 'locked' });
  }
}

const RunParams = Type.Object({ id: Type.String({ maxLength: 128 }) });
const RunIdParams = Type.Object({ runId: Type.String({ maxLength: 128 }) });
const SettleBody = Type.Object({ settlement: Type.Optional(SettlementTermsSchema) }, { additionalProperties: false });
const Accepted = Type.Object({ runId: Type.String(), settlementId: Type.String(), status: Type.String() });
const DisputeBody = Type.Object(
  { reason: Type.String({ minLength: 1, maxLength: 2_000 }), evidence: Type.Optional(Type.Unknown()) },
  { additionalProperties: false },
);
const DisputeRuling = Type.Object(
  {
    outcome: Type.Union([Type.Literal('payee'), Type.Literal('payer'), Type.Literal('split')]),
    payerShareBps: Type.Optional(Type.Integer({ minimum: 0, maximum: 10_000 })),
  },
  { additionalProperties: false },
);
const HeldRuling = Type.Object({ outcome: Type.Union([Type.Literal('release'), Type.Literal('refund')]) }, { additionalProperties: false });
const Dispute = Type.Object({
  disputeId: Type.String(),
  status: Type.String(),
  reason: Type.String(),
  frozenAmount: Type.Integer(),
  openedAt: Timestamp,
  outcome: Type.Union([Type.String(), Type.Null()]),
  toPayer: Type.Union([Type.Integer(), Type.Null()]),
  toPayee: Type.Union([Type.Integer(), Type.Null()]),
  resolvedAt: Type.Union([Timestamp, Type.Null()]),
});
const Settlement = Type.Object({
  settlementId: Type.String(),
  runId: Type.String(),
  status: Type.String(),
  amount: Type.Integer(),
  releasedAmount: Type.Integer(),
  refundedAmount: Type.Integer(),
  holdback: Type.Integer(),
  holdbackState: Type.String(),
  currency: Type.String(),
  payerWalletId: Type.String(),
  payeeWalletId: Type.String(),
  disputeWindowEndsAt: Type.Union([Timestamp, Type.Null()]),
  dispute: Type.Union([Dispute, Type.Null()]),
  decision: Type.Union([Type.Object({ verdict: Type.String(), reason: Type.Union([Type.String(), Type.Null()]), decidedAt: Timestamp }), Type.Null()]),
  receipt: Type.Union([
    Type.Object({
      receiptHash: Type.String(),
      signature: Type.Object({ alg: Type.String(), keyId: Type.String(), value: Type.String() }),
      body: Type.Record(Type.String(), Type.Unknown(), { description: 'SettlementReceipt.v1; receiptHash = sha256hex(JCS(body))' }),
    }),
    Type.Null(),
  ]),
});

export function settlementView({ doc: s, facts, view }: SettlementState): Static<typeof Settlement> {
  const d = facts.decision;
  const hb = facts.holdback;
  const dispute =
    hb?.fate === 'dispute'
      ? {
          disputeId: hb.disputeId,
          status: !facts.ruling ? 'open' : view.holdbackState === 'resolving' ? 'resolving' : 'resolved',
          reason: hb.reason,
          frozenAmount: hb.frozenAmount,
          openedAt: hb.at,
          outcome: facts.ruling?.outcome ?? null,
          toPayer: facts.ruling?.toPayer ?? null,
          toPayee: facts.ruling?.toPayee ?? null,
          resolvedAt: facts.ruling && view.holdbackState !== 'resolving' ? facts.ruling.at : null,
        }
      : null;
  return {
    settlementId: s._id,
    runId: s.runId,
    status: view.status,
    amount: s.amount,
    releasedAmount: view.releasedAmount,
    refundedAmount: view.refundedAmount,
    holdback: view.holdback,
    holdbackState: view.holdbackState,
    currency: s.currency,
    payerWalletId: s.payerWalletId,
    payeeWalletId: s.payeeWalletId,
    disputeWindowEndsAt: view.disputeWindowEndsAt,
    dispute,
    decision: d ? { verdict: d.verdict, reason: d.reason, decidedAt: d.decidedAt } : null,
    receipt: d ? { receiptHash: d.receipt.receiptHash, signature: d.receipt.signature, body: d.receipt.body as unknown as Record<string, unknown> } : null,
  };
}

const RULING_WAIT_MS = 3_000;

export async function settlementRoutes(app: FastifyInstance, opts: { runtime: Runtime }) {
  const { runtime } = opts;
  const { runs, settlements, ledger } = runtime.stores;
  const tags = ['settlement'];
  const read = (s: SettlementDoc) => readSettlement(settlements, ledger, s);

  /**
   * A recorded ruling is applied by the settle worker; the answer waits briefly for it: 200 once applied, else 202
   * with the ruling recorded and still applying (it will complete; nothing needs resending).
   */
  const awaitRuling = async (s: SettlementDoc, ruling: string, done: (st: SettlementState) => boolean, reply: FastifyReply) => {
    await runtime.producers.ensure('settle', { tenantId: s.tenantId, runId: s.runId, settlementId: s._id }, jobIdFor('settle', s._id, ruling));
    const deadline = Date.now() + RULING_WAIT_MS;
    let state = await read(s);
    while (!done(state) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      state = await read(s);
    }
    return reply.status(done(state) ? 200 : 202).send(settlementView(state));
  };

  app.post<{ Params: Static<typeof RunParams>; Body: Static<typeof SettleBody> | undefined }>('/v1/runs/:id/settle', {
    config: { access: 'runs:write' },
    schema: {
      tags,
      summary: 'Settle a finalized run: a worker releases (pass) or holds (fail) the escrow; repeats return the same settlement',
      params: RunParams,
      body: SettleBody,
      response: { 202: Accepted, ...errorResponses(400, 401, 402, 403, 404, 409) },
    },
  }, async (request, reply) => {
    const tenantId = tenantOf(request);
    let run = await runs.get(tenantId, request.params.id);
    if (!run) throw errors.notFound('run');
    if (run.status !== 'finalized') throw errors.transitionIllegal('only a finalized run can be settled', run.status);
    const offered = request.body?.settlement ? settlementTerms(request.body.settlement) : null;
    const otherTerms = () => errors.conflict('TRANSITION_ILLEGAL', 'the run already has other settlement terms', { status: run!.status, settlement: run!.settlement });
    if (run.settlement && offered && canonicalize(offered) !== canonicalize(run.settlement)) throw otherTerms();
    if (!run.settlement) {
      if (!offered) throw errors.validation('this run has no settlement terms; send them as settlement', { errors: [{ path: 'body.settlement', message: 'required' }] });
      await lockEscrow(runtime, tenantId, run._id, run.agentId, offered);
      run = await runs.attachSettlement(tenantId, run._id, offered);
      if (canonicalize(run.settlement) !== canonicalize(offered)) throw otherTerms();
      await ledger.markReconciled(escrowLockId(run._id)); // the lock has its run: nothing for the sweeper to return
    }
    const terms = run.settlement!;
    const s = await settlements.createOrGet({
      tenantId,
      runId: run._id,
      payerWalletId: terms.payerAgentId,
      payeeWalletId: run.agentId,
      amount: terms.amount,
      currency: terms.currency,
      holdbackBps: terms.holdbackBps,
      disputeWindowSeconds: terms.disputeWindowSeconds,
    });
    const { view } = await read(s);
    if (view.status === 'pending') await runtime.producers.ensure('settle', { tenantId, runId: run._id, settlementId: s._id }, jobIdFor('settle', s._id));
    return reply.status(202).send({ runId: run._id, settlementId: s._id, status: view.status });
  });

  app.get<{ Params: Static<typeof RunIdParams> }>('/runs/:runId/settlement', {
    config: { access: 'runs:read' },
    schema: { tags, summary: 'The settlement of a run, with its decision and signed receipt', params: RunIdParams, response: { 200: Settlement, ...errorResponses(401, 403, 404) } },
  }, async (request) => {
    const run = await runs.get(tenantOf(request), request.params.runId);
    const s = run && (await settlements.byRun(run._id));
    if (!s) throw errors.notFound('settlement');
    return settlementView(await read(s));
  });

  app.post<{ Params: Static<typeof RunParams>; Body: Static<typeof DisputeBody> }>('/v1/runs/:id/disputes', {
    config: { access: 'runs:write' },
    schema: {
      tags,
      summary: 'Dispute a completed settlement inside its window: freezes the holdback',
      params: RunParams,
      body: DisputeBody,
      response: { 201: Type.Object({ disputeId: Type.String(), status: Type.Literal('open'), settlementId: Type.String(), runId: Type.String(), frozenAmount: Type.Integer() }), ...errorResponses(400, 401, 403, 404, 409) },
    },
  }, async (request, reply) => {
    const run = await runs.get(tenantOf(request), request.params.id);
    const s = run && (await settlements.byRun(run._id));
    if (!s) throw errors.notFound('settlement');
    const { view, facts } = await read(s);
    const now = Date.now();
    if (view.status !== 'completed' || facts.holdback) throw errors.transitionIllegal(`a ${view.status} settlement cannot be disputed`, view.status);
    if (!view.disputeWindowEndsAt || Date.parse(view.disputeWindowEndsAt) <= now) throw errors.transitionIllegal('the dispute window has ended', view.status);
    const disputeId = newId('dsp');
    const frozenAmount = view.holdbackState === 'held' ? view.holdback : 0;
    // The dispute and the holdback's release claim the same fact: whichever is recorded first decides.
    const { won, fact } = await settlements.claim(s._id, 'holdback', { fate: 'dispute', disputeId, reason: request.body.reason, evidence: request.body.evidence ?? null, frozenAmount, at: new Date(now).toISOString() });
    if (!won) {
      throw errors.transitionIllegal(fact.fate === 'dispute' ? 'the settlement is already disputed' : 'the dispute window has ended', fact.fate === 'dispute' ? 'disputed' : 'completed');
    }
    await emitEvent(runtime, s.tenantId, 'dispute.opened', { disputeId, runId: s.runId, settlementId: s._id }, `dispute.opened:${disputeId}`);
    await settlements.cacheView(s._id, (await read(s)).view, null);
    return reply.status(201).send({ disputeId, status: 'open' as const, settlementId: s._id, runId: s.runId, frozenAmount });
  });

  app.post<{ Params: { disputeId: string }; Body: Static<typeof DisputeRuling> }>('/ops/disputes/:disputeId/resolve', {
    config: { access: 'admin' },
    schema: {
      tags,
      summary: 'Rule on an open dispute: the frozen holdback goes to the payee, the payer, or is split',
      params: Type.Object({ disputeId: Type.String({ maxLength: 128 }) }),
      body: DisputeRuling,
      response: { 200: Settlement, 202: Settlement, ...errorResponses(400, 401, 403, 404, 409) },
    },
  }, async (request, reply) => {
    const { outcome, payerShareBps } = request.body;
    if ((outcome === 'split') !== (payerShareBps !== undefined)) {
      throw errors.validation('payerShareBps goes with outcome "split", and only with it', { errors: [{ path: 'body.payerShareBps', message: 'required for split, not allowed otherwise' }] });
    }
    const s = await settlements.byDispute(request.params.disputeId);
    if (!s) throw errors.notFound('dispute');
    const { facts, view } = await read(s);
    if (facts.holdback?.fate !== 'dispute') throw errors.notFound('dispute');
    const { toPayer, toPayee } = disputeSplit(facts.holdback.frozenAmount, outcome, payerShareBps);
    const { won } = await settlements.claim(s._id, 'ruling', { outcome, payerShareBps: payerShareBps ?? null, toPayer, toPayee, at: new Date().toISOString() });
    if (!won) throw errors.transitionIllegal('the dispute has already been ruled on', view.status);
    return awaitRuling(s, `dispute-${facts.holdback.disputeId}`, (st) => st.view.final, reply);
  });

  app.post<{ Params: { settlementId: string }; Body: Static<typeof HeldRuling> }>('/ops/settlements/:settlementId/resolve', {
    config: { access: 'admin' },
    schema: {
      tags,
      summary: 'End a held settlement: release the escrow to the payee, or refund the payer',
      params: Type.Object({ settlementId: Type.String({ maxLength: 128 }) }),
      body: HeldRuling,
      response: { 200: Settlement, 202: Settlement, ...errorResponses(400, 401, 403, 404, 409) },
    },
  }, async (request, reply) => {
    const s = await settlements.get(request.params.settlementId);
    if (!s) throw errors.notFound('settlement');
    const { view } = await read(s);
    if (view.status !== 'held') throw errors.transitionIllegal(`a ${view.status} settlement cannot be resolved this way`, view.status);
    const { won } = await settlements.claim(s._id, 'heldRuling', { outcome: request.body.outcome, at: new Date().toISOString() });
    if (!won) throw errors.transitionIllegal('the held settlement has already been ruled on', view.status);
    return awaitRuling(s, 'held-ruling', (st) => st.view.final, reply);
  });
}
