// The agents' Ed25519 private keys, kept on the machine that runs the MCP server: one JSON file per tenant holding
// the signing key of each agent, readable by its owner only (file 0600, a directory we create 0700). The service
// never sees a private key; the tools never return one.
import { randomBytes, type KeyObject } from 'node:crypto';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parsePrivateKey, privateKeyToPem, publicKeyOf } from '../domain/crypto.ts';

const FORMAT_VERSION = 1;

export type KeyFileErrorCode =
  'KEY_FILE_INVALID' | 'KEY_FILE_INSECURE' | 'KEY_FILE_UNAVAILABLE' | 'KEY_FILE_NOT_SUPPORTED' | 'AGENT_KEY_NOT_FOUND';

/** Messages name the path and the problem, never the file's content. */
export class KeyFileError extends Error {
  constructor(
    readonly code: KeyFileErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'KeyFileError';
  }
}

interface StoredAgentKey {
  keyId: string;
  /** PKCS#8 PEM. */
  privateKey: string;
  createdAt: string;
}

interface KeyFileContents {
  version: typeof FORMAT_VERSION;
  tenantId: string;
  agents: Record<string, StoredAgentKey>;
}

export interface AgentSigningKey {
  keyId: string;
  privateKey: KeyObject;
}

/** Where the tools keep and find agents' signing keys: a local key file, or the service's sealed store (/mcp). */
export interface AgentKeyStore {
  /** Where the keys are, as the tools report it (a path, or a description); never a key. */
  readonly location: string;
  /** Fails before an agent is registered if its key could not be stored afterwards. */
  ensureUsable(): Promise<void>;
  save(agentId: string, privateKey: KeyObject, keyId: string): Promise<void>;
  load(agentId: string): Promise<AgentSigningKey>;
}

export function defaultKeyFilePath(tenantId: string, home: string = homedir()): string {
  return join(home, '.agent-settlement', 'keys', `${tenantId}.json`);
}

function fsReason(err: unknown): string {
  return (err as NodeJS.ErrnoException).code ?? 'I/O error';
}

function isStoredKey(value: unknown): value is StoredAgentKey {
  const v = value as Partial<StoredAgentKey> | null;
  return typeof v?.keyId === 'string' && typeof v.privateKey === 'string' && typeof v.createdAt === 'string';
}

export class KeyFile implements AgentKeyStore {
  readonly path: string;
  // Writes of this process are serialized so two registrations cannot drop each other's key.
  private writing: Promise<unknown> = Promise.resolve();

  constructor(
    path: string,
    private readonly tenantId: string,
  ) {
    this.path = resolve(path);
  }

  get location(): string {
    return this.path;
  }

  /** The file's keys; a missing file is an empty one. Refuses a file others can read, as ssh does. */
  private async read(): Promise<KeyFileContents> {
    let text: string;
    try {
      const info = await stat(this.path);
      if (process.platform !== 'win32' && (info.mode & 0o077) !== 0) {
        throw new KeyFileError(
          'KEY_FILE_INSECURE',
          `key file ${this.path} is accessible by other users; run chmod 600 on it`,
        );
      }
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      if (err instanceof KeyFileError) throw err;
      if ((err as NodeJS.ErrnoException).code === 'ENOENT')
        return { version: FORMAT_VERSION, tenantId: this.tenantId, agents: {} };
      throw new KeyFileError('KEY_FILE_UNAVAILABLE', `cannot read key file ${this.path}: ${fsReason(err)}`);
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      // JSON.parse messages quote the text, which holds private keys.
      throw new KeyFileError('KEY_FILE_INVALID', `key file ${this.path} is not valid JSON`);
    }
    const contents = parsed as Partial<KeyFileContents> | null;
    if (contents?.version !== FORMAT_VERSION || typeof contents.agents !== 'object' || contents.agents === null) {
      throw new KeyFileError(
        'KEY_FILE_INVALID',
        `key file ${this.path} is not a version ${FORMAT_VERSION} agent key file`,
      );
    }
    if (contents.tenantId !== this.tenantId) {
      throw new KeyFileError(
        'KEY_FILE_INVALID',
        `key file ${this.path} belongs to tenant ${String(contents.tenantId)}, not ${this.tenantId}`,
      );
    }
    return contents as KeyFileContents;
  }

  /**
   * Fails now, before anything is registered, if the key of a new agent could not be stored afterwards: the file is
   * unreadable, invalid or insecure, or its directory cannot be created.
   */
  async ensureUsable(): Promise<void> {
    await this.read();
    try {
      await mkdir(dirname(this.path), { recursive: true, mode: 0o700 });
    } catch (err) {
      throw new KeyFileError(
        'KEY_FILE_UNAVAILABLE',
        `cannot create the directory of key file ${this.path}: ${fsReason(err)}`,
      );
    }
  }

  /** Stores (or replaces) the signing key of an agent: written to a private temp file, then renamed over the file. */
  async save(agentId: string, privateKey: KeyObject, keyId: string): Promise<void> {
    const write = async () => {
      const contents = await this.read();
      contents.agents[agentId] = {
        keyId,
        privateKey: privateKeyToPem(privateKey),
        createdAt: new Date().toISOString(),
      };
      await mkdir(dirname(this.path), { recursive: true, mode: 0o700 });
      const temp = `${this.path}.${randomBytes(6).toString('hex')}.tmp`;
      try {
        await writeFile(temp, `${JSON.stringify(contents, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
        await rename(temp, this.path);
      } catch (err) {
        await rm(temp, { force: true });
        throw new KeyFileError('KEY_FILE_UNAVAILABLE', `cannot write key file ${this.path}: ${fsReason(err)}`);
      }
    };
    const done = this.writing.then(write, write);
    this.writing = done.catch(() => undefined);
    return done;
  }

  /** The agent's signing key, checked against its recorded keyId. */
  async load(agentId: string): Promise<AgentSigningKey> {
    const { agents } = await this.read();
    const stored = Object.hasOwn(agents, agentId) ? agents[agentId] : undefined;
    if (!isStoredKey(stored)) {
      throw new KeyFileError(
        'AGENT_KEY_NOT_FOUND',
        `no private key for agent ${agentId} in key file ${this.path}; register the agent with register_agent first`,
      );
    }
    let privateKey: KeyObject;
    try {
      privateKey = parsePrivateKey(stored.privateKey);
    } catch {
      throw new KeyFileError(
        'KEY_FILE_INVALID',
        `the key of agent ${agentId} in ${this.path} is not an Ed25519 private key`,
      );
    }
    if (publicKeyOf(privateKey).keyId !== stored.keyId) {
      throw new KeyFileError(
        'KEY_FILE_INVALID',
        `the key of agent ${agentId} in ${this.path} does not match its keyId ${stored.keyId}`,
      );
    }
    return { keyId: stored.keyId, privateKey };
  }
}
