// x402 quotes: a gate's quotes form a chain (the last one is current), each bound to one request and live until it
// expires; the checks every later step makes on the quote it is handed.
import { newId } from '../../domain/crypto.ts';
import { x402Error } from '../../domain/errors.ts';
import {
  DEFAULT_QUOTE_TTL_SECONDS,
  paymentRequiredHeader,
  paymentRequirements,
  quoteSha256,
  type PaymentRequirementsV2,
} from '../../domain/x402.ts';
import type { Runtime } from '../../runtime.ts';
import type { GateDoc, QuoteDoc } from '../../store/x402.ts';
import { isTerminal, valueOf, type X402Gates } from './gates.ts';

export interface QuoteResult {
  quote: QuoteDoc;
  gate: GateDoc;
  paymentRequirements: PaymentRequirementsV2;
  paymentRequired: string;
}

export class X402Quotes {
  constructor(
    private readonly runtime: Runtime,
    private readonly gates: X402Gates,
  ) {}

  private get store() {
    return this.runtime.stores.x402;
  }

  async quote(
    tenantId: string,
    input: { gateId: string; requestSha256: string; ttlSeconds?: number },
  ): Promise<QuoteResult> {
    const gate = await this.gates.requireGate(tenantId, input.gateId);
    const [lifecycle, checked] = await Promise.allSettled([
      this.gates.requireLiveAgents(tenantId, [gate.payerAgentId, gate.payeeAgentId]),
      this.gates.checkState(gate),
    ]);
    valueOf(lifecycle);
    const state = valueOf(checked);
    if (isTerminal(state.status)) throw await this.gates.terminal(gate, 'takes no quotes');
    const ttlSeconds = input.ttlSeconds ?? DEFAULT_QUOTE_TTL_SECONDS;
    let live: QuoteDoc | null = null;
    let created = false;
    const now = new Date();
    // Within the gate's chain (queued per gate): a live quote for the same request is the answer, unchanged.
    await this.store.quoteSlots.append(gate._id, async (slot, previous) => {
      const prior = previous && (await this.store.quoteOfTenant(previous.ref, tenantId));
      if (prior && prior.requestSha256 === input.requestSha256 && prior.expiresAt > now) {
        live = prior;
        return null;
      }
      if (state.status === 'authorized') return null; // an authorized gate is past quoting other requests
      created = true;
      const quoteId = newId('quo');
      const expiresAt = new Date(now.getTime() + ttlSeconds * 1000);
      live = {
        _id: quoteId,
        tenantId,
        gateId: gate._id,
        slot,
        requestSha256: input.requestSha256,
        quoteSha256: quoteSha256({
          gateId: gate._id,
          quoteId,
          requestSha256: input.requestSha256,
          amount: gate.amount,
          currency: gate.currency,
          payeeAgentId: gate.payeeAgentId,
          expiresAt: expiresAt.toISOString(),
        }),
        ttlSeconds,
        createdAt: now,
        expiresAt,
      };
      return { ref: quoteId };
    });
    const quote = live as QuoteDoc | null;
    if (!quote)
      throw x402Error('X402_GATE_TERMINAL', 'the gate is already authorized for another request', {
        status: 'authorized',
      });
    // The slot names the quote before the quote exists; a crash in between leaves a slot the next quote supersedes.
    if (created) await this.store.recordQuote(quote);
    else this.store.rememberQuote(quote);
    return this.quoteResult(gate, quote);
  }

  quoteResult(gate: GateDoc, quote: QuoteDoc): QuoteResult {
    const requirements = paymentRequirements(
      {
        gateId: gate._id,
        quoteId: quote._id,
        requestSha256: quote.requestSha256,
        amount: gate.amount,
        currency: gate.currency,
        payeeAgentId: gate.payeeAgentId,
        expiresAt: quote.expiresAt.toISOString(),
      },
      this.runtime.config.x402.network,
      quote.ttlSeconds,
    );
    const resource = {
      url: `${this.runtime.config.publicBaseUrl}/x402/gate/${gate._id}`,
      description: gate.toolId ? `tool ${gate.toolId}` : 'x402 payment gate',
    };
    return {
      quote,
      gate,
      paymentRequirements: requirements,
      paymentRequired: paymentRequiredHeader(requirements, resource),
    };
  }

  /** The quote (this tenant's, from memory once seen) and the gate's current quote position. */
  async readQuote(gate: GateDoc, quoteId: string): Promise<{ quote: QuoteDoc | null; head: number }> {
    const [quote, head] = await Promise.all([
      this.store.quoteOfTenant(quoteId, gate.tenantId),
      this.store.quoteSlots.head(gate._id),
    ]);
    return { quote, head };
  }

  /** Quote checks in the contract's order: found (this tenant), of this gate and current, live, bound to the request. */
  quoteChecks(
    gate: GateDoc,
    { quote, head }: { quote: QuoteDoc | null; head: number },
    quoteId: string,
    requestSha256: string,
    now: Date,
  ): QuoteDoc {
    if (!quote) throw x402Error('X402_QUOTE_NOT_FOUND', 'no such quote', { quoteId });
    if (quote.gateId !== gate._id)
      throw x402Error('X402_QUOTE_MISMATCH', 'the quote belongs to another gate', { quoteId, gateId: gate._id });
    if (quote.slot !== head)
      throw x402Error('X402_QUOTE_MISMATCH', 'a newer quote has replaced this one', { quoteId, gateId: gate._id });
    if (quote.expiresAt <= now)
      throw x402Error('X402_QUOTE_EXPIRED', 'the quote has expired; ask for a new one', {
        quoteId,
        expiredAt: quote.expiresAt.toISOString(),
      });
    if (quote.requestSha256 !== requestSha256)
      throw x402Error('X402_REQUEST_BINDING_MISMATCH', 'requestSha256 is not the request this quote was made for', {
        quoteId,
      });
    return quote;
  }
}
