// A small keep-alive HTTP client for loopback measurements (fetch adds its own overhead to every call), and the
// statistics the benchmark reports.
import http from 'node:http';

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

export interface RequestOptions {
  token?: string;
  body?: unknown;
  headers?: Record<string, string>;
}

export interface Reply {
  status: number;
  text: string;
  ms: number;
}

export class HttpClient {
  constructor(
    readonly port: number,
    private readonly timeoutMs = 60_000,
  ) {}

  /** `headers` are sent as given, beside the ones derived from `token` and `body` (say an Idempotency-Key). */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<Reply> {
    try {
      return await this.once(method, path, options);
    } catch (err) {
      // A kept-alive socket the server closed just as it was reused: the request never reached the server (Node's
      // documented case for one retry).
      if ((err as { reusedSocket?: boolean }).reusedSocket && (err as NodeJS.ErrnoException).code === 'ECONNRESET')
        return this.once(method, path, options);
      throw err;
    }
  }

  private once(method: string, path: string, options: RequestOptions): Promise<Reply> {
    const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
    const headers: Record<string, string> = { ...options.headers };
    if (options.token) headers.authorization = `Bearer ${options.token}`;
    if (payload !== undefined) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(Buffer.byteLength(payload));
    }
    const started = performance.now();
    return new Promise((resolve, reject) => {
      const req = http.request(
        { host: '127.0.0.1', port: this.port, method, path, headers, agent, timeout: this.timeoutMs },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            resolve({
              status: res.statusCode ?? 0,
              text: Buffer.concat(chunks).toString('utf8'),
              ms: performance.now() - started,
            }),
          );
          res.on('error', reject);
        },
      );
      req.on('timeout', () => req.destroy(new Error(`${method} ${path} timed out after ${this.timeoutMs} ms`)));
      req.on('error', (err) => reject(Object.assign(err, { reusedSocket: req.reusedSocket })));
      req.end(payload);
    });
  }

  /** Like request, but anything other than the expected status is an error that names the call. */
  async expect(
    status: number,
    method: string,
    path: string,
    options: RequestOptions = {},
  ): Promise<Reply & { json: any }> {
    const reply = await this.request(method, path, options);
    if (reply.status !== status)
      throw new Error(`${method} ${path} -> ${reply.status} (expected ${status}): ${reply.text.slice(0, 300)}`);
    return { ...reply, json: reply.text ? JSON.parse(reply.text) : null };
  }
}

export interface LatencySummary {
  count: number;
  p50: number;
  p95: number;
  p99: number;
  max: number;
  /** Operations per second over the wall time of the whole measurement. */
  opsPerSecond: number;
  /** CPU each process spent per call over the measurement (ms; clock ticks, so 10 ms / calls is its resolution). */
  cpuMsPerCall?: Record<string, number>;
}

/** Nearest-rank percentile of sorted values. */
function percentile(sorted: number[], p: number): number {
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] ?? NaN;
}

const round = (x: number, digits = 2) => Number(x.toFixed(digits));

export function summarize(latenciesMs: number[], wallMs: number): LatencySummary {
  const sorted = [...latenciesMs].sort((a, b) => a - b);
  return {
    count: sorted.length,
    p50: round(percentile(sorted, 50)),
    p95: round(percentile(sorted, 95)),
    p99: round(percentile(sorted, 99)),
    max: round(sorted.at(-1) ?? NaN),
    opsPerSecond: round(sorted.length / (wallMs / 1000), 1),
  };
}

/**
 * Runs `clients` concurrent loops of `perClient` calls each (bounded by count and by `deadlineMs`); `call` returns
 * the latency it measured. Returns the latencies and the wall time of the whole run.
 */
export async function concurrently(
  clients: number,
  perClient: number,
  call: (client: number, iteration: number) => Promise<number>,
  deadlineMs = 300_000,
): Promise<{ latencies: number[]; wallMs: number }> {
  const latencies: number[] = [];
  const stopAt = Date.now() + deadlineMs;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      for (let i = 0; i < perClient && Date.now() < stopAt; i++) latencies.push(await call(client, i));
    }),
  );
  return { latencies, wallMs: performance.now() - started };
}
