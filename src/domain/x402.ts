// The x402 payment gate's pure rules: how a quote binds a request, how a sponsor wallet's policy is evaluated, what
// a payment token claims, and the x402 v2 PaymentRequirements a provider puts in its PAYMENT-REQUIRED header.
import { canonicalize } from './canonical-json.ts';
import { sha256Hex } from './crypto.ts';

/** The x402 scheme this service settles: the payer's money sits in a gate's escrow until the call is verified. */
export const X402_SCHEME = 'escrow-gate';
/** The x402 scheme of payment sessions: the payment names an open session; each call is charged from its budget. */
export const X402_SESSION_SCHEME = 'escrow-session';
export const X402_VERSION = 2;
/**
 * CAIP-2 network id (`namespace:reference`) of this service's schemes: namespace `agentstl`, and a reference that
 * names the deployment, i.e. the ledger a payment is settled in (config X402_NETWORK). x402 v2 asks networks that are
 * not blockchains for CAIP-2 ids, and stock tools parse them.
 */
export const X402_NETWORK_NAMESPACE = 'agentstl';
export const DEFAULT_X402_NETWORK = `${X402_NETWORK_NAMESPACE}:default`;
/** CAIP-2: a namespace of 3-8 characters of [-a-z0-9], then a reference of 1-32 characters of [-_a-zA-Z0-9]. */
export const X402_NETWORK_PATTERN = '^[-a-z0-9]{3,8}:[-_a-zA-Z0-9]{1,32}$';
/** The ids used before CAIP-2 (`agent-settlement:<deployment>`: its namespace is too long for CAIP-2). */
export const LEGACY_X402_NETWORK_NAMESPACE = 'agent-settlement';
export const LEGACY_X402_NETWORK_PATTERN = '^[-a-z0-9]{3,32}:[-_a-zA-Z0-9]{1,32}$';
/** Until when the legacy ids are still accepted on payments, unless configured otherwise (X402_LEGACY_NETWORKS_UNTIL). */
export const DEFAULT_LEGACY_NETWORKS_UNTIL = '2027-06-01T00:00:00.000Z';

/** Which network ids a deployment settles: its own, and old ids for a deprecation window. */
export interface NetworkRules {
  network: `${string}:${string}`;
  legacyNetworks: string[];
  legacyNetworksUntil: Date;
}

/** The legacy ids still accepted at `now` (none once the window has closed). */
export function legacyNetworksAt(rules: NetworkRules, now: Date): string[] {
  return now.getTime() < rules.legacyNetworksUntil.getTime() ? rules.legacyNetworks : [];
}

/** Whether a payment naming `network` is one this deployment settles at `now`. */
export function acceptsNetwork(rules: NetworkRules, network: string, now: Date): boolean {
  return network === rules.network || legacyNetworksAt(rules, now).includes(network);
}
/**
 * x402's settlement status words (the vocabulary proposed for SettleResponse, x402 PR #3325): `settled` (the payee
 * was paid what was charged) and `failed` (it was not, and this answer will not change) are final; `unresolved`
 * (still being decided, or not yet settled at all) never is: ask again.
 */
export type SettlementWord = 'settled' | 'failed' | 'unresolved';

/** The word for a settle answer: a pending decision (x402's non-terminal settlement_pending) is unresolved. */
export function settleAnswerWord(success: boolean, errorReason: string | undefined): SettlementWord {
  if (success) return 'settled';
  return errorReason === 'settlement_pending' ? 'unresolved' : 'failed';
}

/** Where a payment stands, for a resource server that lost settle's answer (the facilitator's status lookup). */
export type PaymentStatus = 'unknown' | 'authorized' | 'settling' | 'settled' | 'refused';

/** The word for a payment's status: never seen, paid for but not settled, or in flight are all still unresolved. */
export function paymentStatusWord(status: PaymentStatus): SettlementWord {
  return status === 'settled' ? 'settled' : status === 'refused' ? 'failed' : 'unresolved';
}

export const DEFAULT_QUOTE_TTL_SECONDS = 300;
export const MAX_QUOTE_TTL_SECONDS = 3600;
/** A wallet decision is presented to authorize-payment right after it is made; it never outlives its quote. */
export const WALLET_DECISION_TTL_SECONDS = 300;
export const OVERRIDE_TTL_SECONDS = 3600;

/** JWT audiences keep the service's three token kinds apart: none can be presented as another. */
export const TOKEN_AUDIENCE = {
  walletDecision: 'x402:wallet-decision',
  escalationOverride: 'x402:escalation-override',
} as const;

export type GateStatus =
  'unfunded' | 'held' | 'authorized' | 'settling' | 'released' | 'refunded' | 'cancelled' | 'expired';

/** PaymentRequirements of x402 v2 (field names as in @x402/core's types). */
export interface PaymentRequirementsV2 {
  scheme: string;
  network: `${string}:${string}`;
  asset: string;
  amount: string;
  payTo: string;
  maxTimeoutSeconds: number;
  extra: Record<string, unknown>;
}

export interface PaymentRequiredV2 {
  x402Version: 2;
  resource: { url: string; description?: string };
  accepts: PaymentRequirementsV2[];
}

export interface QuoteTerms {
  gateId: string;
  quoteId: string;
  requestSha256: string;
  amount: number;
  currency: string;
  payeeAgentId: string;
  expiresAt: string;
}

/** What a quote commits to, hashed: a client can check the quote it was given has not been altered. */
export function quoteSha256(q: QuoteTerms): string {
  return sha256Hex(canonicalize({ ...q }));
}

export function paymentRequirements(
  q: QuoteTerms,
  network: `${string}:${string}`,
  ttlSeconds: number,
): PaymentRequirementsV2 {
  return {
    scheme: X402_SCHEME,
    network,
    asset: q.currency,
    amount: String(q.amount),
    payTo: q.payeeAgentId,
    maxTimeoutSeconds: ttlSeconds,
    extra: { gateId: q.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 },
  };
}

/** Base64 of the PaymentRequired JSON, usable verbatim as a provider's PAYMENT-REQUIRED header. */
export function paymentRequiredHeader(
  requirements: PaymentRequirementsV2,
  resource: PaymentRequiredV2['resource'],
): string {
  const body: PaymentRequiredV2 = { x402Version: X402_VERSION, resource, accepts: [requirements] };
  return Buffer.from(JSON.stringify(body), 'utf8').toString('base64');
}

export interface WalletPolicy {
  currency: string;
  perCallLimit: number | null;
  dailyLimit: number | null;
  allowedPayeeAgentIds: string[] | null;
  allowedToolIds: string[] | null;
  /** How long an escalation this policy raises waits for a person before it is denied by itself (absent: the default). */
  escalationTimeoutSeconds?: number | null;
  /** What a breach of a limit does: raise an escalation for a person, or refuse outright (absent: onBreachDefault). */
  onBreach?: OnBreach | null;
}

export type OnBreach = 'escalate' | 'refuse';

/**
 * A policy that does not say: an agent's own wallet escalates (a person may approve the payer's call), a sponsor
 * wallet refuses (it pays for others; a person approving is a choice its owner makes with `onBreach: 'escalate'`).
 */
export function onBreachDefault(walletKind: 'agent' | 'sponsor'): OnBreach {
  return walletKind === 'sponsor' ? 'refuse' : 'escalate';
}

/** An escalation nobody answers is denied this long after it was raised, unless the wallet's policy says otherwise. */
export const DEFAULT_ESCALATION_TIMEOUT_SECONDS = 900;

/** When an escalation raised at `createdAt` under `policy` is denied by itself. */
export function escalationDeadline(
  createdAt: Date,
  policy: Pick<WalletPolicy, 'escalationTimeoutSeconds'> | null,
): Date {
  return new Date(
    createdAt.getTime() + (policy?.escalationTimeoutSeconds ?? DEFAULT_ESCALATION_TIMEOUT_SECONDS) * 1000,
  );
}

export interface PolicyCall {
  amount: number;
  currency: string;
  payeeAgentId: string;
  toolId: string | null;
}

export type PolicyRule =
  'policy' | 'sponsorWallet' | 'currency' | 'perCallLimit' | 'dailyLimit' | 'allowedPayeeAgentIds' | 'allowedToolIds';

export interface PolicyBreach {
  rule: PolicyRule;
  message: string;
  limit?: number;
  amount?: number;
  spentToday?: number;
}

/**
 * The rules a single call can break on its own (everything but the daily total). Fails closed: a call without a
 * tool id breaks an allow-list of tools, and a list that is present but empty allows nothing.
 */
export function evaluateStaticPolicy(policy: WalletPolicy, call: PolicyCall): PolicyBreach | null {
  if (policy.currency !== call.currency) {
    return { rule: 'currency', message: `the policy covers ${policy.currency}, the call is in ${call.currency}` };
  }
  if (policy.perCallLimit !== null && call.amount > policy.perCallLimit) {
    return {
      rule: 'perCallLimit',
      message: `${call.amount} exceeds the per-call limit of ${policy.perCallLimit}`,
      limit: policy.perCallLimit,
      amount: call.amount,
    };
  }
  if (policy.allowedPayeeAgentIds !== null && !policy.allowedPayeeAgentIds.includes(call.payeeAgentId)) {
    return { rule: 'allowedPayeeAgentIds', message: `payee ${call.payeeAgentId} is not allowed by the policy` };
  }
  if (policy.allowedToolIds !== null && (call.toolId === null || !policy.allowedToolIds.includes(call.toolId))) {
    return {
      rule: 'allowedToolIds',
      message:
        call.toolId === null
          ? 'the gate names no tool and the policy allows only listed tools'
          : `tool ${call.toolId} is not allowed by the policy`,
    };
  }
  return null;
}

/** The daily rule, given what is already authorized today: the new total may reach the limit, not pass it. */
export function evaluateDailyLimit(policy: WalletPolicy, spentToday: number, amount: number): PolicyBreach | null {
  if (policy.dailyLimit === null || spentToday + amount <= policy.dailyLimit) return null;
  return {
    rule: 'dailyLimit',
    message: `${amount} on top of ${spentToday} authorized today exceeds the daily limit of ${policy.dailyLimit}`,
    limit: policy.dailyLimit,
    amount,
    spentToday,
  };
}

/** The UTC day a spend counts against, e.g. "2025-01-31". */
export function utcDay(at: Date): string {
  return at.toISOString().slice(0, 10);
}

/**
 * One escalation per gate and quote: a repeated breach finds the same escalation. Derived by hashing ids that are
 * themselves random, so it is not guessable.
 */
export function escalationIdFor(gateId: string, quoteId: string): string {
  return `esc_${sha256Hex(`${gateId}\n${quoteId}`).slice(0, 32)}`;
}

/** Claims of the payment token (a compact JWS, EdDSA); `exp`, `iat`, `jti`, `iss`, `sub`, `aud` are set beside. */
export interface PaymentTokenClaims {
  authorizationRef: string;
  gateId: string;
  quoteId: string;
  requestSha256: string;
  amount: number;
  currency: string;
  payee: string;
  payer: string;
  scheme: typeof X402_SCHEME;
  network: string;
}

export function paymentTokenClaims(input: Omit<PaymentTokenClaims, 'scheme'>): PaymentTokenClaims {
  return { ...input, scheme: X402_SCHEME };
}

export type VerificationStatus = 'verified' | 'failed';

/**
 * What fills a gate's one verification slot: the provider's report, or the gate's return when nobody may report any
 * more (its authorization's deadline passed, or its payer or payee was wound down). Both race for the slot by the
 * same unique insert, so a gate is either paid or returned, never both.
 */
export type VerificationOutcome = VerificationStatus | 'expired' | 'wound_down';

/**
 * The verify rule: the payee is paid (minus holdback) only for an authorized gate whose call was reported verified;
 * a failed call or a returned gate is refunded in full, authorized or not. A success report for a gate nobody
 * authorized is refused (X402_PAYMENT_NOT_AUTHORIZED) before anything is recorded.
 */
export function verifyVerdict(authorized: boolean, status: VerificationOutcome): 'pass' | 'fail' {
  return authorized && status === 'verified' ? 'pass' : 'fail';
}

/** Why a gate's settlement refunds the payer (the decision's reason), or null when it pays the payee. */
export function refundReason(authorized: boolean, status: VerificationOutcome): string | null {
  if (verifyVerdict(authorized, status) === 'pass') return null;
  if (!authorized) return 'NOT_AUTHORIZED';
  return status === 'expired'
    ? 'AUTHORIZATION_EXPIRED'
    : status === 'wound_down'
      ? 'AGENT_WOUND_DOWN'
      : 'VERIFICATION_FAILED';
}

/** Deadlines of a gate's reserve (config X402_GATE_TTL_SECONDS and X402_AUTHORIZATION_GRACE_SECONDS). */
export interface GateDeadlineRules {
  gateTtlSeconds: number;
  authorizationGraceSeconds: number;
}

/** A funded gate nobody authorized expires after the gate TTL, or with its current quote if that lives longer. */
export function heldGateDeadline(createdAt: Date, currentQuoteExpiresAt: Date | null, rules: GateDeadlineRules): Date {
  return new Date(Math.max(createdAt.getTime() + rules.gateTtlSeconds * 1000, currentQuoteExpiresAt?.getTime() ?? 0));
}

/** An authorized gate can be reported until its token's expiry plus the grace; then it is returned to the payer. */
export function authorizationDeadline(tokenExpiresAt: Date, rules: GateDeadlineRules): Date {
  return new Date(tokenExpiresAt.getTime() + rules.authorizationGraceSeconds * 1000);
}

/**
 * When the sweeper first looks at a new gate: no gate's reserve can fall due earlier (an authorization comes after
 * the gate, so its deadline is at least the grace away; a held gate lasts the TTL).
 */
export function firstGateCheck(createdAt: Date, rules: GateDeadlineRules): Date {
  return new Date(createdAt.getTime() + Math.min(rules.gateTtlSeconds, rules.authorizationGraceSeconds) * 1000);
}

/**
 * What an `escrow-gate` payment made through x402 HTTP binds: the method and the resource URL of the request the
 * provider serves. The provider's server scheme writes both into the requirement's `extra` (from the request it
 * is answering), the payer hashes them into the quote, and the facilitator recomputes the hash from the
 * requirements the provider forwards, so a token bought for one request cannot pay for another.
 */
export interface X402RequestBinding {
  method: string;
  resource: string;
}

export function x402RequestSha256(binding: X402RequestBinding): string {
  return sha256Hex(canonicalize({ method: binding.method.toUpperCase(), resource: binding.resource }));
}

/** The binding a requirement's `extra` names, or null when it names none (then nothing can be bound). */
export function requestBindingOf(extra: Record<string, unknown> | undefined): X402RequestBinding | null {
  const method = extra?.method;
  const resource = extra?.resource;
  return typeof method === 'string' && method !== '' && typeof resource === 'string' && resource !== ''
    ? { method, resource }
    : null;
}

/** USD in minor units (cents): the asset "$1.23"-style prices name, and a default asset for x402 spend controls. */
export const X402_USD_ASSET = { asset: 'USD', decimals: 2, symbol: 'USD' } as const;

/** "$1.23", "1.23", "1" or 1.5 as integer cents, exactly (no float arithmetic); null for anything else. */
export function usdToMinorUnits(price: string | number): number | null {
  const match = /^\$?([0-9]{1,13})(?:\.([0-9]{1,2}))?$/.exec(String(price).trim());
  if (!match) return null;
  return Number(match[1]) * 100 + Number((match[2] ?? '').padEnd(2, '0'));
}
