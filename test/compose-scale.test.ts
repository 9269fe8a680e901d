import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { loadConfig } from '../src/config.ts';
import { clusterNodes } from '../src/redis.ts';

// docker-compose.scale.yml, the production layout docs/capacity.md describes, is never started here (no Docker engine):
// these checks are what keeps it true to the service. A variable the service does not read is a setting that silently
// does nothing; a port published beyond loopback, or a Redis URL that is not the cluster, is the layout lying.
const root = new URL('..', import.meta.url);
const file = readFileSync(new URL('docker-compose.scale.yml', root), 'utf8');
const compose = parse(file, { merge: true }) as {
  services: Record<
    string,
    {
      command?: string[] | string;
      environment?: Record<string, string>;
      ports?: string[];
      deploy?: { replicas?: number };
    }
  >;
};
const services = Object.entries(compose.services);
const appServices = services.filter(([, s]) => s.environment !== undefined);

/** The variables src/config.ts reads, found as test/config-docs.test.ts finds them. */
const configSource = readFileSync(new URL('src/config.ts', root), 'utf8');
const readByConfig = new Set(
  [...configSource.matchAll(/env\.([A-Z][A-Z0-9_]+)|\(env, '([A-Z][A-Z0-9_]+)'/g)].map((m) => m[1] ?? m[2]!),
);

/** `${NAME:?message}` and `${NAME:-default}` as compose fills them, with values of the right shape. */
function interpolate(value: string): string {
  const samples: Record<string, string> = {
    SERVICE_ADMIN_KEY: 'a'.repeat(43),
    SERVICE_SIGNING_KEY: '/run/secrets/signing.pem',
    WEBHOOK_SECRET_KEY: Buffer.alloc(32, 1).toString('base64'),
    BUYER_SESSION_SECRET: Buffer.alloc(32, 2).toString('base64'),
  };
  return value.replace(/\$\{([A-Z0-9_]+)(?::([?-])([^}]*))?\}/g, (_, name: string, kind?: string, rest?: string) => {
    if (kind === '-') return rest ?? '';
    const sample = samples[name];
    if (sample === undefined) throw new Error(`no sample value for required ${name}`);
    return sample;
  });
}

describe('docker-compose.scale.yml', () => {
  it('has API and worker services of this image, with the process roles src/main.ts knows', () => {
    const roles = appServices.map(([, s]) => (Array.isArray(s.command) ? s.command[0] : s.command));
    expect(roles.filter((r) => r === 'api').length).toBeGreaterThanOrEqual(2);
    expect(roles.filter((r) => r === 'worker').length).toBeGreaterThanOrEqual(1);
    expect(roles.every((r) => r === 'api' || r === 'worker')).toBe(true);
    const workerReplicas = appServices
      .filter(([, s]) => (Array.isArray(s.command) ? s.command[0] : s.command) === 'worker')
      .reduce((sum, [, s]) => sum + (s.deploy?.replicas ?? 1), 0);
    expect(workerReplicas).toBeGreaterThanOrEqual(2);
  });

  it('gives every service only variables src/config.ts reads, and a configuration it accepts', () => {
    expect(readByConfig.size).toBeGreaterThan(30);
    expect(appServices.length).toBeGreaterThan(0);
    for (const [name, service] of services) {
      const unknown = Object.keys(service.environment ?? {}).filter((v) => !readByConfig.has(v));
      expect(unknown, `${name} sets variables the service does not read`).toEqual([]);
    }
    for (const [, service] of appServices) {
      const env = Object.fromEntries(Object.entries(service.environment!).map(([k, v]) => [k, interpolate(String(v))]));
      // The image sets these two (Dockerfile ENV); production refuses to start without the keys set above.
      const config = loadConfig({ NODE_ENV: 'production', HOST: '0.0.0.0', ...env });
      expect(config.env).toBe('production');
    }
  });

  it('points every process at the Redis Cluster: six cluster-enabled nodes made three masters with a replica each', () => {
    const redisNodes = services.filter(([, s]) => String(s.command ?? '').includes('--cluster-enabled'));
    expect(redisNodes.length).toBe(6);
    for (const [, service] of appServices) {
      const nodes = clusterNodes(service.environment!.REDIS_URL!);
      expect(nodes, 'REDIS_URL must be a redis+cluster:// URL').not.toBeNull();
      for (const node of nodes!) expect(redisNodes.map(([name]) => name)).toContain(node.host);
    }
    const init = compose.services['redis-cluster-init']!;
    const script = ([] as string[]).concat(init.command ?? []).join(' ');
    expect(script).toContain('redis-cli --cluster create');
    expect(script).toContain('--cluster-replicas 1'); // 6 nodes, 1 replica each: 3 masters
  });

  it('names the MongoDB replica set the init service initiates, with all its members', () => {
    const init = ([] as string[]).concat(compose.services['mongo-init']!.command ?? []).join(' ');
    const setName = /rs\.initiate\(\{\s*_id:\s*'([^']+)'/.exec(init)?.[1];
    expect(setName).toBeTruthy();
    const members = [...init.matchAll(/host:\s*'([^']+)'/g)].map((m) => m[1]!);
    expect(members.length).toBe(3);
    for (const [, service] of appServices) {
      const url = new URL(service.environment!.MONGO_URL!.replace(/^mongodb:\/\/[^/]+/, 'mongodb://hosts'));
      expect(url.searchParams.get('replicaSet')).toBe(setName);
      const hosts = /^mongodb:\/\/([^/]+)\//.exec(service.environment!.MONGO_URL!)![1]!.split(',');
      expect(hosts.sort()).toEqual([...members].sort());
    }
    const replicaNodes = services.filter(([, s]) => String(s.command ?? '').includes(`--replSet,${setName}`));
    expect(replicaNodes.length).toBe(3);
  });

  it('publishes ports on loopback only', () => {
    const published = services.flatMap(([name, s]) => (s.ports ?? []).map((p) => [name, String(p)] as const));
    expect(published.length).toBeGreaterThan(0);
    for (const [name, port] of published) expect(port, name).toMatch(/^127\.0\.0\.1:\d+:\d+$/);
  });
});
