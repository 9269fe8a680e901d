// The FerretDB and Redis a bench measures against: the shared ones scripts/services.sh runs, or (--own-backend) a
// pair of the bench's own, started with the same binaries and flags on free ports and temporary directories, and
// stopped and deleted at the end, so that the backend's CPU is the bench's alone.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pidOfServer } from './growth/processes.ts';
import { freePort, MONGO_BASE, REDIS_URL, ROOT } from './production-service.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The FerretDB and Redis both targets use, and their pids (null: not found, their CPU is left out). */
export interface Backend {
  mongoBase: string;
  redisUrl: string;
  ferretdbPid: number | null;
  redisPid: number | null;
}

export const sharedBackend = (): Backend => ({
  mongoBase: MONGO_BASE,
  redisUrl: REDIS_URL,
  ferretdbPid: pidOfServer(27027, [join(ROOT, '.data/ferretdb.pid')]),
  redisPid: pidOfServer(6390, [join(ROOT, '.data/redis.pid')]),
});

/** Servers this bench started (--own-backend), and the directory that holds their data and logs. */
const ownServers: ChildProcess[] = [];
let ownBackendDir: string | null = null;

async function waitForPort(port: number, what: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const open = await new Promise<boolean>((resolveOpen) => {
      const socket = connect(port, '127.0.0.1', () => socket.end(() => resolveOpen(true)));
      socket.once('error', () => resolveOpen(false));
    });
    if (open) return;
    await sleep(100);
  }
  throw new Error(`${what} did not listen on 127.0.0.1:${port} within ${timeoutMs} ms; see ${ownBackendDir}`);
}

/** `command args` with its output in `<dir>/<name>.log`, stopped with the bench. */
function startServer(name: string, command: string, args: string[]): number {
  const fd = openSync(join(ownBackendDir!, `${name}.log`), 'a');
  const proc = spawn(command, args, { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  if (proc.pid === undefined) throw new Error(`${name} did not start`);
  ownServers.push(proc);
  return proc.pid;
}

/** A FerretDB (SQLite) and a Redis of the bench's own, started as scripts/services.sh starts the shared ones. */
export async function startOwnBackend(log: (line: string) => void): Promise<Backend> {
  process.once('exit', () => ownServers.forEach((proc) => proc.kill('SIGKILL')));
  ownBackendDir = mkdtempSync(join(tmpdir(), 'bench-money-backend-'));
  mkdirSync(join(ownBackendDir, 'ferretdb'));
  mkdirSync(join(ownBackendDir, 'ferretdb-state'));
  mkdirSync(join(ownBackendDir, 'redis'));
  const [mongoPort, redisPort] = [await freePort(), await freePort()];
  const ferretdbPid = startServer('ferretdb', join(ROOT, '.tools/bin/ferretdb'), [
    '--handler=sqlite',
    `--sqlite-url=file:${ownBackendDir}/ferretdb/?_pragma=synchronous(normal)`,
    `--state-dir=${ownBackendDir}/ferretdb-state`,
    `--listen-addr=127.0.0.1:${mongoPort}`,
    '--debug-addr=127.0.0.1:0',
    '--telemetry=disable',
    '--log-level=warn',
  ]);
  const redisPid = startServer('redis', 'redis-server', [
    '--bind',
    '127.0.0.1',
    '--port',
    String(redisPort),
    '--dir',
    join(ownBackendDir, 'redis'),
    '--appendonly',
    'yes',
    '--appendfsync',
    'everysec',
    '--maxmemory-policy',
    'noeviction',
    '--save',
    '',
  ]);
  await waitForPort(mongoPort, 'FerretDB');
  await waitForPort(redisPort, 'Redis');
  log(
    `own backend: FerretDB on 127.0.0.1:${mongoPort} (pid ${ferretdbPid}), Redis on 127.0.0.1:${redisPort} (pid ${redisPid}), in ${ownBackendDir}`,
  );
  return {
    mongoBase: `mongodb://127.0.0.1:${mongoPort}`,
    redisUrl: `redis://127.0.0.1:${redisPort}`,
    ferretdbPid,
    redisPid,
  };
}

/** Stops the bench's own servers (SIGTERM, then SIGKILL after 10 s) and deletes their directory. */
export async function stopOwnBackend(): Promise<void> {
  for (const proc of ownServers.splice(0)) {
    if (proc.exitCode !== null || proc.signalCode !== null) continue;
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
  if (ownBackendDir) rmSync(ownBackendDir, { recursive: true, force: true });
  ownBackendDir = null;
}
