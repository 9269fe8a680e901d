// The Agent Run Settlement Service as the x402 facilitator of a provider's resource server:
//
//   const server = new x402ResourceServer(escrowGateFacilitator({ serviceUrl, apiKey: providerKey }));
//
// The provider's API key (scopes x402:write, which covers x402:read) goes to verify, settle and supported as a
// Bearer credential; the service then settles only gates of the provider's own tenant.
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

export function escrowGateFacilitator(options: EscrowGateFacilitatorOptions): HTTPFacilitatorClient {
  return new HTTPFacilitatorClient(escrowGateFacilitatorConfig(options));
}
