import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { Producers } from '../../src/queues/index.ts';
import { testEnv } from '../helpers/context.ts';

const fixture = fileURLToPath(new URL('../fixtures/slow-worker.ts', import.meta.url));

describe('worker shutdown', () => {
  const env = testEnv({ LOG_LEVEL: 'warn' });
  const config = loadConfig(env.vars);
  const redis = new Redis(config.redisUrl);
  const producers = new Producers(redis, config.redisPrefix);
  afterAll(async () => {
    await producers.close();
    const keys = await redis.keys(`${config.redisPrefix}:*`);
    if (keys.length) await redis.del(...keys);
    redis.disconnect();
  });

  it('finishes the active job on SIGTERM before exiting 0', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', fixture, '1500'], {
      env: { ...process.env, ...env.vars },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));

    await producers.enqueue('smoke-test', { tenantId: 'ten_x', smokeTestId: 'smk_1' }, 'smoke-test__smk_1');
    const marksKey = `${config.redisPrefix}:marks`;
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline && (await redis.llen(marksKey)) === 0) await new Promise((r) => setTimeout(r, 50));
    expect(await redis.lrange(marksKey, 0, -1)).toEqual(['started:smoke-test__smk_1']);

    child.kill('SIGTERM');
    expect(await exited, stderr).toBe(0);
    expect(await redis.lrange(marksKey, 0, -1)).toEqual(['started:smoke-test__smk_1', 'finished:smk_1']);
    const job = await producers.queues['smoke-test'].getJob('smoke-test__smk_1');
    expect(await job!.getState()).toBe('completed');
  });
});
