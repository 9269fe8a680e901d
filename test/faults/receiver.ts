import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';

/** A loopback webhook receiver that verifies every delivery and counts each event id (duplicates are allowed). */
export class CountingReceiver {
  readonly seen = new Map<string, number>();
  readonly types = new Map<string, string>();
  badSignatures = 0;
  secret = '';
  private server: Server | null = null;
  url = '';

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        const id = String(req.headers['webhook-id']);
        try {
          new Webhook(this.secret).verify(body, {
            'webhook-id': id,
            'webhook-timestamp': String(req.headers['webhook-timestamp']),
            'webhook-signature': String(req.headers['webhook-signature']),
          });
        } catch {
          this.badSignatures++;
        }
        this.seen.set(id, (this.seen.get(id) ?? 0) + 1);
        this.types.set(id, (JSON.parse(body) as { type: string }).type);
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/hook`;
  }

  count(type: string): number {
    return [...this.types.values()].filter(
      (t) => t === type || (type === 'settlement.*' && t.startsWith('settlement.')),
    ).length;
  }

  get duplicates(): number {
    return [...this.seen.values()].reduce((sum, n) => sum + n - 1, 0);
  }

  async close(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
