// Child processes of the benchmark, and what /proc says about any process: CPU ticks and memory.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';

export interface Child {
  name: string;
  pid: number;
  proc: ChildProcess;
  logFile: string;
  exited: Promise<number | null>;
}

/** Every child still running, so an exit path (success, failure, SIGINT) can stop them all. */
const running = new Set<Child>();

export const CLOCK_TICKS_PER_SECOND = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;

/** Starts `node <args>` with its output in `logFile` (a child writing to a pipe nobody reads would block). */
export function startChild(name: string, args: string[], env: NodeJS.ProcessEnv, logFile: string, cwd: string): Child {
  const fd = openSync(logFile, 'a');
  const proc = spawn(process.execPath, args, { cwd, env, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  if (proc.pid === undefined) throw new Error(`${name} did not start`);
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  const child: Child = { name, pid: proc.pid, proc, logFile, exited };
  running.add(child);
  void exited.then(() => running.delete(child));
  return child;
}

/** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
export async function stopChild(child: Child, graceMs = 20_000): Promise<void> {
  if (!running.has(child)) return;
  child.proc.kill('SIGTERM');
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), graceMs);
  await child.exited;
  clearTimeout(timer);
}

/** Synchronous last resort for exit handlers. */
export function killAllChildren(): void {
  for (const child of running) child.proc.kill('SIGKILL');
}

export function runningChildren(): Child[] {
  return [...running];
}

/** Polls `url` until it answers 200, the child dies, or `timeoutMs` passes. */
export async function waitHealthy(child: Child, url: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!running.has(child)) throw new Error(`${child.name} exited while starting; see ${child.logFile}`);
    try {
      if ((await fetch(url)).status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${child.name} did not answer ${url} within ${timeoutMs} ms; see ${child.logFile}`);
}

/** utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/<pid>/stat). */
export function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) may contain spaces; the fields after it start after the last ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]);
}

/** VmRSS and VmHWM (peak RSS) of a process, in MiB. */
export function memoryMiB(pid: number): { rss: number; hwm: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rss: kib('VmRSS') / 1024, hwm: kib('VmHWM') / 1024 };
}

/** The pid listening on a loopback TCP port, from a pid file when it names a live process, else from `ss`. */
export function pidOfServer(port: number, pidFiles: string[]): number | null {
  for (const file of pidFiles) {
    if (!existsSync(file)) continue;
    const pid = Number(readFileSync(file, 'utf8').trim());
    if (pid > 0 && existsSync(`/proc/${pid}/stat`)) return pid;
  }
  try {
    const out = execFileSync('ss', ['-Hltnp', `sport = :${port}`]).toString();
    const pid = Number(/pid=(\d+)/.exec(out)?.[1]);
    return pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/** Samples the peak VmRSS of some processes while `work` runs (every `everyMs`). */
export async function withPeakRss<T>(
  pids: Record<string, number>,
  work: () => Promise<T>,
  everyMs = 100,
  label?: () => string,
): Promise<{ result: T; peakMiB: Record<string, number>; byLabel: Record<string, number> }> {
  const peakMiB: Record<string, number> = Object.fromEntries(Object.keys(pids).map((k) => [k, 0]));
  /** The first process's peak per label (what `label` names when the sample is taken), to find what peaks. */
  const byLabel: Record<string, number> = {};
  const sample = () => {
    for (const [i, [name, pid]] of Object.entries(pids).entries()) {
      try {
        const rss = memoryMiB(pid).rss;
        peakMiB[name] = Math.max(peakMiB[name]!, rss);
        if (i === 0 && label) byLabel[label()] = Math.max(byLabel[label()] ?? 0, rss);
      } catch {
        // the process is gone; its peak so far stands
      }
    }
  };
  sample();
  const timer = setInterval(sample, everyMs);
  try {
    const result = await work();
    sample();
    return { result, peakMiB, byLabel };
  } finally {
    clearInterval(timer);
  }
}

/** Busy and total jiffies of the whole machine (first line of /proc/stat): how much else was running. */
export function machineJiffies(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((a, b) => a + b, 0);
  const idle = (fields[3] ?? 0) + (fields[4] ?? 0); // idle + iowait
  return { busy: total - idle, total };
}

/** Percent of all cores busy between two readings of machineJiffies. */
export function machineBusyPercent(
  before: { busy: number; total: number },
  after: { busy: number; total: number },
): number {
  return Number((((after.busy - before.busy) / Math.max(1, after.total - before.total)) * 100).toFixed(1));
}
