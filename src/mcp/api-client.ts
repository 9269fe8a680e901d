// A small fetch client for the service's HTTP API, as the MCP tools use it: bearer key, JSON bodies, optional
// Idempotency-Key, and every failure turned into one ApiError carrying the contract's error fields.

const DEFAULT_TIMEOUT_MS = 30_000;

export class ApiError extends Error {
  constructor(
    /** HTTP status; null when no answer came back. */
    readonly status: number | null,
    readonly code: string,
    message: string,
    readonly details?: Record<string, unknown>,
    readonly requestId?: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

export interface ApiResponse {
  status: number;
  body: Record<string, unknown>;
}

export interface RequestOptions {
  body?: unknown;
  idempotencyKey?: string | undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The fetch the client sends with; the service's own /mcp passes one that answers in process. */
export type FetchLike = (url: URL, init: RequestInit) => Promise<Response>;

export class ApiClient {
  private readonly base: URL;

  constructor(
    baseUrl: string,
    private readonly apiKey: string,
    private readonly timeoutMs = DEFAULT_TIMEOUT_MS,
    private readonly fetchImpl: FetchLike = fetch,
  ) {
    // A trailing slash makes relative paths resolve under a base path (https://host/settlement/ + v1/runs).
    this.base = new URL(baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`);
  }

  /** Any answer with a JSON object body, whatever its status; throws only when there is no usable answer. */
  async send(method: 'GET' | 'POST', path: string, options: RequestOptions = {}): Promise<ApiResponse> {
    const url = new URL(path.replace(/^\//, ''), this.base);
    const headers: Record<string, string> = { accept: 'application/json', authorization: `Bearer ${this.apiKey}` };
    if (options.body !== undefined) headers['content-type'] = 'application/json';
    if (options.idempotencyKey !== undefined) headers['idempotency-key'] = options.idempotencyKey;
    let res: Response;
    let text: string;
    try {
      res = await this.fetchImpl(url, {
        method,
        headers,
        body: options.body === undefined ? null : JSON.stringify(options.body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      text = await res.text();
    } catch (err) {
      throw new ApiError(
        null,
        'SERVICE_UNREACHABLE',
        `cannot reach the service at ${this.base.origin}: ${networkReason(err, this.timeoutMs)}`,
      );
    }
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (!isObject(body)) {
      throw new ApiError(
        res.status,
        'UNEXPECTED_RESPONSE',
        `${method} /${url.pathname.replace(/^\//, '')} answered HTTP ${res.status} without a JSON object`,
      );
    }
    return { status: res.status, body };
  }

  /** The body of a 2xx answer; any other status becomes an ApiError with the service's code and message. */
  async call(method: 'GET' | 'POST', path: string, options: RequestOptions = {}): Promise<ApiResponse> {
    const res = await this.send(method, path, options);
    if (res.status >= 200 && res.status < 300) return res;
    const { code, message, details, requestId } = res.body;
    throw new ApiError(
      res.status,
      typeof code === 'string' ? code : `HTTP_${res.status}`,
      typeof message === 'string' ? message : `the service answered HTTP ${res.status}`,
      isObject(details) ? details : undefined,
      typeof requestId === 'string' ? requestId : undefined,
    );
  }
}

/** Why fetch failed, in words that name no header or credential. */
function networkReason(err: unknown, timeoutMs: number): string {
  if (err instanceof DOMException && err.name === 'TimeoutError') return `no answer within ${timeoutMs / 1000} s`;
  const cause = (err as { cause?: { code?: unknown } } | null)?.cause;
  if (typeof cause?.code === 'string') return cause.code;
  return err instanceof Error ? err.message : 'network error';
}
