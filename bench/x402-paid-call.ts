// Latency of a whole paid call through the stock x402 v2 packages: the fetch wrapper with the escrow-gate client
// scheme (gate create, quote, authorize-payment) -> an express tool behind the stock middleware -> facilitator verify
// -> the route -> facilitator settle (the gate's verify, release minus holdback) -> the answer with PAYMENT-RESPONSE.
// With 1 and 16 concurrent callers, each its own payer. Prints JSON (also written to
// bench/results/x402-paid-call.json). `node --import tsx bench/x402-paid-call.ts [--ops N]`. Needs the local services.
import { mkdirSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { decodePaymentResponseHeader } from '@x402/fetch';
import { payingFetch } from '../examples/paid-tool/caller.ts';
import { createPaidTool } from '../examples/paid-tool/tool.ts';
import { generateEd25519KeyPair } from '../src/domain/crypto.ts';
import { startInProcessService } from './in-process.ts';

const opsArg = process.argv.indexOf('--ops');
const OPS = opsArg >= 0 ? Number(process.argv[opsArg + 1]) : 48;
const CONCURRENCY = [1, 16];

const service = await startInProcessService(['x402-verify', 'settle', 'webhook-dispatch']);
const { config, base, adminKey } = service;
let tool: Server | undefined;

async function call(path: string, token: string, body: unknown) {
  const res = await fetch(base + path, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (res.status !== 200 && res.status !== 201) throw new Error(`POST ${path} -> ${res.status}`);
  return res.json();
}

function percentiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (p: number) =>
    Number(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!.toFixed(2));
  return { n: sorted.length, p50: at(50), p95: at(95), p99: at(99) };
}

try {
  const tenant = await call('/ops/tenants', adminKey, { name: 'bench' });
  const payerKey = (
    await call('/ops/api-keys', adminKey, { tenantId: tenant.tenantId, scopes: ['agents:write', 'x402:write'] })
  ).token;
  const providerKey = (await call('/ops/api-keys', adminKey, { tenantId: tenant.tenantId, scopes: ['x402:write'] }))
    .token;
  const agent = async (name: string) =>
    (
      await call('/v1/agents', payerKey, {
        name,
        publicKey: Buffer.from(generateEd25519KeyPair().raw).toString('base64url'),
      })
    ).agentId as string;
  const payee = await agent('tool');
  const payers = await Promise.all(
    Array.from({ length: Math.max(...CONCURRENCY) }, async (_, i) => {
      const payer = await agent(`payer${i}`);
      await call(`/ops/wallets/${encodeURIComponent(payer)}/credit`, adminKey, { amount: 1_000_000, currency: 'USD' });
      return payingFetch({ serviceUrl: base, apiKey: payerKey, payerAgentId: payer, network: config.x402.network });
    }),
  );
  tool = createPaidTool({
    serviceUrl: base,
    apiKey: providerKey,
    network: config.x402.network,
    payeeAgentId: payee,
    price: '$0.10',
    holdbackBps: 1_000,
  }).listen(0, '127.0.0.1');
  await new Promise((resolve) => tool!.once('listening', resolve));
  const toolUrl = `http://127.0.0.1:${(tool.address() as { port: number }).port}/search`;

  const results: Record<string, unknown> = {};
  for (const clients of CONCURRENCY) {
    const ops = clients === 1 ? Math.ceil(OPS / 2) : OPS;
    const samples: number[] = [];
    let whileSettling = 0;
    let next = 0;
    await Promise.all(
      payers.slice(0, clients).map(async (paidFetch) => {
        for (let i = next++; i < ops; i = next++) {
          const started = performance.now();
          const res = await paidFetch(`${toolUrl}?q=${clients}-${i}`);
          await res.text();
          samples.push(performance.now() - started);
          const receipt = res.headers.get('PAYMENT-RESPONSE');
          if (res.status !== 200 || !receipt) throw new Error(`paid call -> ${res.status}`);
          if ((decodePaymentResponseHeader(receipt).extra as { status?: string } | undefined)?.status !== 'released')
            whileSettling++;
        }
      }),
    );
    results[`clients_${clients}`] = { ops, paidCall: percentiles(samples), answeredWhileSettling: whileSettling };
  }
  const out = { benchmark: 'x402-paid-call', at: new Date().toISOString(), node: process.version, latencyMs: results };
  mkdirSync('bench/results', { recursive: true });
  writeFileSync('bench/results/x402-paid-call.json', `${JSON.stringify(out, null, 2)}\n`);
  console.log(JSON.stringify(out, null, 2));
} finally {
  await new Promise((resolve) => (tool ? tool.close(resolve) : resolve(undefined)));
  await service.close();
}
