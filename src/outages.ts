import {
  MongoBulkWriteError,
  MongoNetworkError,
  MongoNotConnectedError,
  MongoServerSelectionError,
  MongoTopologyClosedError,
} from 'mongodb';
import type { EventEmitter } from 'node:events';
import type { Logger } from 'pino';

/** The services this process cannot work without. */
export type Dependency = 'redis' | 'mongodb';

const REDIS_CONNECTION_ERROR =
  /enableOfflineQueue|Connection is closed|Command timed out|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EPIPE|Stream isn't writeable|Reached the max retries|connect ETIMEDOUT|Socket closed unexpectedly/;

/** Node's message for a write to a socket whose peer has ended it. */
const SOCKET_ENDED_BY_PEER = 'This socket has been ended by the other party';

/**
 * Which dependency a connection failure comes from, or null for any other error (then it is not an outage: a bug,
 * a refused write, a duplicate key). The mongodb driver's network errors include timeouts and a cleared pool.
 */
export function unreachableDependency(err: unknown): Dependency | null {
  // An insertMany (every group-committed claim) hands a driver error back inside a MongoBulkWriteError, the
  // original as its errorResponse: a server stopped mid-insert is an outage all the same, never a 500.
  const wrapped = err instanceof MongoBulkWriteError ? (err.errorResponse as unknown) : null;
  if (wrapped instanceof Error) return unreachableDependency(wrapped);
  // A command written to a connection its server has just closed fails in Node's socket, unwrapped by the driver.
  // ioredis checks that its stream is writable before writing, so only the mongodb driver meets this one.
  if (err instanceof Error && (err as NodeJS.ErrnoException).code === 'EPIPE' && err.message === SOCKET_ENDED_BY_PEER)
    return 'mongodb';
  if (
    err instanceof MongoServerSelectionError ||
    err instanceof MongoNetworkError ||
    err instanceof MongoNotConnectedError ||
    err instanceof MongoTopologyClosedError
  ) {
    return 'mongodb';
  }
  if (!(err instanceof Error)) return null;
  if (err.name === 'MaxRetriesPerRequestError') return 'redis';
  return REDIS_CONNECTION_ERROR.test(err.message) ? 'redis' : null;
}

const STRAY_LINE_INTERVAL_MS = 10_000;

interface Outage {
  since: number;
  failures: number;
  /** The connections that lost the dependency and have not reached it again: the outage ends when none is left. */
  lostBy: Set<object>;
}

/**
 * One log line when a dependency goes away and one when it is back, with the failures counted in between, instead
 * of a line (often a stack trace) per reconnect attempt, failed command, failed job and 503 answer: during an
 * outage every client of the process fails many times a second, and an operator needs to read the log.
 *
 * Only the process's own connections (their `error` and `ready` events, the driver's topology) open and close an
 * outage; failures seen elsewhere (a job, a request, BullMQ's own connections) are counted into an open one and
 * otherwise logged sparingly, so a straggler after the recovery cannot reopen it.
 */
export class DependencyOutages {
  private readonly open = new Map<Dependency, Outage>();
  /** Per dependency and kind of line (a failed call, a stalled request), when the last stray line went out. */
  private readonly stray = new Map<string, { lastLineAt: number; unlogged: number }>();

  constructor(private readonly logger: Logger) {}

  isDown(dependency: Dependency): boolean {
    return this.open.has(dependency);
  }

  /** Counts a failure into `dependency`'s outage: true when one is open (the caller need not log), else false. */
  countIfDown(dependency: Dependency): boolean {
    const outage = this.open.get(dependency);
    if (outage) outage.failures++;
    return outage !== undefined;
  }

  /** `connection` (a client of this process) lost `dependency`: opens an outage (one line) or counts a failure. */
  lost(dependency: Dependency, connection: object, err?: unknown): void {
    const outage = this.open.get(dependency);
    if (outage) {
      outage.failures++;
      outage.lostBy.add(connection);
      return;
    }
    this.open.set(dependency, { since: Date.now(), failures: 1, lostBy: new Set([connection]) });
    this.logger.warn({ dependency, state: 'down', error: messageOf(err) }, `${dependency} unreachable`);
  }

  /**
   * `connection` reached `dependency` again: once every connection that lost it has, the outage ends (one line).
   * A process holds several clients that reconnect on their own schedules; the first one back is not the end.
   */
  reached(dependency: Dependency, connection: object): void {
    const outage = this.open.get(dependency);
    if (!outage) return;
    outage.lostBy.delete(connection);
    if (outage.lostBy.size > 0) return;
    this.open.delete(dependency);
    this.logger.warn(
      { dependency, state: 'up', failures: outage.failures, downMs: Date.now() - outage.since },
      `${dependency} reachable again`,
    );
  }

  /**
   * Counts `err` into the outage of its dependency when it is a connection failure: true when it was (the caller
   * writes no line of its own), false for any other error. Outside an outage (a hung server times commands out while
   * the connection stays up, a straggler after the recovery) it writes at most one line per dependency per
   * STRAY_LINE_INTERVAL_MS, saying how many it left out.
   */
  absorb(err: unknown): boolean {
    const dependency = unreachableDependency(err);
    if (!dependency) return false;
    const outage = this.open.get(dependency);
    if (outage) {
      outage.failures++;
      return true;
    }
    this.strayLine(`${dependency} call`, (failuresNotLogged) =>
      this.logger.warn({ dependency, error: messageOf(err), failuresNotLogged }, `${dependency} call failed`),
    );
    return true;
  }

  /**
   * A request the deadline answered 503 while `dependency` stalls (a hung server: its connections stay up, so no
   * outage opens): counted into an open outage, else at most one line per dependency per STRAY_LINE_INTERVAL_MS,
   * as for a stray failure. A stall holds every request in flight; a line each would bury the log.
   */
  answeredStalled(dependency: Dependency, deadlineMs: number): void {
    if (this.countIfDown(dependency)) return;
    this.strayLine(`${dependency} stall`, (answersNotLogged) =>
      this.logger.warn(
        { backend: dependency, deadlineMs, answersNotLogged },
        'request deadline passed while a backend stalls; answering 503',
      ),
    );
  }

  /** Writes `line` unless one of its kind went out within STRAY_LINE_INTERVAL_MS (then counts what it left out). */
  private strayLine(kind: string, line: (leftOut: number) => void): void {
    const stray = this.stray.get(kind) ?? { lastLineAt: 0, unlogged: 0 };
    this.stray.set(kind, stray);
    if (Date.now() - stray.lastLineAt < STRAY_LINE_INTERVAL_MS) {
      stray.unlogged++;
      return;
    }
    line(stray.unlogged);
    stray.lastLineAt = Date.now();
    stray.unlogged = 0;
  }
}

function messageOf(err: unknown): string | undefined {
  if (err === undefined) return undefined;
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

/**
 * Reports an ioredis client's connection to the process's outage log: lost when it starts reconnecting (a manual
 * disconnect does not reconnect) or fails to, reached when it is ready again. Every client needs an `error`
 * listener: without one ioredis prints "Unhandled error event" and a stack trace, not JSON, on every attempt.
 */
export function watchRedis(client: EventEmitter, outages: DependencyOutages): void {
  client.on('reconnecting', () => outages.lost('redis', client, 'connection lost; reconnecting'));
  client.on('error', (err: Error) => outages.lost('redis', client, err));
  client.on('ready', () => outages.reached('redis', client));
}
