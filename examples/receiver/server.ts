// Example webhook receiver for the Agent Run Settlement Service.
//
//   WEBHOOK_SECRET=whsec_… PORT=4000 node --import tsx examples/receiver/server.ts
//
// - Verifies the signature over the RAW body before parsing anything (verifyWebhook), refusing with 401 otherwise.
// - Processes each event id once: ids are remembered after their hook succeeds, in memory by default, or appended to
//   a file when RECEIVER_STATE_FILE is set (so a restart does not process an event again).
// - Answers 204 once the event is processed (or was already); 500 when a hook throws, so the service retries.
// - Listens on 127.0.0.1 only: put your own TLS-terminating proxy in front of it.
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { fileURLToPath } from 'node:url';
import { verifyWebhook, WebhookVerificationError, type WebhookEvent } from 'agent-settlement/webhooks';

type Data = Record<string, unknown>;
type Hook = (event: WebhookEvent<Data>) => Promise<void> | void;

// ------------------------------------------------------------------------------------------------------------------
// HOOKS: your business logic, one per event type. Each may run again only if it threw (the event is not marked
// processed then); keep your own writes idempotent by event id too when they leave this process.

export interface WebhookHooks {
  'run.finalized': Hook;
  'settlement.completed': Hook;
  'settlement.held': Hook;
  'dispute.opened': Hook;
  'dispute.resolved': Hook;
  /** x402.escalation.created, x402.escalation.approved, x402.escalation.denied, x402.agent.wound_down */
  x402: Hook;
}

const log = (event: WebhookEvent<Data>, advice: string) =>
  console.log(JSON.stringify({ id: event.id, type: event.type, data: event.data, advice }));

export const recommendedHooks: WebhookHooks = {
  // HOOK run.finalized {runId, …}: the run has a verdict (pass | fail) and a signed artifact. Do not act on the
  // webhook alone: fetch GET /v1/verify/{runId} (or verify the artifact offline against /.well-known/jwks.json) and
  // require verified:true, then settle (POST /v1/runs/{runId}/settle) if you are the one who pays.
  'run.finalized': (e) => log(e, 'verify the artifact, then settle the run'),
  // HOOK settlement.completed {runId, settlementId, amount, holdback, currency}: `amount` (minor units) was released
  // to the payee now; `holdback` stays in escrow until the dispute window ends and is released without another event
  // unless a dispute is opened. Record the payment against runId.
  'settlement.completed': (e) => log(e, 'record the payment; the holdback follows after the dispute window'),
  // HOOK settlement.held {runId, settlementId, reason}: the verdict was fail, the money stays locked in escrow.
  // Alert whoever owns the run; an operator ends it with POST /ops/settlements/{settlementId}/resolve.
  'settlement.held': (e) => log(e, 'alert the run owner; funds stay in escrow until resolved'),
  // HOOK dispute.opened {disputeId, runId, settlementId}: the payer disputes the run inside its window; the holdback is
  // frozen. Gather your evidence for the run (its artifact) and stop treating the holdback as yours.
  'dispute.opened': (e) => log(e, 'holdback frozen; gather evidence'),
  // HOOK dispute.resolved {disputeId, …}: the frozen funds moved to the payee, back to the payer, or split. Reconcile
  // your books with GET /runs/{runId}/settlement.
  'dispute.resolved': (e) => log(e, 'reconcile with the settlement record'),
  // HOOK x402.*:
  //   x402.escalation.created  - a payment needs a human: notify an approver, who answers with
  //                              POST /x402/gate/escalations/{id}/resolve {action: approve|deny}.
  //   x402.escalation.approved - retry authorize-payment with the single-use escalationOverrideToken.
  //   x402.escalation.denied   - give up the paid call and tell its caller.
  //   x402.agent.wound_down    - stop routing paid calls to that agent; it can start no new gates.
  x402: (e) => log(e, 'see the x402 section of the contract'),
};

function hookFor(hooks: WebhookHooks, type: string): Hook | null {
  if (type.startsWith('x402.')) return hooks.x402;
  return Object.hasOwn(hooks, type) ? hooks[type as keyof WebhookHooks] : null;
}

// ------------------------------------------------------------------------------------------------------------------
// Processed event ids

export interface ProcessedIds {
  has(id: string): boolean;
  add(id: string): void;
}

/** In memory: enough to absorb retries while the process runs; forgets on restart. */
export class MemoryProcessedIds implements ProcessedIds {
  private readonly ids = new Set<string>();
  has(id: string) {
    return this.ids.has(id);
  }
  add(id: string) {
    this.ids.add(id);
  }
}

/** One id per line in an append-only file, loaded at start: survives restarts of a single receiver process. */
export class FileProcessedIds extends MemoryProcessedIds {
  constructor(private readonly path: string) {
    super();
    if (existsSync(path)) for (const id of readFileSync(path, 'utf8').split('\n')) if (id) super.add(id);
  }
  override add(id: string) {
    appendFileSync(this.path, `${id}\n`);
    super.add(id);
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Processing: verify, deduplicate, dispatch

export interface HandlerOptions {
  /** The endpoint's secret; during a rotation pass both the new and the old one. */
  secrets: string[];
  hooks?: WebhookHooks;
  processed?: ProcessedIds;
}

export type WebhookHandler = (
  rawBody: Buffer,
  headers: IncomingHttpHeaders,
) => Promise<{ status: number; processed: boolean }>;

export function createWebhookHandler(options: HandlerOptions): WebhookHandler {
  const hooks = options.hooks ?? recommendedHooks;
  const processed = options.processed ?? new MemoryProcessedIds();
  const inFlight = new Map<string, Promise<void>>();

  return async (rawBody, headers) => {
    let event: WebhookEvent<Data>;
    try {
      event = verifyWebhook(rawBody, headers as Record<string, string | string[] | undefined>, options.secrets);
    } catch (err) {
      if (err instanceof WebhookVerificationError) return { status: 401, processed: false };
      throw err;
    }
    if (processed.has(event.id)) return { status: 204, processed: false };
    const running = inFlight.get(event.id);
    if (running) {
      // The same event arrived twice at once: answer with the outcome of the first copy.
      const ok = await running.then(
        () => true,
        () => false,
      );
      return { status: ok ? 204 : 500, processed: false };
    }
    const work = (async () => {
      await hookFor(hooks, event.type)?.(event); // unknown (newer) types are acknowledged and ignored
      processed.add(event.id);
    })();
    inFlight.set(event.id, work);
    try {
      await work;
      return { status: 204, processed: true };
    } catch (err) {
      console.error(JSON.stringify({ id: event.id, type: event.type, error: (err as Error).message }));
      return { status: 500, processed: false }; // the service retries; never answer 410 (it disables the endpoint)
    } finally {
      inFlight.delete(event.id);
    }
  };
}

const MAX_BODY_BYTES = 1024 * 1024;

export function createReceiverServer(handler: WebhookHandler, path = '/webhooks'): Server {
  return createServer((req, res) => {
    if ((req.url ?? '').split('?')[0] !== path) return void res.writeHead(404).end();
    if (req.method !== 'POST') return void res.writeHead(405, { allow: 'POST' }).end();
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        res.writeHead(413).end();
        req.destroy();
      } else {
        chunks.push(chunk);
      }
    });
    req.on('end', () => {
      if (res.headersSent) return;
      handler(Buffer.concat(chunks), req.headers).then(
        ({ status }) => res.writeHead(status).end(),
        () => res.writeHead(500).end(),
      );
    });
  });
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const secrets = (process.env.WEBHOOK_SECRET ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (secrets.length === 0) {
    console.error(
      'set WEBHOOK_SECRET (the whsec_… shown when the endpoint was created; comma-separate two while rotating)',
    );
    process.exit(2);
  }
  const stateFile = process.env.RECEIVER_STATE_FILE;
  const handler = createWebhookHandler({
    secrets,
    processed: stateFile ? new FileProcessedIds(stateFile) : new MemoryProcessedIds(),
  });
  const port = Number(process.env.PORT ?? 4000);
  createReceiverServer(handler).listen(port, '127.0.0.1', () => {
    console.log(
      `webhook receiver on http://127.0.0.1:${port}/webhooks (${stateFile ? `ids in ${stateFile}` : 'ids in memory'})`,
    );
  });
}
