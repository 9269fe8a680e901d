// The Agent Run Settlement Service as the x402 facilitator of a provider's resource server:
//
//   const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl, apiKey: providerKey }));
//
// The provider's API key (scopes x402:write, which covers x402:read) goes to verify and settle as a Bearer
// credential; the service then settles only gates of the provider's own tenant. (`supported` is public; the header
// sent to it too is harmless.)
import { HTTPFacilitatorClient, type FacilitatorConfig } from '@x402/core/server';

export interface EscrowGateFacilitatorOptions {
  /** The service's base URL, e.g. https://settlement.example.com */
  serviceUrl: string;
  /** The provider's API key (`sk_…`). */
  apiKey: string;
  /** Per-request timeout; verify and settle answer within a few seconds (default: the client's own). */
  timeoutMs?: number;
}

export function escrowGateFacilitatorConfig(options: EscrowGateFacilitatorOptions): FacilitatorConfig {
  const headers = { Authorization: `Bearer ${options.apiKey}` };
  return {
    url: `${options.serviceUrl.replace(/\/$/, '')}/x402/facilitator`,
    ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}),
    createAuthHeaders: async () => ({ verify: headers, settle: headers, supported: headers }),
  };
}

/**
 * The stock client, plus: the legacy network ids `/supported` announces in a kind's `extra.deprecatedNetworks` are
 * offered as kinds of their own until their window ends, so a provider still configured with the old id (which the
 * service still settles) starts, while the service itself lists only its CAIP-2 id.
 */
class EscrowGateFacilitatorClient extends HTTPFacilitatorClient {
  override async getSupported(): ReturnType<HTTPFacilitatorClient['getSupported']> {
    const supported = await super.getSupported();
    const now = Date.now();
    const legacy = supported.kinds.flatMap((kind) => {
      const announced =
        (kind.extra as { deprecatedNetworks?: Array<{ network?: unknown; acceptedUntil?: unknown }> } | undefined)
          ?.deprecatedNetworks ?? [];
      return announced
        .filter(
          (d) =>
            typeof d.network === 'string' && typeof d.acceptedUntil === 'string' && Date.parse(d.acceptedUntil) > now,
        )
        .map((d) => ({
          x402Version: kind.x402Version,
          scheme: kind.scheme,
          network: d.network as typeof kind.network,
        }));
    });
    return { ...supported, kinds: [...supported.kinds, ...legacy] };
  }
}

export function escrowGateFacilitator(options: EscrowGateFacilitatorOptions): HTTPFacilitatorClient {
  return new EscrowGateFacilitatorClient(escrowGateFacilitatorConfig(options));
}
