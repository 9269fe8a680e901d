// The x402 payment gate's use cases (contract section 8), one file per flow in this folder:
//   gates.ts                create and fund a gate (raced against a wind-down), its state, its reserve's return
//   quotes.ts               a gate's quote chain and the checks on a quote
//   wallet-policies.ts      wallet policies, the daily spend, a sponsor wallet's decision
//   authorization.ts        payment authorization (the gate's one commitment and its payment token)
//   escalations.ts          escalations of policy refusals, approved or denied by a person
//   verify.ts               the provider's report and the x402-verify job's settlement decision
//   wind-down.ts            an agent's wind-down
//   sessions.ts             payment sessions: a budget reserved once, one request per paid call, settled at close
//   session-facilitator.ts  the facilitator's verify and settle for session payments
//   tokens.ts               the JWTs those flows sign and check
//   expiry.ts               the sweeper of gates past their deadline; facilitator.ts the x402 v2 facilitator
// Every ledger entry id and every event of a gate is decided in these files. X402Service wires the flows together,
// and its callers (routes, the x402-verify worker, the sweeper, the facilitator) name the flow they call:
// `x402.gates.createGate(...)`, `x402.sessions.charge(...)`. One instance per process (x402Service), so they share
// its per-process memory (funded gates, wallets seen, session seqs handed out) and its one listener on the verify
// queue's events.
import type { Runtime } from '../../runtime.ts';
import { X402Authorization } from './authorization.ts';
import { X402EscalationDeadlines, X402Escalations } from './escalations.ts';
import { X402Gates } from './gates.ts';
import { X402Quotes } from './quotes.ts';
import { X402Sessions } from './sessions.ts';
import { X402Tokens } from './tokens.ts';
import { X402Verification } from './verify.ts';
import { X402WalletPolicies } from './wallet-policies.ts';
import { X402WindDown } from './wind-down.ts';

export type { PaymentAuthorization } from './authorization.ts';
export {
  BULK_RESOLVE_LIMIT,
  deadlineOf,
  deciderName,
  escalationStatus,
  type BulkOutcome,
  type EscalationState,
} from './escalations.ts';
export { gateSettlementId, x402EntryIds, type CreateGateInput, type GateState } from './gates.ts';
export type { QuoteResult } from './quotes.ts';
export type { VerifyOutcome } from './verify.ts';

/** The one x402 service of each runtime (a process has one; each test app its own). */
const perRuntime = new WeakMap<Runtime, X402Service>();

/**
 * The process's x402 service: built once per runtime and shared by the routes, the facilitator and the x402-verify
 * worker, so they share its per-process memory (funded gates, wallets seen, session seqs handed out) and its one
 * listener on the verify queue's events. Closing it (the app's close) only closes that listener, which a later
 * wait opens again.
 */
export function x402Service(runtime: Runtime): X402Service {
  let service = perRuntime.get(runtime);
  if (!service) perRuntime.set(runtime, (service = new X402Service(runtime)));
  return service;
}

export class X402Service {
  readonly gates: X402Gates;
  readonly quotes: X402Quotes;
  readonly policies: X402WalletPolicies;
  readonly escalations: X402Escalations;
  readonly escalationDeadlines: X402EscalationDeadlines;
  readonly authorization: X402Authorization;
  readonly verification: X402Verification;
  readonly windDowns: X402WindDown;
  readonly sessions: X402Sessions;

  constructor(runtime: Runtime) {
    const tokens = new X402Tokens(runtime);
    this.gates = new X402Gates(runtime);
    this.quotes = new X402Quotes(runtime, this.gates);
    this.escalations = new X402Escalations(runtime, tokens);
    this.policies = new X402WalletPolicies(runtime, this.gates, this.quotes, tokens, this.escalations);
    this.escalationDeadlines = new X402EscalationDeadlines(runtime, this.gates);
    this.authorization = new X402Authorization(
      runtime,
      this.gates,
      this.quotes,
      this.policies,
      this.escalations,
      tokens,
    );
    this.verification = new X402Verification(runtime, this.gates);
    this.sessions = new X402Sessions(runtime, this.gates, this.policies);
    this.windDowns = new X402WindDown(runtime, this.gates, this.escalations, this.sessions);
  }

  /** Closes its one listener on the verify queue's events (a later wait opens it again). */
  close(): Promise<void> {
    return this.verification.close();
  }
}
