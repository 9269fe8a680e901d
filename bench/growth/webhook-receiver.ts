// A loopback webhook receiver: records when each (event type, run) first arrives and lets the benchmark wait for it.
import http from 'node:http';

export class WebhookReceiver {
  private readonly arrivals = new Map<string, number>();
  private readonly waiters = new Map<string, (at: number) => void>();
  private server: http.Server | null = null;
  received = 0;

  async start(): Promise<number> {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const at = performance.now();
        res.writeHead(204).end();
        try {
          const event = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
            type?: string;
            data?: { runId?: string };
          };
          if (event.type && event.data?.runId) this.record(`${event.type}:${event.data.runId}`, at);
        } catch {
          // not an event; nothing to record
        }
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    return (this.server.address() as { port: number }).port;
  }

  private record(key: string, at: number): void {
    this.received++;
    if (this.arrivals.has(key)) return; // a retried delivery: the first arrival counts
    this.arrivals.set(key, at);
    this.waiters.get(key)?.(at);
    this.waiters.delete(key);
  }

  /** performance.now() of the first delivery of `type` for `runId`; rejects after `timeoutMs`. */
  waitFor(type: string, runId: string, timeoutMs = 60_000): Promise<number> {
    const key = `${type}:${runId}`;
    const seen = this.arrivals.get(key);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(key);
        reject(new Error(`no ${type} webhook for ${runId} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.set(key, (at) => {
        clearTimeout(timer);
        resolve(at);
      });
    });
  }

  async close(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
