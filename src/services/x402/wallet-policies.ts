// x402 wallet policies: a wallet's versioned spending policy, its daily spend counted once per decision, and a
// sponsor wallet's decision to pay for one gate, quote and request.
import { recorded } from '../../domain/money.ts';
import { errors, ServiceError, x402Error } from '../../domain/errors.ts';
import {
  evaluateDailyLimit,
  evaluateStaticPolicy,
  TOKEN_AUDIENCE,
  utcDay,
  WALLET_DECISION_TTL_SECONDS,
  type PolicyBreach,
  type WalletPolicy,
} from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import type { WalletDoc } from '../../store/ledger.ts';
import { OtherKeyTaken, type PolicyVersionDoc } from '../../store/x402.ts';
import { valueOf, type X402Gates } from './gates.ts';
import type { X402Quotes } from './quotes.ts';
import type { X402Tokens } from './tokens.ts';

export class X402WalletPolicies {
  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
    private readonly quotes: X402Quotes,
    private readonly tokens: X402Tokens,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  private async requireWallet(tenantId: string, walletId: string): Promise<WalletDoc> {
    const wallet = await this.gates.knownWallet(walletId);
    if (!wallet || wallet.tenantId !== tenantId) throw errors.notFound('wallet');
    return wallet;
  }

  /** A new policy version, by insert: concurrent updates each get a version and the last one is in force. */
  async putPolicy(tenantId: string, walletId: string, policy: WalletPolicy): Promise<PolicyVersionDoc> {
    await this.requireWallet(tenantId, walletId);
    const doc = await this.store.policies.append(walletId, (version) => ({
      tenantId,
      walletId,
      version,
      policy,
      at: new Date(),
    }));
    await this.runtime.credentials.invalidate('policy', walletId); // every process reads the new version from now on
    return recorded(doc, `the new policy of wallet ${walletId}`);
  }

  /**
   * The policy in force, cached per process and invalidated on every process by each new version (through the
   * credential cache, which serves nothing while its invalidation channel is down: then every call reads it).
   */
  policyInForce(walletId: string): Promise<PolicyVersionDoc | null> {
    return this.runtime.credentials.policy(walletId, () => this.store.policyOf(walletId));
  }

  async getPolicy(tenantId: string, walletId: string): Promise<PolicyVersionDoc> {
    await this.requireWallet(tenantId, walletId);
    const policy = await this.store.policyOf(walletId);
    if (!policy) throw errors.notFound('policy');
    return policy;
  }

  /**
   * Counts `amount` against the wallet's UTC day, once per decision key, unless it would pass the daily limit
   * (`enforce` false records it anyway: an approved escalation). The day's spends are a chain of inserted records
   * with running totals, so concurrent callers can never both take the last of the limit. A decision already counted
   * (a sponsor's wallet decision, then its authorize-payment under the same key; a repeat) is never a breach: its
   * amount is in the total already, and weighing it again would refuse a decision within the limit.
   */
  async spendDaily(
    walletId: string,
    policy: WalletPolicy,
    decisionKey: string,
    amount: number,
    now: Date,
    enforce: boolean,
  ): Promise<PolicyBreach | null> {
    if (policy.dailyLimit === null && enforce) return null;
    let breach: PolicyBreach | null = null;
    try {
      await this.store.spends.append(`${walletId}#${utcDay(now)}`, (_seq, previous) => {
        const spent = previous?.total ?? 0;
        breach = enforce ? evaluateDailyLimit(policy, spent, amount) : null;
        return breach ? null : { ref: walletId, decisionKey, amount, total: spent + amount, at: now };
      });
    } catch (err) {
      if (err instanceof OtherKeyTaken) return null; // this decision was already counted (a concurrent repeat)
      throw err;
    }
    // Checked only on a breach (the unique decisionKey index dedups every insert): the key's own spend may be part
    // of the total that breached, recorded earlier, by another process, or on an earlier UTC day.
    if (breach && (await this.store.spentUnder(decisionKey))) return null;
    return breach;
  }

  private policyViolation(breach: PolicyBreach, walletId: string): ServiceError {
    return x402Error('X402_WALLET_POLICY_VIOLATION', breach.message, { walletId, ...breach });
  }

  async authorizeWallet(
    tenantId: string,
    walletId: string,
    input: { gateId: string; quoteId: string; requestSha256: string },
  ): Promise<{ walletDecisionToken: string; expiresAt: Date }> {
    const [wallet, found] = await Promise.allSettled([
      this.requireWallet(tenantId, walletId),
      this.gates.requireGate(tenantId, input.gateId),
    ]);
    valueOf(wallet);
    const gate = valueOf(found);
    // The decision's id is the quote's once the quote checks pass; everything is read at once, checked in order.
    const decisionId = `${walletId}#${gate._id}#${input.quoteId}`;
    const [lifecycle, checked, quoted, decided, policy] = await Promise.allSettled([
      this.gates.requireLiveAgents(tenantId, [gate.payerAgentId, gate.payeeAgentId]),
      this.gates.checkState(gate),
      this.quotes.readQuote(gate, input.quoteId),
      this.store.walletDecisionOf(decisionId),
      this.policyInForce(walletId),
    ]);
    valueOf(lifecycle);
    const state = valueOf(checked);
    if (state.status !== 'held') throw await this.gates.terminal(gate, 'takes no wallet decision');
    if (gate.sponsorWalletId !== walletId) {
      throw this.policyViolation({ rule: 'sponsorWallet', message: 'this wallet does not sponsor the gate' }, walletId);
    }
    const now = new Date();
    const quote = this.quotes.quoteChecks(gate, valueOf(quoted), input.quoteId, input.requestSha256, now);
    const existing = valueOf(decided);
    if (existing && existing.expiresAt > now)
      return { walletDecisionToken: existing.token, expiresAt: existing.expiresAt };

    const version = valueOf(policy);
    if (!version)
      throw this.policyViolation(
        { rule: 'policy', message: 'the wallet has no policy; sponsor wallets refuse until one is set' },
        walletId,
      );
    const call = { amount: gate.amount, currency: gate.currency, payeeAgentId: gate.payeeAgentId, toolId: gate.toolId };
    const breach =
      evaluateStaticPolicy(version.policy, call) ??
      (await this.spendDaily(walletId, version.policy, decisionId, gate.amount, now, true));
    if (breach) throw this.policyViolation(breach, walletId);

    const expiresAt = new Date(Math.min(now.getTime() + WALLET_DECISION_TTL_SECONDS * 1000, quote.expiresAt.getTime()));
    const token = await this.tokens.sign(
      {
        walletId,
        gateId: gate._id,
        quoteId: quote._id,
        requestSha256: quote.requestSha256,
        policyVersion: version.version,
      },
      TOKEN_AUDIENCE.walletDecision,
      walletId,
      expiresAt,
    );
    // An expired decision is replaced; a concurrent one that got there first is the answer.
    const recorded = await this.store.recordWalletDecision(
      { _id: decisionId, tenantId, token, expiresAt, at: now },
      existing !== null,
    );
    return { walletDecisionToken: recorded.token, expiresAt: recorded.expiresAt };
  }
}
