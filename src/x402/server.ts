// The provider's side of the `escrow-gate` x402 scheme, for the stock x402 v2 resource server and its middleware:
//
//   const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl, apiKey })).register(network, new EscrowGateServerScheme());
//   app.use(paymentMiddleware({ 'GET /search': { accepts: { scheme: 'escrow-gate', network, payTo: payeeAgentId, price: '$0.10' } } }, server));
//
// Flow "authorization": the facilitator verifies the payment before the handler runs and settles it after the
// handler answered. The requirement names the request it pays for (extra.method, extra.resource, written from the
// request being answered) and carries a nonce per 402, so each payment is its own gate. Settling sends the
// sha256 of the response served as the gate's evidence. Runs in the provider's process: pure domain imports only.
//
// Metered (`new EscrowGateServerScheme({ metered: true })`): the route's price is a maximum (the requirement says so
// with extra.metered: true). The payer's gate locks the maximum; the handler states what the call actually cost with
// the stock `setSettlementOverrides(res, { amount })` (minor units, "$0.05" or a percentage), settle charges that
// (the holdback applies to it) and the rest goes back to the payer at once. 0 charges nothing; an amount above the
// maximum is refused (`capture_exceeds_authorization`) and moves nothing.
import type {
  AssetAmount,
  Network,
  PaymentFlowConfig,
  PaymentRequirements,
  Price,
  SchemeNetworkServer,
  SchemePaymentRequiredContext,
  SettleContext,
} from '@x402/core/types';
import { randomBytes, type KeyObject } from 'node:crypto';
import { sha256Hex } from '../domain/crypto.ts';
import type { PriceSchedule } from '../domain/pricing.ts';
import { signUsageRecord, USAGE_RECORD_SCHEMA, type UsageRecord } from '../domain/usage.ts';
import { CURRENCY_PATTERN } from '../domain/money.ts';
import { X402_SCHEME, X402_SESSION_SCHEME, X402_USD_ASSET, usdToMinorUnits } from '../domain/x402.ts';

export interface EscrowGateServerOptions {
  /** Share of each payment held back for the dispute window, in basis points (default 0). */
  holdbackBps?: number;
  /** How long the payer may dispute the held-back part (default 86400). */
  disputeWindowSeconds?: number;
  /** Names the tool in the gate, for sponsor wallets whose policy allows only listed tools. */
  toolId?: string;
  /** The price is a maximum: the handler charges what the call cost through a settlement override (see above). */
  metered?: boolean;
}

const AMOUNT = /^[1-9][0-9]{0,15}$/;

export class EscrowGateServerScheme implements SchemeNetworkServer {
  readonly scheme: string = X402_SCHEME;
  /** No asset transfer methods: the money moves inside the service's ledger. */
  readonly defaultAssetTransferMethod = 'default';
  readonly paymentFlows: Readonly<Record<string, PaymentFlowConfig>> = {
    default: { supported: ['authorization'], default: 'authorization' },
  };
  /** A fresh nonce per 402 answer: the paid request's requirement matches the payer's whatever nonce it drew. */
  readonly dynamicExtraFields = ['paymentNonce'];
  private readonly terms: Record<string, unknown>;

  constructor(options: EscrowGateServerOptions = {}) {
    this.terms = {
      holdbackBps: options.holdbackBps ?? 0,
      disputeWindowSeconds: options.disputeWindowSeconds ?? 86_400,
      ...(options.toolId ? { toolId: options.toolId } : {}),
      ...(options.metered ? { metered: true } : {}),
    };
  }

  /** `{amount, asset}` in minor units as it is; "$1.23", "1.23" or a number as USD cents. */
  async parsePrice(price: Price, network: Network): Promise<AssetAmount> {
    if (typeof price === 'object') {
      if (!AMOUNT.test(price.amount) || !Number.isSafeInteger(Number(price.amount)))
        throw new Error(`escrow-gate amounts are integer minor units, got ${price.amount}`);
      if (!new RegExp(CURRENCY_PATTERN).test(price.asset))
        throw new Error(`escrow-gate assets are currencies like USD, got ${price.asset}`);
      return { amount: price.amount, asset: price.asset, ...(price.extra ? { extra: price.extra } : {}) };
    }
    const cents = usdToMinorUnits(price);
    if (cents === null || cents < 1)
      throw new Error(`cannot price ${String(price)} on ${network}: use "$1.23" or {amount, asset}`);
    return { amount: String(cents), asset: X402_USD_ASSET.asset };
  }

  getAssetDecimals(asset: string): number | undefined {
    return asset === X402_USD_ASSET.asset ? X402_USD_ASSET.decimals : undefined;
  }

  async enhancePaymentRequirements(requirements: PaymentRequirements): Promise<PaymentRequirements> {
    return { ...requirements, extra: { ...requirements.extra, ...this.terms } };
  }

  /** Binds each of our requirements to the request being answered, and gives it its nonce (once). */
  async enrichPaymentRequiredResponse(context: SchemePaymentRequiredContext): Promise<PaymentRequirements[]> {
    const method =
      (context.transportContext as { request?: { method?: string } } | undefined)?.request?.method ?? 'GET';
    return context.requirements.map((r) =>
      r.scheme !== this.scheme || r.extra.paymentNonce !== undefined
        ? r
        : {
            ...r,
            extra: {
              ...r.extra,
              method: method.toUpperCase(),
              resource: context.resourceInfo.url,
              paymentNonce: randomBytes(16).toString('hex'),
            },
          },
    );
  }

  /** The served response's sha256, the gate's evidence. */
  async enrichSettlementPayload(context: SettleContext): Promise<Record<string, unknown>> {
    const body = (context.transportContext as { responseBody?: Uint8Array } | undefined)?.responseBody;
    return { responseSha256: sha256Hex(body ?? new Uint8Array()) };
  }
}

export interface EscrowSessionServerOptions extends EscrowGateServerOptions {
  /**
   * Priced by use: the schedule the payer's session is opened with (sent in the requirement's extra). A route then
   * states what a call used with setUsage(res, {metric: count}); the payee signs that usage record and the session
   * prices it. The route's price stays the most one call may cost (what verify holds).
   */
  pricing?: PriceSchedule;
  /** The payee agent's registered key (its keyId and private key): signs each call's usage record. */
  payeeKey?: { keyId: string; privateKey: KeyObject };
}

/** The response header a route states its call's usage in (JSON `{metric: count}`), read at settle. */
export const USAGE_HEADER = 'x-settlement-usage';

/** States what this call used, for a route priced by use (setSettlementOverrides' counterpart for usage). */
export function setUsage(
  res: { setHeader(name: string, value: string): unknown },
  usage: Record<string, number>,
): void {
  res.setHeader(USAGE_HEADER, JSON.stringify(usage));
}

/**
 * The provider's side of the `escrow-session` scheme: the same requirements (price, terms, request binding), paid
 * from a payment session the payer opened once. The facilitator's verify holds the price in the session's budget,
 * its settle charges what the call cost (the price, or less through the middleware's settlement overrides).
 * Register it beside the gate scheme and list both in a route's `accepts`; the payer's client picks the one it has.
 *
 * With `pricing` and `payeeKey`, a call whose route stated its usage (setUsage) settles with the payee's signed usage
 * record (UsageRecord.v1: the session and payment, the payee, the usage, the request's and the served response's
 * sha256), added to the settle payload by the stock enrichSettlementPayload hook: the session charges its price.
 */
export class EscrowSessionServerScheme extends EscrowGateServerScheme {
  override readonly scheme: string = X402_SESSION_SCHEME;

  constructor(private readonly sessionOptions: EscrowSessionServerOptions = {}) {
    super(sessionOptions);
    if (sessionOptions.pricing && !sessionOptions.payeeKey)
      throw new Error('a priced escrow-session scheme needs the payee agent key that signs usage (payeeKey)');
    // @x402/core calls the settle hook detached from the scheme: bound, it still reads this scheme's options.
    this.enrichSettlementPayload = this.enrichSettlementPayload.bind(this);
  }

  override async enhancePaymentRequirements(requirements: PaymentRequirements): Promise<PaymentRequirements> {
    const enhanced = await super.enhancePaymentRequirements(requirements);
    const { pricing } = this.sessionOptions;
    return pricing ? { ...enhanced, extra: { ...enhanced.extra, pricing } } : enhanced;
  }

  override async enrichSettlementPayload(context: SettleContext): Promise<Record<string, unknown>> {
    const enrichment = await super.enrichSettlementPayload(context);
    const transport = context.transportContext as { responseHeaders?: Record<string, string> } | undefined;
    const stated = transport?.responseHeaders?.[USAGE_HEADER];
    const key = this.sessionOptions.payeeKey;
    if (stated === undefined || !key || !this.sessionOptions.pricing) return enrichment;
    const payload = context.paymentPayload.payload as {
      sessionId?: unknown;
      paymentId?: unknown;
      requestSha256?: unknown;
    };
    const record: UsageRecord = {
      schema: USAGE_RECORD_SCHEMA,
      sessionId: String(payload.sessionId),
      paymentId: String(payload.paymentId),
      payeeAgentId: context.requirements.payTo,
      usage: JSON.parse(stated) as Record<string, number>,
      requestSha256: String(payload.requestSha256),
      responseSha256: enrichment.responseSha256 as string,
    };
    return { ...enrichment, usage: { record, payeeSignature: signUsageRecord(record, key) } };
  }
}
