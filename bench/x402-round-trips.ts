// Diagnostic: what each x402 hot-path request costs in round trips, over real HTTP against the in-process service
// (API + x402-verify and settle workers). Per request: MongoDB commands by kind and collection, how many of them
// ran one after another (waves: a command that starts when none is in flight begins a new wave), and Redis
// commands (seen through MONITOR, filtered by this run's key prefix; the worker's commands count too).
// Usage: node --import tsx bench/x402-round-trips.ts [repeats]   (needs the local services; cleans up after itself)
import { createHash } from 'node:crypto';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { CommandStartedEvent, CommandSucceededEvent, CommandFailedEvent } from 'mongodb';
import { generateEd25519KeyPair } from '../src/domain/crypto.ts';
import { startInProcessService } from './in-process.ts';

const REPEATS = Number(process.argv[2] ?? 3);
process.env.MONGO_COMMAND_MONITORING = 'true'; // this diagnostic counts the commands each request sends
const host = await startInProcessService(['x402-verify', 'settle']);
const { runtime, base, adminKey, config } = host;

interface Cmd {
  label: string;
  start: number;
  end: number;
}
let cmds = new Map<number, Cmd>();
runtime.mongo.on('commandStarted', (e: CommandStartedEvent) => {
  if (e.commandName === 'hello' || e.commandName === 'isMaster' || e.commandName === 'ping') return;
  cmds.set(e.requestId, {
    label: `${e.commandName} ${String(e.command[e.commandName])}`,
    start: performance.now(),
    end: Infinity,
  });
});
const ended = (e: CommandSucceededEvent | CommandFailedEvent) => {
  const c = cmds.get(e.requestId);
  if (c) c.end = performance.now();
};
runtime.mongo.on('commandSucceeded', ended);
runtime.mongo.on('commandFailed', ended);

let redisSeen: string[] = [];
// redis-cli MONITOR (ioredis's own monitor mode trips over the lines already in flight when it switches).
const redisUrl = new URL(config.redisUrl);
const monitor = spawn('redis-cli', ['-h', redisUrl.hostname, '-p', redisUrl.port || '6379', 'monitor'], {
  stdio: ['ignore', 'pipe', 'ignore'],
});
createInterface({ input: monitor.stdout! }).on('line', (line) => {
  if (!line.includes(config.redisPrefix)) return;
  const args = [...line.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]!);
  const name = (args[0] ?? '?').toLowerCase();
  // Scripts are named by their first key's last segment (the BullMQ operation's main key).
  redisSeen.push(
    name === 'evalsha'
      ? `evalsha(${
          String(args[3] ?? '')
            .split(':')
            .slice(-1)[0]
        })`
      : line.includes('lua]')
        ? `lua:${name}`
        : name,
  );
});
await new Promise((r) => setTimeout(r, 300));

async function call(method: string, path: string, token: string, body?: unknown, expect = [200, 201]) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (!expect.includes(res.status)) throw new Error(`${method} ${path} -> ${res.status} ${text.slice(0, 300)}`);
  return JSON.parse(text);
}

function waves(list: Cmd[]): number {
  const sorted = [...list].sort((a, b) => a.start - b.start);
  let n = 0;
  let busyUntil = -Infinity;
  for (const c of sorted) {
    if (c.start >= busyUntil) n++;
    busyUntil = Math.max(busyUntil, c.end);
  }
  return n;
}

interface Totals {
  ms: number[];
  mongo: number[];
  waves: number[];
  redis: number[];
  redisRtt: number[];
  kinds: Map<string, number>;
  kms: Map<string, number>;
  rkinds: Map<string, number>;
}
const totals = new Map<string, Totals>();
async function counted<T>(label: string, work: () => Promise<T>): Promise<T> {
  cmds = new Map();
  redisSeen = [];
  const t0 = performance.now();
  const out = await work();
  const ms = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 150)); // let MONITOR lines and trailing job commands arrive
  const list = [...cmds.values()];
  const t: Totals = totals.get(label) ?? {
    ms: [],
    mongo: [],
    waves: [],
    redis: [],
    redisRtt: [],
    kinds: new Map(),
    kms: new Map(),
    rkinds: new Map(),
  };
  t.ms.push(ms);
  t.mongo.push(list.length);
  t.waves.push(waves(list));
  t.redis.push(redisSeen.length);
  t.redisRtt.push(redisSeen.filter((r) => !r.startsWith('lua:')).length);
  for (const c of list) {
    t.kinds.set(c.label, (t.kinds.get(c.label) ?? 0) + 1);
    t.kms.set(c.label, (t.kms.get(c.label) ?? 0) + (c.end - c.start));
  }
  for (const r of redisSeen) t.rkinds.set(r, (t.rkinds.get(r) ?? 0) + 1);
  totals.set(label, t);
  return out;
}

try {
  const tenant = await call('POST', '/ops/tenants', adminKey, { name: 'rt' });
  const token = (
    await call('POST', '/ops/api-keys', adminKey, {
      tenantId: tenant.tenantId,
      scopes: ['agents:write', 'x402:write', 'x402:read', 'wallets:write'],
    })
  ).token;
  const agent = async (name: string) =>
    (
      await call('POST', '/v1/agents', token, {
        name,
        publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url'),
      })
    ).agentId as string;
  const payer = await agent('payer');
  const payee = await agent('payee');
  await call('POST', `/ops/wallets/${encodeURIComponent(payer)}/credit`, adminKey, {
    amount: 1_000_000_000,
    currency: 'USD',
  });
  for (let i = 0; i <= REPEATS; i++) {
    // The first pass warms caches (credentials, wallets, queue events) and is not counted.
    const run = i === 0 ? <T>(_: string, w: () => Promise<T>) => w() : counted;
    const gate = await run('create', () =>
      call('POST', '/x402/gate/create', token, {
        payerAgentId: payer,
        payeeAgentId: payee,
        amount: 1_000,
        currency: 'USD',
        holdbackBps: 1_000,
        disputeWindowSeconds: 3_600,
      }),
    );
    const sha = createHash('sha256').update(`rt ${i}`).digest('hex');
    const q = await run('quote', () =>
      call('POST', '/x402/gate/quote', token, { gateId: gate.gateId, requestSha256: sha }),
    );
    await run('authorize-payment', () =>
      call('POST', '/x402/gate/authorize-payment', token, {
        gateId: gate.gateId,
        quoteId: q.quoteId,
        requestSha256: sha,
      }),
    );
    await run('authorize-payment (repeat)', () =>
      call('POST', '/x402/gate/authorize-payment', token, {
        gateId: gate.gateId,
        quoteId: q.quoteId,
        requestSha256: sha,
      }),
    );
    const v = await run('verify', () =>
      call('POST', '/x402/gate/verify', token, { gateId: gate.gateId, evidence: { responseSha256: sha } }, [200, 202]),
    );
    if (v.decision === null) console.log('verify answered 202');
    await run('GET gate', () => call('GET', `/x402/gate/${gate.gateId}`, token));
  }
  const avg = (xs: number[]) => (xs.reduce((a, b) => a + b, 0) / xs.length).toFixed(1);
  for (const [label, t] of totals) {
    console.log(
      `\n${label}: ${avg(t.ms)} ms, mongo ${avg(t.mongo)} commands in ${avg(t.waves)} waves, redis ${avg(t.redis)} commands (${avg(t.redisRtt)} round trips)`,
    );
    console.log(
      `  mongo: ${[...t.kinds]
        .sort((a, b) => b[1] - a[1])
        .map(([k, n]) => `${k} x${(n / REPEATS).toFixed(1)} (${(t.kms.get(k)! / n).toFixed(1)} ms)`)
        .join(', ')}`,
    );
    console.log(
      `  redis: ${[...t.rkinds]
        .sort((a, b) => b[1] - a[1])
        .map(([k, n]) => `${k} x${(n / REPEATS).toFixed(1)}`)
        .join(', ')}`,
    );
  }
} finally {
  monitor.kill();
  await host.close();
}
