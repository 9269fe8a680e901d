// Writes openapi/openapi.json from the route schemas: `npm run openapi`. `--check` exits 1 when the committed file
// differs. Builds the app without connecting to anything: generating the document never touches Redis or MongoDB.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../src/config.ts';
import { buildApp } from '../src/http/app.ts';
import { createLogger } from '../src/logger.ts';
import { createRuntime } from '../src/runtime.ts';

export const OPENAPI_PATH = fileURLToPath(new URL('../openapi/openapi.json', import.meta.url));

export async function generateOpenApi(): Promise<string> {
  // Defaults only, so the document does not depend on whoever runs the writer.
  const config = loadConfig({ SERVICE_ADMIN_KEY: 'openapi-writer-placeholder-not-a-credential', LOG_LEVEL: 'silent' });
  const runtime = createRuntime(config, createLogger(config, 'openapi'));
  const app = await buildApp(runtime, { bullBoard: false, logger: false });
  try {
    await app.ready();
    return `${JSON.stringify(app.swagger(), null, 2)}\n`;
  } finally {
    await app.close();
    await runtime.close();
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const generated = await generateOpenApi();
  if (process.argv.includes('--check')) {
    const committed = readFileSync(OPENAPI_PATH, 'utf8');
    if (committed !== generated) {
      console.error('openapi/openapi.json is out of date: run npm run openapi');
      process.exit(1);
    }
    console.log('openapi/openapi.json is up to date');
  } else {
    writeFileSync(OPENAPI_PATH, generated);
    console.log(`wrote ${OPENAPI_PATH}`);
  }
}
