import { createHash } from 'node:crypto';
import type { RedisClient } from '../redis.ts';

/** Who signed in to the console: the admin key (the operator) or one tenant's API key, by its id (never its secret). */
export type ConsoleSigner = { kind: 'admin' } | { kind: 'key'; keyId: string; tenantId: string };

export interface ConsoleSessionDoc {
  signer: ConsoleSigner;
  /** Sent back by the page on every state-changing request (header `x-csrf-token`). */
  csrfToken: string;
  createdAt: string;
  expiresAt: string;
}

/**
 * Console sessions in Redis, one key per session with the session's lifetime as its TTL, so an expired session is
 * simply gone. The key is a SHA-256 of the cookie value: whoever reads Redis cannot present a session from it.
 */
export class ConsoleSessionStore {
  constructor(
    private readonly redis: RedisClient,
    private readonly prefix: string,
  ) {}

  private key(sessionToken: string): string {
    return `${this.prefix}:console:session:${createHash('sha256').update(sessionToken).digest('hex')}`;
  }

  async put(sessionToken: string, doc: ConsoleSessionDoc, ttlSeconds: number): Promise<void> {
    await this.redis.set(this.key(sessionToken), JSON.stringify(doc), 'EX', ttlSeconds);
  }

  async get(sessionToken: string): Promise<ConsoleSessionDoc | null> {
    const raw = await this.redis.get(this.key(sessionToken));
    return raw ? (JSON.parse(raw) as ConsoleSessionDoc) : null;
  }

  async delete(sessionToken: string): Promise<void> {
    await this.redis.del(this.key(sessionToken));
  }
}
