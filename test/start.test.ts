import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';

/** A port nothing listens on now. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

// The README's one command for other ports: `PORT=… REDIS_PORT=… MONGO_PORT=… npm start` moves the API, the local
// Redis and FerretDB, and the URLs the service uses for them.
it('PORT, REDIS_PORT and MONGO_PORT move the whole service in one command', { timeout: 180_000 }, async () => {
  const [port, redisPort, mongoPort] = [await freePort(), await freePort(), await freePort()];
  const dataDir = mkdtempSync(join(tmpdir(), 'start-ports-'));
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    PORT: String(port),
    REDIS_PORT: String(redisPort),
    MONGO_PORT: String(mongoPort),
    SERVICES_DATA_DIR: dataDir,
    SERVICE_ADMIN_KEY: randomBytes(32).toString('base64url'),
  };
  // Nothing of the environment this suite runs in (CI sets LOCAL_*_PORT for its own servers) may choose for it.
  for (const name of ['REDIS_URL', 'MONGO_URL', 'MONGO_DB', 'LOCAL_REDIS_PORT', 'LOCAL_MONGO_PORT']) delete env[name];
  const child = spawn('bash', ['scripts/start.sh'], { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  try {
    let ready: { status: string; checks: Record<string, string> } | null = null;
    for (let i = 0; i < 600 && !ready; i++) {
      await new Promise((r) => setTimeout(r, 200));
      if (child.exitCode !== null) throw new Error(`npm start exited ${child.exitCode}: ${output.slice(-2_000)}`);
      const res = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => null);
      if (res?.status === 200) ready = await res.json();
    }
    expect(ready, output.slice(-2_000)).toMatchObject({ status: 'ready' });
    expect(output).toContain(`redis on 127.0.0.1:${redisPort}`);
    expect(output).toContain(`ferretdb on 127.0.0.1:${mongoPort}`);
  } finally {
    try {
      process.kill(-child.pid!, 'SIGTERM');
    } catch {
      // already gone
    }
    await new Promise((r) => setTimeout(r, 500));
    spawnSync('bash', ['scripts/services.sh', 'down'], {
      env: { ...env, LOCAL_REDIS_PORT: String(redisPort), LOCAL_MONGO_PORT: String(mongoPort) },
    });
    rmSync(dataDir, { recursive: true, force: true });
  }
});
