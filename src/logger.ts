import { pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino';
import type { Config } from './config.ts';
import { unreachableDependency } from './outages.ts';

/**
 * What Fastify logs (at error, with the stack) when a handler fails after its request was answered: the request
 * deadline answers 503 while a handler still waits on a lost Redis or MongoDB, which then fails it. The caller had
 * its 503 and the outage is counted (outages.ts), so such a line would be one stack trace per request.
 */
const LATE_HANDLER_FAILURE = 'Promise errored, but reply.sent = true was set';

// Anything that can carry a credential or a secret is redacted wherever it appears in a log line.
export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers.cookie',
  'headers.authorization',
  'headers["x-api-key"]',
  '*.token',
  '*.secret',
  '*.adminKey',
  '*.password',
  '*.privateKey',
  'token',
  'secret',
  'adminKey',
];

/** The process logger; `destination` (stdout when absent) lets a test read the lines a real service writes. */
export function createLogger(config: Pick<Config, 'logLevel'>, name: string, destination?: DestinationStream): Logger {
  const options: LoggerOptions = {
    name,
    level: config.logLevel,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    base: { pid: process.pid, service: 'agent-settlement' },
    timestamp: pino.stdTimeFunctions.isoTime,
    hooks: {
      logMethod(args, method) {
        const [fields, msg] = args as unknown[];
        if (msg === LATE_HANDLER_FAILURE && unreachableDependency((fields as { err?: unknown } | null)?.err) !== null)
          return;
        method.apply(this, args);
      },
    },
  };
  return destination ? pino(options, destination) : pino(options);
}
