// The typed client: one method per API operation (named by its operationId, typed from openapi/openapi.json through
// openapi-typescript, sent by openapi-fetch), plus the few steps every integration repeats.
import createOpenApiClient, { type Client, type FetchResponse, type MaybeOptionalInit } from 'openapi-fetch';
import { verifyArtifact, type ArtifactVerification } from './artifact.ts';
import { verifyReceipt, type ReceiptVerification } from './receipt.ts';
import { apiErrorFrom } from './errors.ts';
import type { paths } from './generated/openapi.ts';
import { operationRoutes } from './generated/operations.ts';
import {
  RunEventSigner,
  generateAgentKeyPair,
  type AgentKeyPair,
  type EventEnvelope,
  type EventInput,
} from './signer.ts';
import { IDEMPOTENCY_HEADER, retryingFetch, type FetchLike, type RetryOptions } from './transport.ts';

export interface SettlementClientOptions {
  /** Where the service listens, e.g. http://127.0.0.1:3000. */
  baseUrl: string;
  /** A tenant API key (`sk_…`), or the admin key for the /ops operations. Sent as a bearer token. */
  apiKey?: string;
  /** Default: globalThis.fetch. Called with a Request. */
  fetch?: FetchLike;
  /** Retry policy; `false` sends every call once. */
  retry?: RetryOptions | false;
}

export type OperationId = keyof typeof operationRoutes;
type Route<K extends OperationId> = (typeof operationRoutes)[K];
type PathItem<K extends OperationId> = paths[Route<K>['path']];
type Method<K extends OperationId> = Route<K>['method'];
type OperationInit<K extends OperationId> = MaybeOptionalInit<PathItem<K>, Method<K>>;

/** Per call: your own Idempotency-Key (default: one generated per call and kept across its retries). */
export interface CallOptions {
  idempotencyKey?: string;
}
export type OperationCall<K extends OperationId> = NonNullable<OperationInit<K>> & CallOptions;
/** What the operation answers on success (its 2xx JSON body). */
export type OperationResult<K extends OperationId> = NonNullable<
  FetchResponse<PathItem<K>[Method<K>] & Record<string | number, unknown>, OperationCall<K>, 'application/json'>['data']
>;

/** One method per operation: `client.createRun({ body })`, `client.getRun({ params: { path: { runId } } })`. */
export type OperationMethods = {
  [K in OperationId]: undefined extends OperationInit<K>
    ? (call?: OperationCall<K>) => Promise<OperationResult<K>>
    : (call: OperationCall<K>) => Promise<OperationResult<K>>;
};

export type Run = OperationResult<'getRun'>;
export type RunSettlement = OperationResult<'getRunSettlement'>;
export type Artifact = OperationResult<'getArtifact'>;
export type Jwks = OperationResult<'getJwks'>;

/** An agent registered with a key pair made for it. */
export interface RegisteredAgent extends AgentKeyPair {
  agentId: string;
}

export interface WaitOptions {
  /** Give up after this long (ms, default 60 000). */
  timeoutMs?: number;
}

export interface SettlementClientHelpers {
  /** The underlying openapi-fetch client (same auth, idempotency and retries): `http.GET('/v1/runs/{runId}', …)`. */
  readonly http: Client<paths>;
  /** Makes an Ed25519 key pair for a new agent and registers the agent with its public key. */
  createAgent(agent?: {
    agentId?: string;
    namespace?: string;
    name?: string;
    displayName?: string;
    metadata?: Record<string, unknown>;
  }): Promise<RegisteredAgent>;
  /** A signer for a run's events; `head` defaults to the run's current head (read from the service). */
  eventSigner(
    runId: string,
    agent: Pick<AgentKeyPair, 'keyId' | 'privateKey'>,
    head?: RunEventSigner['head'],
  ): Promise<RunEventSigner>;
  /** Signs the events with `signer` and appends them as one batch (all or nothing); the signer's head moves only if they were accepted. */
  appendEvents(
    signer: RunEventSigner,
    events: readonly EventInput[],
    call?: CallOptions,
  ): Promise<OperationResult<'appendRunEvents'> & { events: EventEnvelope[] }>;
  /** Polls the run until it is finalized (the finalize worker built its artifact and verdict). */
  waitForFinalized(runId: string, options?: WaitOptions): Promise<Run>;
  /** Polls the run's settlement until the settle worker has decided it (no longer `pending`). */
  waitForSettlement(runId: string, options?: WaitOptions): Promise<RunSettlement>;
  /** Fetches an artifact and the service's JWKS and repeats every check here (hashes, signatures, chain). */
  verifyArtifactLocally(artifactId: string): Promise<ArtifactVerification & { artifact: Artifact }>;
  /** Fetches a run's settlement receipt, its artifact and the JWKS, and checks the receipt here. */
  verifyReceiptLocally(runId: string): Promise<ReceiptVerification & { settlement: RunSettlement }>;
}

export type SettlementClient = OperationMethods & SettlementClientHelpers;

const POLL_START_MS = 100;
const POLL_MAX_MS = 2_000;

async function poll<T>(
  what: string,
  read: () => Promise<T>,
  done: (value: T) => boolean,
  timeoutMs = 60_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (let wait = POLL_START_MS; ; wait = Math.min(POLL_MAX_MS, wait * 2)) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() + wait > deadline) throw new Error(`${what}: not done after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, wait));
  }
}

/** A client for one service and one credential. Every method throws SettlementApiError for a refused call. */
export function createSettlementClient(options: SettlementClientOptions): SettlementClient {
  const base: FetchLike = options.fetch ?? ((request) => globalThis.fetch(request));
  const http = createOpenApiClient<paths>({
    baseUrl: options.baseUrl.replace(/\/+$/, ''),
    fetch: retryingFetch(base, options.retry ?? {}),
    headers: options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {},
  });

  async function call(
    operationId: OperationId,
    init: (CallOptions & { headers?: Record<string, string> }) | undefined,
  ): Promise<unknown> {
    const { method, path } = operationRoutes[operationId];
    const { idempotencyKey, ...rest } = init ?? {};
    const headers = { ...rest.headers, ...(idempotencyKey ? { [IDEMPOTENCY_HEADER]: idempotencyKey } : {}) };
    // The generated types check `init` at the call site (OperationMethods); here every operation goes one way.
    const request = http.request as (
      m: string,
      p: string,
      i: object,
    ) => Promise<{ data?: unknown; error?: unknown; response: Response }>;
    const { data, error, response } = await request(method, path, { ...rest, headers });
    if (!response.ok) throw apiErrorFrom(response.status, error, response.headers.get('retry-after'));
    return data;
  }

  const operations = Object.fromEntries(
    (Object.keys(operationRoutes) as OperationId[]).map((id) => [id, (init?: CallOptions) => call(id, init)]),
  ) as unknown as OperationMethods;

  const client: SettlementClient = {
    ...operations,
    http,
    async createAgent(agent = {}) {
      const keys = generateAgentKeyPair();
      const registered = await client.registerAgent({
        body: { ...agent, publicKey: keys.publicKey } as OperationCall<'registerAgent'>['body'],
      });
      return { ...keys, agentId: registered.agentId };
    },
    async eventSigner(runId, agent, head) {
      return new RunEventSigner(runId, agent, head ?? (await client.getRun({ params: { path: { runId } } })).head);
    },
    async appendEvents(signer, events, callOptions) {
      const before = signer.head;
      const signed = signer.sign(events);
      try {
        const body = signed.length === 1 ? { event: signed[0]! } : { events: signed };
        const accepted = await client.appendRunEvents({
          params: { path: { runId: signer.runId } },
          body,
          ...callOptions,
        });
        return { ...accepted, events: signed };
      } catch (err) {
        signer.rewind(before);
        throw err;
      }
    },
    waitForFinalized(runId, wait) {
      return poll(
        `run ${runId} finalized`,
        () => client.getRun({ params: { path: { runId } } }),
        (run) => run.status === 'finalized',
        wait?.timeoutMs,
      );
    },
    waitForSettlement(runId, wait) {
      return poll(
        `settlement of run ${runId}`,
        () => client.getRunSettlement({ params: { path: { runId } } }),
        (s) => s.status !== 'pending',
        wait?.timeoutMs,
      );
    },
    async verifyArtifactLocally(artifactId) {
      const [artifact, jwks] = await Promise.all([
        client.getArtifact({ params: { path: { artifactId } } }),
        client.getJwks(),
      ]);
      return { ...verifyArtifact(artifact, jwks), artifact };
    },
    async verifyReceiptLocally(runId) {
      const settlement = await client.getRunSettlement({ params: { path: { runId } } });
      const run = await client.getRun({ params: { path: { runId } } });
      const [artifact, jwks] = await Promise.all([
        run.artifactId ? client.getArtifact({ params: { path: { artifactId: run.artifactId } } }) : null,
        client.getJwks(),
      ]);
      // A run whose data could never make an artifact has a receipt that says so (artifactHash null).
      const committed = { runId, artifactHash: (artifact as { artifactHash?: unknown } | null)?.artifactHash ?? null };
      return { ...verifyReceipt(settlement.receipt, jwks, { artifact: committed }), settlement };
    },
  };
  return client;
}
