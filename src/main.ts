import { ConfigError, loadConfig } from './config.ts';
import { exitGracefullyOnSignals } from './lifecycle.ts';
import { createLogger } from './logger.ts';
import { isQueueName, QUEUE_NAMES, type QueueName } from './queues/index.ts';
import { connectRuntime, createRuntime } from './runtime.ts';
import { rebuildListIndex } from './store/list-rebuild.ts';
import { createProcessors } from './workers/index.ts';
import { startWorkers, type RunningWorkers } from './workers/runner.ts';

const USAGE = 'usage: main.ts api | worker [queue…] | all | rebuild-lists (--help: what each does)';

const HELP = `usage: node --import tsx src/main.ts <command>   (dist/main.js once built)

  api               the HTTP API on HOST:PORT (default 127.0.0.1:3000); enqueues, runs no jobs
  worker [queue…]   workers for the named queues, all of them when none is named:
                    ${QUEUE_NAMES.join(', ')}
  all               api and every worker in one process (what npm start and npm run dev run)
  rebuild-lists     enters every stored run, agent, settlement, dispute, gate, escalation and session in the
                    list index, then exits

Configuration comes from the environment (README.md, "Configuration"). The command line tool, with the offline
verifier and the MCP server on stdio: bin/agent-settlement.js --help.`;

/** Until the configuration is read, and for a crash: every line the process writes is JSON, these too. */
const bootLogger = createLogger({ logLevel: 'info' }, 'main');

async function main(argv: string[]): Promise<void> {
  const [mode, ...queueArgs] = argv;
  if (mode === '--help' || mode === '-h' || mode === 'help') {
    process.stdout.write(`${HELP}\n`); // a person asked: plain text, not a log line
    return;
  }
  if (mode !== 'api' && mode !== 'worker' && mode !== 'all' && mode !== 'rebuild-lists') {
    bootLogger.fatal({ argv }, USAGE);
    process.exit(2);
  }
  let config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      bootLogger.fatal(err.message);
      process.exit(1);
    }
    throw err;
  }
  const logger = createLogger(config, mode);
  const runtime = createRuntime(config, logger);
  await connectRuntime(runtime);
  if (mode === 'rebuild-lists') {
    // An operator's command: enters every stored object in the list index (store/list-rebuild.ts), then exits.
    const counts = await rebuildListIndex(runtime.stores.lists, runtime.stores);
    logger.info({ counts }, 'list index rebuilt');
    await runtime.close();
    return;
  }

  // Loaded only where it serves: a worker process never builds the HTTP app (Fastify, its plugins, Bull Board, the
  // route schemas), which would cost it about 8 MB of heap and 15 MB of RSS for nothing.
  const app = mode === 'worker' ? null : await (await import('./http/app.ts')).buildApp(runtime);
  let workers: RunningWorkers | null = null;
  if (mode !== 'api') {
    const processors = createProcessors(runtime);
    const available = Object.keys(processors) as QueueName[];
    const unknown = queueArgs.filter((q) => !isQueueName(q) || !available.includes(q));
    if (unknown.length > 0) {
      logger.fatal({ unknown, available }, 'no such queue, or no processor for it in this build');
      process.exit(2);
    }
    const queues = queueArgs.length > 0 ? (queueArgs as QueueName[]) : available;
    workers = startWorkers(config, logger, processors, queues, runtime.outages);
  }
  if (app) {
    await app.listen({ host: config.host, port: config.port });
  }

  exitGracefullyOnSignals(logger, config.shutdownTimeoutMs + 5_000, [
    async () => app?.close(), // stops accepting, waits for in-flight requests
    async () => workers?.close(), // lets active jobs finish, bounded by SHUTDOWN_TIMEOUT_MS
    () => runtime.close(),
  ]);
}

main(process.argv.slice(2)).catch((err) => {
  bootLogger.fatal({ err }, 'could not start');
  process.exit(1);
});
