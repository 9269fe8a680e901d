import { execFileSync, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    mongoUrl: string;
    redisUrl: string;
  }
}

const root = fileURLToPath(new URL('..', import.meta.url));

function dockerAnswers(): boolean {
  return spawnSync('docker', ['info'], { stdio: 'ignore', timeout: 5_000 }).status === 0;
}

/**
 * Real servers for every integration test: MONGO_URL / REDIS_URL when set; else mongo:7 and redis:7 containers
 * where a Docker engine answers; else the project's own Redis and FerretDB, provisioned by scripts/services.sh.
 */
export default async function setup(project: TestProject) {
  const stops: Array<() => Promise<unknown>> = [];
  let mongoUrl = process.env.MONGO_URL;
  let redisUrl = process.env.REDIS_URL;

  if ((!mongoUrl || !redisUrl) && process.env.TEST_USE_DOCKER !== '0' && dockerAnswers()) {
    const { GenericContainer, Wait } = await import('testcontainers');
    if (!mongoUrl) {
      const mongo = await new GenericContainer('mongo:7')
        .withExposedPorts(27017)
        .withWaitStrategy(Wait.forListeningPorts())
        .start();
      mongoUrl = `mongodb://${mongo.getHost()}:${mongo.getMappedPort(27017)}/`;
      stops.push(() => mongo.stop());
    }
    if (!redisUrl) {
      const redis = await new GenericContainer('redis:7')
        .withCommand(['redis-server', '--maxmemory-policy', 'noeviction'])
        .withExposedPorts(6379)
        .start();
      redisUrl = `redis://${redis.getHost()}:${redis.getMappedPort(6379)}`;
      stops.push(() => redis.stop());
    }
  }
  if (!mongoUrl || !redisUrl) {
    execFileSync('bash', [`${root}/scripts/services.sh`, 'up'], {
      stdio: 'inherit',
      env: {
        ...process.env,
        ...(mongoUrl ? { MONGO_URL: mongoUrl } : {}),
        ...(redisUrl ? { REDIS_URL: redisUrl } : {}),
      },
    });
    mongoUrl ??= `mongodb://127.0.0.1:${process.env.LOCAL_MONGO_PORT ?? 27027}/`;
    redisUrl ??= `redis://127.0.0.1:${process.env.LOCAL_REDIS_PORT ?? 6390}`;
  }
  project.provide('mongoUrl', mongoUrl);
  project.provide('redisUrl', redisUrl);
  return async () => {
    for (const stop of stops) await stop();
  };
}
