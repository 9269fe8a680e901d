import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { createSettlementClient, SettlementApiError } from 'agent-settlement-client';

// The client's transport against a small local server that answers what each test scripts (429, 503, a dropped
// connection) before it answers like the service: what a caller sees when the service is busy or briefly away.

interface Seen {
  method: string;
  url: string;
  idempotencyKey: string | undefined;
  authorization: string | undefined;
  body: string;
  at: number;
}
type Answer = (req: IncomingMessage, res: ServerResponse) => void;

let server: Server | undefined;
afterEach(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)));
  server = undefined;
});

/** Answers the scripted responses in order, then `last` for every later request. */
async function scripted(answers: Answer[], last: Answer) {
  const seen: Seen[] = [];
  server = createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      seen.push({
        method: req.method!,
        url: req.url!,
        idempotencyKey: req.headers['idempotency-key'] as string | undefined,
        authorization: req.headers.authorization,
        body,
        at: performance.now(),
      });
      (answers.shift() ?? last)(req, res);
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
  const baseUrl = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return { seen, baseUrl };
}

const json =
  (status: number, body: unknown, headers: Record<string, string> = {}): Answer =>
  (_req, res) => {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(JSON.stringify(body));
  };
const busy = (status: 429 | 503, retryAfter?: string) =>
  json(
    status,
    { code: status === 429 ? 'RATE_LIMITED' : 'UNAVAILABLE', message: 'try again', requestId: 'req_1' },
    retryAfter ? { 'retry-after': retryAfter } : {},
  );
const created = json(201, {
  runId: 'run_1',
  status: 'in_progress',
  artifactId: null,
  agentId: 'a',
  terms: {},
  settlement: null,
  createdAt: '2026-01-01T00:00:00.000Z',
});
const dropConnection: Answer = (req) => req.socket.destroy();

describe('retries', () => {
  it('a state-changing call retried after 429 and 503 waits what Retry-After says and sends the same Idempotency-Key each time', async () => {
    const { seen, baseUrl } = await scripted([busy(429, '1'), busy(503, '1')], created);
    const client = createSettlementClient({ baseUrl, apiKey: 'sk_test.secret' });
    const run = await client.createRun({ body: { agentId: 'a' } });
    expect(run.runId).toBe('run_1');
    expect(seen.map((s) => s.method)).toEqual(['POST', 'POST', 'POST']);
    const key = seen[0]!.idempotencyKey;
    expect(key).toMatch(/^[A-Za-z0-9._:-]{1,255}$/);
    expect(seen.map((s) => s.idempotencyKey)).toEqual([key, key, key]);
    expect(new Set(seen.map((s) => s.body)).size).toBe(1);
    expect(JSON.parse(seen[2]!.body)).toEqual({ agentId: 'a' });
    expect(seen.every((s) => s.authorization === 'Bearer sk_test.secret')).toBe(true);
    // Retry-After: 1 means not before a second has passed (timers may fire a hair early, never much).
    expect(seen[1]!.at - seen[0]!.at).toBeGreaterThanOrEqual(990);
    expect(seen[2]!.at - seen[1]!.at).toBeGreaterThanOrEqual(990);

    // The next logical call gets a key of its own; a caller's own key is sent as given.
    await client.createRun({ body: { agentId: 'a' } });
    await client.createRun({ body: { agentId: 'a' }, idempotencyKey: 'order-42:run' });
    expect(seen[3]!.idempotencyKey).not.toBe(key);
    expect(seen[4]!.idempotencyKey).toBe('order-42:run');
  });

  it('gives up after maxAttempts and surfaces the last answer as a typed error', async () => {
    const { seen, baseUrl } = await scripted([], busy(503));
    const retries: number[] = [];
    const client = createSettlementClient({
      baseUrl,
      retry: { maxAttempts: 3, baseDelayMs: 5, onRetry: (r) => retries.push(r.status!) },
    });
    const err = await client.createRun({ body: { agentId: 'a' } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SettlementApiError);
    expect(err).toMatchObject({
      status: 503,
      code: 'UNAVAILABLE',
      message: expect.stringContaining('try again'),
      requestId: 'req_1',
    });
    expect(seen).toHaveLength(3);
    expect(retries).toEqual([503, 503]);
    expect(new Set(seen.map((s) => s.idempotencyKey)).size).toBe(1);
  });

  it('does not retry before a Retry-After longer than it may wait: the error carries how long to wait', async () => {
    const { seen, baseUrl } = await scripted([], busy(429, '120'));
    const client = createSettlementClient({ baseUrl, retry: { maxDelayMs: 5_000 } });
    const err = await client.getRun({ params: { path: { runId: 'run_1' } } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ status: 429, code: 'RATE_LIMITED', retryAfterSeconds: 120 });
    expect(seen).toHaveLength(1);
  });

  it('retries a call whose first attempt is still running (409 IDEMPOTENCY_IN_PROGRESS) with the same key', async () => {
    const inProgress = json(
      409,
      { code: 'IDEMPOTENCY_IN_PROGRESS', message: 'same key still being processed', requestId: 'r' },
      { 'retry-after': '1' },
    );
    const { seen, baseUrl } = await scripted([inProgress], created);
    const run = await createSettlementClient({ baseUrl }).createRun({ body: { agentId: 'a' } });
    expect(run.runId).toBe('run_1');
    expect(seen).toHaveLength(2);
    expect(seen[1]!.idempotencyKey).toBe(seen[0]!.idempotencyKey);
  });

  it('retries a dropped connection for reads and for keyed writes, and not at all when retries are off', async () => {
    const { seen, baseUrl } = await scripted([dropConnection, dropConnection], created);
    const client = createSettlementClient({ baseUrl, retry: { baseDelayMs: 5 } });
    expect((await client.createRun({ body: { agentId: 'a' } })).runId).toBe('run_1');
    expect(seen).toHaveLength(3);
    expect(new Set(seen.map((s) => s.idempotencyKey)).size).toBe(1);

    const once = createSettlementClient({ baseUrl, retry: false });
    server!.removeAllListeners('request');
    server!.on('request', (req: IncomingMessage) => {
      seen.push({
        method: req.method!,
        url: req.url!,
        idempotencyKey: undefined,
        authorization: undefined,
        body: '',
        at: performance.now(),
      });
      req.socket.destroy();
    });
    await expect(once.getRun({ params: { path: { runId: 'run_1' } } })).rejects.toThrow();
    expect(seen).toHaveLength(4);
  });

  it('does not retry a refusal a retry cannot cure (4xx): it surfaces at once as a typed error', async () => {
    const { seen, baseUrl } = await scripted(
      [],
      json(422, {
        code: 'VALIDATION_FAILED',
        message: 'agentId is required',
        details: { field: 'agentId' },
        requestId: 'req_9',
      }),
    );
    const err = await createSettlementClient({ baseUrl })
      .createRun({ body: { agentId: '' } })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SettlementApiError);
    expect(err).toMatchObject({
      status: 422,
      code: 'VALIDATION_FAILED',
      details: { field: 'agentId' },
      requestId: 'req_9',
    });
    expect(seen).toHaveLength(1);
  });
});
