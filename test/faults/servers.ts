// Private servers for the fault tests, on loopback ports of their own, so stopping, freezing or killing them never
// disturbs another test: a redis-server (single or a cluster node), a FerretDB on its own SQLite directory, and a
// six-node Redis Cluster. Every process is killed on `down()` and, as a last resort, when the test process exits.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { MongoClient } from 'mongodb';
import { freePort, waitForPort } from '../helpers/redis-instance.ts';

export { freePort, waitForPort };

const root = fileURLToPath(new URL('../..', import.meta.url));
const run = promisify(execFile);

/** Every child a fault test starts, killed when the test process exits however it exits. */
const children = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});
export function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

export async function killAndWait(child: ChildProcess, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill(signal);
  await exited;
}

/** Whether a loopback port accepts a connection now. */
function portAccepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/**
 * How long a started server may take to answer. Generous: the machine's few CPUs are shared with other test runs,
 * and a server that is merely slow must not fail the test; one that crashes is reported at once.
 */
const READY_WITHIN_MS = 90_000;

/** A server process on a fixed loopback port that can be stopped (SIGKILL), frozen (SIGSTOP) and started again. */
abstract class ServerProcess {
  protected child: ChildProcess | null = null;
  readonly dir = mkdtempSync(join(tmpdir(), 'fault-server-'));
  output = '';

  constructor(readonly port: number) {}

  protected abstract command(): [string, string[]];

  /** Whether the started server serves requests; by default, that its port accepts connections. */
  protected answers(): Promise<boolean> {
    return portAccepts(this.port);
  }

  /** Starts the server and waits until it answers (`answers`), failing early if it exits. */
  async up(): Promise<void> {
    if (this.child) return;
    const [bin, args] = this.command();
    const child = track(spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] }));
    child.stdout!.on('data', (d) => (this.output = (this.output + d).slice(-20_000)));
    child.stderr!.on('data', (d) => (this.output = (this.output + d).slice(-20_000)));
    this.child = child;
    const deadline = Date.now() + READY_WITHIN_MS;
    while (!(await this.answers())) {
      if (child.exitCode !== null || child.signalCode !== null)
        throw new Error(`${bin} on port ${this.port} exited before it answered: ${this.output.slice(-2_000)}`);
      if (Date.now() > deadline)
        throw new Error(
          `${bin} on port ${this.port} did not answer within ${READY_WITHIN_MS} ms: ${this.output.slice(-2_000)}`,
        );
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Gone at once, as a crash or a lost host: SIGKILL, and the port closed. */
  async down(): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.child = null;
    await killAndWait(child);
    await waitForPort(this.port, false, 10_000);
  }

  /** Hung: the port still accepts connections but nothing answers (a stalled host or a partition). */
  freeze(): void {
    this.child?.kill('SIGSTOP');
  }

  thaw(): void {
    this.child?.kill('SIGCONT');
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  async destroy(): Promise<void> {
    this.thaw();
    await this.down().catch(() => undefined);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export class RedisServer extends ServerProcess {
  constructor(
    port: number,
    private readonly extraArgs: string[] = [],
  ) {
    super(port);
  }

  static async start(extraArgs: string[] = []): Promise<RedisServer> {
    const server = new RedisServer(await freePort(), extraArgs);
    await server.up();
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  protected command(): [string, string[]] {
    return [
      'redis-server',
      [
        '--port',
        String(this.port),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        this.dir,
        '--maxmemory-policy',
        'noeviction',
        ...this.extraArgs,
      ],
    ];
  }
}

export const FERRETDB_BIN = join(root, '.tools/bin/ferretdb');

/** A FerretDB of the test's own (flags as scripts/services.sh), its SQLite files in a fresh directory. */
export class FerretDbServer extends ServerProcess {
  static async start(): Promise<FerretDbServer> {
    if (!existsSync(FERRETDB_BIN)) throw new Error(`${FERRETDB_BIN} is missing: run scripts/install-ferretdb.sh`);
    const server = new FerretDbServer(await freePort());
    await server.up();
    return server;
  }

  url(db: string): string {
    return `mongodb://127.0.0.1:${this.port}/${db}`;
  }

  protected command(): [string, string[]] {
    return [
      FERRETDB_BIN,
      [
        '--handler=sqlite',
        `--sqlite-url=file:${this.dir}/data/?_pragma=synchronous(normal)`,
        `--state-dir=${this.dir}/state`,
        `--listen-addr=127.0.0.1:${this.port}`,
        '--debug-addr=127.0.0.1:0',
        '--telemetry=disable',
        '--log-level=warn',
      ],
    ];
  }

  override async up(): Promise<void> {
    await run('mkdir', ['-p', `${this.dir}/data`, `${this.dir}/state`]);
    await super.up();
  }

  /** Ready when it answers a ping: a port that accepts connections is not yet a server that answers commands. */
  protected override async answers(): Promise<boolean> {
    if (!(await portAccepts(this.port))) return false;
    const client = new MongoClient(this.url('admin'), {
      directConnection: true,
      serverSelectionTimeoutMS: 2_000,
      connectTimeoutMS: 2_000,
    });
    try {
      await client.db('admin').command({ ping: 1 });
      return true;
    } catch {
      return false;
    } finally {
      await client.close().catch(() => undefined);
    }
  }
}

/** Three masters and three replicas on loopback, built with `redis-cli --cluster create`. */
export class RedisCluster {
  private constructor(readonly nodes: RedisServer[]) {}

  static async start(): Promise<RedisCluster> {
    const nodes: RedisServer[] = [];
    try {
      for (let i = 0; i < 6; i++) {
        // cluster-node-timeout is what failover waits for (1 s keeps the test short); no delay before a replica's
        // first sync, which a replica needs before it may take over.
        const node = new RedisServer(await freePort(), [
          '--cluster-enabled',
          'yes',
          '--cluster-node-timeout',
          '1000',
          '--cluster-config-file',
          'nodes.conf',
          '--repl-diskless-sync-delay',
          '0',
        ]);
        nodes.push(node);
        await node.up();
      }
      await run(
        'redis-cli',
        ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '1', '--cluster-yes'],
        { timeout: 30_000 },
      );
      const cluster = new RedisCluster(nodes);
      await cluster.waitHealthy(20_000);
      return cluster;
    } catch (err) {
      for (const node of nodes) await node.destroy();
      throw err;
    }
  }

  /** The service's REDIS_URL for this cluster (seed nodes; the client discovers the rest). */
  get url(): string {
    return `redis+cluster://${this.nodes
      .slice(0, 3)
      .map((n) => `127.0.0.1:${n.port}`)
      .join(',')}`;
  }

  async cli(port: number, ...args: string[]): Promise<string> {
    const { stdout } = await run('redis-cli', ['-p', String(port), ...args], { timeout: 5_000 });
    return stdout;
  }

  /** Nodes currently serving as masters (alive ones only). */
  async masters(): Promise<RedisServer[]> {
    const alive = this.nodes.filter((n) => n.pid !== undefined);
    const text = await this.cli(alive[0]!.port, 'cluster', 'nodes');
    const masterPorts = text
      .split('\n')
      .filter((l) => / master /.test(l.replace(/myself,/, '')) && !/fail/.test(l))
      .map((l) => Number(l.split(' ')[1]!.split(':')[1]!.split('@')[0]));
    return alive.filter((n) => masterPorts.includes(n.port));
  }

  async waitHealthy(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const alive = this.nodes.filter((n) => n.pid !== undefined);
      // Healthy: every node sees the cluster ok, and every replica has synced with its master (a replica that never
      // did cannot be promoted, and killing its master then leaves the cluster down).
      const states = await Promise.all(
        alive.map(async (n) => {
          const info = await this.cli(n.port, 'cluster', 'info').catch(() => '');
          const replication = await this.cli(n.port, 'info', 'replication').catch(() => '');
          return (
            /cluster_state:ok/.test(info) &&
            (!/role:slave/.test(replication) || /master_link_status:up/.test(replication))
          );
        }),
      );
      if (states.every(Boolean)) return;
      if (Date.now() > deadline) throw new Error('the cluster did not become healthy');
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  async destroy(): Promise<void> {
    for (const node of this.nodes) await node.destroy();
  }
}

/** `redis-cli -p <port> <args>` on loopback, bounded in time. */
export async function redisCli(port: number, ...args: string[]): Promise<string> {
  const { stdout } = await run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args], { timeout: 5_000 });
  return stdout;
}

/** `INFO replication` of a Redis as field -> value; empty when it does not answer. */
export async function replicationInfo(port: number): Promise<Record<string, string>> {
  const text = await redisCli(port, 'info', 'replication').catch(() => '');
  return Object.fromEntries(
    text
      .split(/\r?\n/)
      .filter((l) => l.includes(':'))
      .map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1).trim()]),
  );
}

async function pollUntil(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * A primary and its replica (`replicaof`), failed over by hand as an operator does it without Sentinel: the primary
 * dies, the replica is promoted (`REPLICAOF NO ONE`) and the clients are pointed at it. Replication is asynchronous,
 * so a replica that lagged is promoted without the primary's last writes. To make it lag for certain, `freezeReplica`
 * SIGSTOPs it and waits until the primary drops it for not acknowledging (`repl-timeout` 3 s): what the primary writes
 * after that never reaches the replica. (Freezing alone is not enough: what the primary wrote while the replica was
 * frozen sits in the kernel's socket buffers and is applied when it thaws.)
 */
export class RedisReplicaPair {
  private constructor(
    readonly primary: RedisServer,
    readonly replica: RedisServer,
  ) {}

  static async start(): Promise<RedisReplicaPair> {
    // No delay before a replica's first sync (the default waits 5 s for more replicas).
    const primary = new RedisServer(await freePort(), ['--repl-timeout', '3', '--repl-diskless-sync-delay', '0']);
    await primary.up();
    const replica = new RedisServer(await freePort(), ['--replicaof', '127.0.0.1', String(primary.port)]);
    try {
      await replica.up();
      await pollUntil(
        async () => (await replicationInfo(replica.port)).master_link_status === 'up',
        30_000,
        "the replica's first sync",
      );
    } catch (err) {
      await replica.destroy();
      await primary.destroy();
      throw err;
    }
    return new RedisReplicaPair(primary, replica);
  }

  /** Waits until the replica has applied everything the primary had written when this was called. */
  async waitCaughtUp(timeoutMs = 30_000): Promise<{ offset: number }> {
    const target = Number((await replicationInfo(this.primary.port)).master_repl_offset);
    await pollUntil(
      async () => {
        const info = await replicationInfo(this.replica.port);
        return info.master_link_status === 'up' && Number(info.slave_repl_offset) >= target;
      },
      timeoutMs,
      `the replica caught up with offset ${target}`,
    );
    return { offset: target };
  }

  /** SIGSTOPs the replica, then waits until the primary has dropped it: from then on it lags for good. */
  async freezeReplica(timeoutMs = 30_000): Promise<void> {
    this.replica.freeze();
    await pollUntil(
      async () => (await replicationInfo(this.primary.port)).connected_slaves === '0',
      timeoutMs,
      'the primary dropping its frozen replica',
    );
  }

  /**
   * The primary SIGKILLed, the replica thawed and promoted. Answers the primary's last offset and the replica's (what
   * it holds of the primary's writes): the difference is what the failover lost.
   */
  async failover(timeoutMs = 30_000): Promise<{ primaryOffset: number; replicaOffset: number }> {
    const primaryOffset = Number((await replicationInfo(this.primary.port)).master_repl_offset);
    await this.primary.down();
    this.replica.thaw();
    // Thawed, it applies what its socket still held, then sees its primary gone.
    await pollUntil(
      async () => (await replicationInfo(this.replica.port)).master_link_status === 'down',
      timeoutMs,
      'the thawed replica seeing its primary gone',
    );
    const replicaOffset = Number((await replicationInfo(this.replica.port)).master_repl_offset);
    await redisCli(this.replica.port, 'replicaof', 'no', 'one');
    await pollUntil(
      async () => (await replicationInfo(this.replica.port)).role === 'master',
      timeoutMs,
      'the replica promoted',
    );
    return { primaryOffset, replicaOffset };
  }

  async destroy(): Promise<void> {
    await this.replica.destroy();
    await this.primary.destroy();
  }
}
