import type { Logger } from 'pino';

/**
 * On SIGTERM or SIGINT, runs the shutdown steps in order (stop accepting, finish in-flight work, close connections)
 * and exits 0; a hard deadline exits 1 so a stuck step cannot keep a process alive for ever.
 */
export function exitGracefullyOnSignals(
  logger: Logger,
  deadlineMs: number,
  steps: Array<() => Promise<unknown>>,
): void {
  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down: no new work, finishing what is in flight');
    const hardStop = setTimeout(() => {
      logger.error('shutdown took too long; exiting');
      process.exit(1);
    }, deadlineMs);
    hardStop.unref();
    try {
      for (const step of steps) await step();
      logger.info('stopped');
      process.exit(0);
    } catch (err) {
      logger.error({ err }, 'shutdown failed');
      process.exit(1);
    }
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
}
