// x402 payment authorization: every check of the contract in its order (agents, gate, quote, request binding,
// wallet decision, policy limits, or an approved escalation's override), then the gate's one commitment, which
// carries the payment token the payee's server checks.
import { newId } from '../../domain/crypto.ts';
import { x402Error } from '../../domain/errors.ts';
import { failpoint } from '../../domain/failpoints.ts';
import { evaluateStaticPolicy, paymentTokenClaims, TOKEN_AUDIENCE, type PolicyBreach } from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import type { CommitmentDoc, GateDoc, PolicyVersionDoc, QuoteDoc } from '../../store/x402.ts';
import { escalationStatus, type X402Escalations } from './escalations.ts';
import { isTerminal, valueOf, type GateState, type X402Gates } from './gates.ts';
import type { X402Quotes } from './quotes.ts';
import type { X402Tokens } from './tokens.ts';
import type { X402WalletPolicies } from './wallet-policies.ts';

export interface PaymentAuthorization {
  authorizationRef: string;
  token: string;
  tokenKid: string;
  expiresAt: Date;
  reserve: { amount: number; currency: string; status: 'reserved' };
}

type AuthorizationDoc = Extract<CommitmentDoc, { kind: 'authorization' }>;

export class X402Authorization {
  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
    private readonly quotes: X402Quotes,
    private readonly policies: X402WalletPolicies,
    private readonly escalations: X402Escalations,
    private readonly tokens: X402Tokens,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  private authorizationOf(gate: GateDoc, a: AuthorizationDoc): PaymentAuthorization {
    return {
      authorizationRef: a.authorizationRef,
      token: a.token,
      tokenKid: a.tokenKid,
      expiresAt: a.expiresAt,
      reserve: { amount: gate.amount, currency: gate.currency, status: 'reserved' },
    };
  }

  /**
   * Checks in the contract's order: agent lifecycle, gate state, quote match and expiry, request binding, wallet
   * decision, policy limits; then claims the gate's one commitment. Every failure refuses (fails closed).
   *
   * The gate's commitment is read only when something must be known before the claim: an override or a policy spend
   * (each has an effect of its own), a repeat (this process has seen the commitment), or a failed check (the gate's
   * state is reported first). Otherwise the claim is the check: a funded gate without a commitment is open, and the
   * unique insert finds out whether it still has none, with one command fewer on every paid call.
   */
  async authorizePayment(
    tenantId: string,
    input: {
      gateId: string;
      quoteId: string;
      requestSha256: string;
      walletDecisionToken?: string;
      escalationOverrideToken?: string;
    },
  ): Promise<PaymentAuthorization> {
    const gate = await this.gates.requireGate(tenantId, input.gateId);
    let stateRead: Promise<GateState> | null = null;
    const readState = () => (stateRead ??= this.gates.checkState(gate));
    if (input.escalationOverrideToken || gate.sponsorWalletId || this.store.knowsCommitment(gate._id))
      void readState().catch(() => undefined);
    // Everything the checks read, read at once; the checks then run in the contract's order on what was read.
    const [lifecycle, funded, quoted, policy] = await Promise.allSettled([
      this.gates.requireLiveAgents(tenantId, [gate.payerAgentId, gate.payeeAgentId]),
      this.gates.isFunded(gate),
      this.quotes.readQuote(gate, input.quoteId),
      this.policies.policyInForce(gate.escrowWalletId),
    ]);
    valueOf(lifecycle);
    const version = valueOf(policy);
    const state = stateRead !== null || version !== null ? await readState() : null;
    if (state ? isTerminal(state.status) : !valueOf(funded))
      throw await this.gates.terminal(gate, 'cannot be authorized');
    const now = new Date();
    let decidedUnder: number | null = null;
    const quote = await this.inGateOrder(gate, state, readState, async () => {
      const checked = this.quotes.quoteChecks(gate, valueOf(quoted), input.quoteId, input.requestSha256, now);
      decidedUnder = await this.checkWalletDecision(gate, checked, input);
      return checked;
    });

    let escalationId: string | null = null;
    if (input.escalationOverrideToken)
      escalationId = await this.checkOverride(gate, quote, input.escalationOverrideToken);

    const existing = state?.commitment;
    if (existing?.kind === 'authorization') return this.repeatAuthorization(gate, existing, quote);

    if (!escalationId) {
      const breach = await this.policyBreach(gate, quote, now, version, decidedUnder);
      if (breach && version?.policy.onBreach === 'refuse')
        throw x402Error('X402_WALLET_POLICY_VIOLATION', breach.breach.message, {
          walletId: breach.walletId,
          ...breach.breach,
        });
      if (breach) {
        const escalation = await this.escalations.escalate(
          gate,
          quote,
          breach.walletId,
          breach.breach,
          version?.policy.escalationTimeoutSeconds ?? null,
        );
        throw x402Error(
          'X402_AUTHORIZATION_ESCALATION_REQUIRED',
          `${breach.breach.message}; a person must approve this payment`,
          { escalationId: escalation.escalation._id, status: escalationStatus(escalation), rule: breach.breach.rule },
        );
      }
    } else {
      if (!(await this.store.recordOverrideUse(escalationId, gate._id, now))) {
        throw x402Error('X402_OVERRIDE_REPLAYED', 'this override token has already been used', { escalationId });
      }
      const walletId = gate.escrowWalletId;
      if (version)
        await this.policies.spendDaily(
          walletId,
          version.policy,
          `${walletId}#${gate._id}#${quote._id}`,
          gate.amount,
          now,
          false,
        );
    }

    const authorizationRef = newId('azn');
    const jti = newId('jti');
    const expiresAt = quote.expiresAt;
    const token = await this.tokens.sign(
      {
        ...paymentTokenClaims({
          authorizationRef,
          gateId: gate._id,
          quoteId: quote._id,
          requestSha256: quote.requestSha256,
          amount: gate.amount,
          currency: gate.currency,
          payee: gate.payeeAgentId,
          payer: gate.payerAgentId,
          network: this.runtime.config.x402.network,
        }),
      },
      gate.payeeAgentId,
      gate.payerAgentId,
      expiresAt,
      jti,
    );
    const doc: AuthorizationDoc = {
      _id: gate._id,
      tenantId,
      at: now,
      kind: 'authorization',
      authorizationRef,
      quoteId: quote._id,
      requestSha256: quote.requestSha256,
      token,
      tokenKid: this.runtime.keys.active.keyId,
      jti,
      expiresAt,
      escalationId,
    };
    failpoint('x402.authorize.checked');
    if (await this.store.recordAuthorization(doc)) {
      failpoint('x402.authorize.committed');
      return this.authorizationOf(gate, doc);
    }
    // The gate already had a commitment: the same authorization repeated (from another process), or it is closed.
    const committed = await this.gates.checkState(gate);
    if (committed.commitment?.kind === 'authorization' && !isTerminal(committed.status))
      return this.repeatAuthorization(gate, committed.commitment, quote);
    throw await this.gates.terminal(gate, 'cannot be authorized');
  }

  /**
   * Runs checks that come after the gate's state in the contract's order. When the state was not read (the claim
   * would have checked it), a failing check reads it first: a closed gate is reported as closed, whatever else fails.
   */
  private async inGateOrder<T>(
    gate: GateDoc,
    state: GateState | null,
    readState: () => Promise<GateState>,
    checks: () => Promise<T>,
  ): Promise<T> {
    try {
      return await checks();
    } catch (err) {
      if (!state && isTerminal((await readState()).status))
        throw await this.gates.terminal(gate, 'cannot be authorized');
      throw err;
    }
  }

  /**
   * A sponsored gate is authorized only with its sponsor wallet's decision for this very gate, quote and request, or
   * with the override of an approved escalation of that decision (a sponsor policy with `onBreach: 'escalate'`): the
   * override is checked next, bound to this gate and quote, approved and single-use. Answers the policy version the
   * decision was taken under (null without a decision token).
   */
  private async checkWalletDecision(
    gate: GateDoc,
    quote: QuoteDoc,
    {
      walletDecisionToken,
      escalationOverrideToken,
    }: { walletDecisionToken?: string; escalationOverrideToken?: string },
  ): Promise<number | null> {
    if (!gate.sponsorWalletId) return null;
    if (!walletDecisionToken && escalationOverrideToken) return null;
    const claims = walletDecisionToken
      ? await this.tokens.verifyOwnToken(walletDecisionToken, TOKEN_AUDIENCE.walletDecision)
      : null;
    if (!claims)
      throw x402Error(
        'X402_WALLET_DECISION_REQUIRED',
        walletDecisionToken
          ? 'the wallet decision token is invalid or expired'
          : 'this gate is sponsored: authorize with the sponsor wallet first',
        { walletId: gate.sponsorWalletId, reason: walletDecisionToken ? 'invalid' : 'missing' },
      );
    if (
      claims.walletId !== gate.sponsorWalletId ||
      claims.gateId !== gate._id ||
      claims.quoteId !== quote._id ||
      claims.requestSha256 !== quote.requestSha256
    ) {
      throw x402Error(
        'X402_WALLET_DECISION_REQUIRED',
        'the wallet decision was made for another gate, quote or request',
        { walletId: gate.sponsorWalletId, reason: 'mismatch' },
      );
    }
    return typeof claims.policyVersion === 'number' ? claims.policyVersion : null;
  }

  /** A repeat while live gets the same token; the gate's one authorization is for one quote and request. */
  private repeatAuthorization(gate: GateDoc, a: AuthorizationDoc, quote: QuoteDoc): PaymentAuthorization {
    if (a.quoteId !== quote._id)
      throw x402Error('X402_QUOTE_MISMATCH', 'the gate is authorized under another quote', { quoteId: quote._id });
    return this.authorizationOf(gate, a);
  }

  /**
   * The escrow wallet's policy limits (a payer's own wallet may have none: then nothing limits it). `decidedUnder` is
   * the policy version a sponsor's wallet decision was taken under: the decision counted this call's day under it
   * (its token is signed only once the spend is recorded), so with that version still in force the day is not
   * counted again here. Counting it again cannot count it twice (the decision key is unique) but it queued behind
   * every other decision on the sponsor's one spend chain and cost a refused insert and a read (issue 40).
   */
  private async policyBreach(
    gate: GateDoc,
    quote: QuoteDoc,
    now: Date,
    version: PolicyVersionDoc | null,
    decidedUnder: number | null,
  ): Promise<{ walletId: string; breach: PolicyBreach } | null> {
    const walletId = gate.escrowWalletId;
    if (!version)
      return gate.sponsorWalletId
        ? { walletId, breach: { rule: 'policy', message: 'the sponsor wallet has no policy' } }
        : null;
    const call = { amount: gate.amount, currency: gate.currency, payeeAgentId: gate.payeeAgentId, toolId: gate.toolId };
    const staticBreach = evaluateStaticPolicy(version.policy, call);
    if (staticBreach) return { walletId, breach: staticBreach };
    if (gate.sponsorWalletId && decidedUnder === version.version) return null;
    // A payer's day is counted here; a sponsored call's under a policy newer than its decision too (same key as the
    // decision's, so never twice).
    const daily = await this.policies.spendDaily(
      walletId,
      version.policy,
      `${walletId}#${gate._id}#${quote._id}`,
      gate.amount,
      now,
      true,
    );
    return daily ? { walletId, breach: daily } : null;
  }

  private async checkOverride(gate: GateDoc, quote: QuoteDoc, token: string): Promise<string> {
    const claims = await this.tokens.verifyOwnToken(token, TOKEN_AUDIENCE.escalationOverride);
    const invalid = (why: string) =>
      x402Error('X402_OVERRIDE_INVALID', `the escalation override token is not valid here: ${why}`);
    if (!claims || typeof claims.sub !== 'string') throw invalid('bad signature, audience or expiry');
    if (claims.gateId !== gate._id || claims.quoteId !== quote._id)
      throw invalid('it was issued for another gate or quote');
    const escalationId = claims.sub;
    const [resolution, used] = await Promise.all([
      this.store.resolutionOf(escalationId),
      this.store.isOverrideUsed(escalationId),
    ]);
    if (resolution?.action !== 'approve') throw invalid('the escalation is not approved');
    if (used) throw x402Error('X402_OVERRIDE_REPLAYED', 'this override token has already been used', { escalationId });
    return escalationId;
  }
}
