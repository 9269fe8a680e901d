import { pino, type Logger } from 'pino';
import type { Config } from './config.ts';

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

export function createLogger(config: Pick<Config, 'logLevel'>, name: string): Logger {
  return pino({
    name,
    level: config.logLevel,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    base: { pid: process.pid, service: 'agent-settlement' },
    timestamp: pino.stdTimeFunctions.isoTime,
  });
}
