// Settld, run here as the baseline that issue 23 compares against: a paid call through a payment session must reach at
// least the throughput of Settld's own x402 paid-call flow, measured in the same run on the same machine.
//
// Settld (github.com/aidenlippert/settld, later renamed Nooterra) is the service this project re-implements. This file
// runs its API server from a checkout under /tmp at a pinned commit, the last one before the rename, with its in-memory
// store, on 127.0.0.1 only. Its code stays there: nothing of it is copied into this repository.
//
// One paid call is what Settld's x402 gateway (services/x402-gateway) asks of the API for a call to a tool whose 402
// offer carries a provider quote (as its upstream mock's always does): gate create (the hold on the payer's wallet) ->
// gate quote -> authorize-payment (the SettldPay token) -> verify (green, released to the payee). Each request carries
// a credential, the tenant, the protocol header and an idempotency key, as the gateway sends them, and each answer is
// checked. The tool itself and the gateway's own hops are not part of it: this measures Settld's settlement side.
//
// Credential: the gateway presents a tenant API key (`<keyId>.<secret>`), and Settld checks such a key with scrypt
// (N=16384) on every request: about 37 ms of CPU, so about 150 ms a paid call and some 5 calls/s. That is a property of
// its key storage, not of its payment flow (this project hashes keys with sha256), so the baseline by default presents
// Settld's operator token (PROXY_OPS_TOKEN, compared as it is), which skips that and leaves the flow itself (about
// 4-6 ms of Settld's CPU a paid call here). `{ auth: 'api-key' }` measures the gateway's credential as shipped.
//
//   const settld = await startSettld(console.error);
//   await settld.prepare(16);           // payers 0..15, registered and funded
//   await settld.paidCall(3);           // one whole paid call by payer 3
//   await settld.stop();
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes, generateKeyPairSync } from 'node:crypto';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { HttpClient } from './growth/http-client.ts';
// Settld's server wants a fixed PORT (it refuses 0): a port the kernel handed out and took back.
import { freePort } from './production-service.ts';

/** The last commit named Settld (the next one, d1b1676, renames it Nooterra). */
const COMMIT = '69ba78bb84e1a0056024e22926b21c27cec89035';
const MIRROR = process.env.SETTLD_MIRROR ?? '/work/.mirror/aidenlippert+settld/repo';
const CHECKOUT = process.env.SETTLD_CHECKOUT ?? `/tmp/settld-${COMMIT.slice(0, 7)}`;
const READY_MARK = '.bench-ready';

const TENANT = 'tenant_default';
const PAYEE = 'agt_bench_payee';
const payer = (client: number) => `agt_bench_payer_${client}`;
/** What the gateway's upstream mock asks for (its default price), and the gateway's default terms. */
const PRICE_CENTS = 500;
const HOLDBACK_BPS = 0;
const DISPUTE_WINDOW_MS = 3_600_000;
const TOOL_ID = 'tool_search'; // a ref: [A-Za-z0-9:_-]+
const FUNDS_CENTS = 1_000_000_000;
const RELEASE_ON_GREEN = {
  mode: 'automatic',
  rules: {
    autoReleaseOnGreen: true,
    greenReleaseRatePct: 100,
    autoReleaseOnAmber: false,
    amberReleaseRatePct: 0,
    autoReleaseOnRed: true,
    redReleaseRatePct: 0,
  },
};

export interface Settld {
  port: number;
  pid: number;
  stop: () => Promise<void>;
  /** One whole x402 paid call by payer `client` (which `prepare` must have made). */
  paidCall: (client: number) => Promise<void>;
  /** Registers and funds payers 0..clients-1 (and the payee, once); payers already made are kept. */
  prepare: (clients: number) => Promise<void>;
}

/** Makes the pinned checkout and its dependencies unless a previous run left them ready. */
function ensureCheckout(log: (line: string) => void): void {
  if (existsSync(`${CHECKOUT}/${READY_MARK}`)) return;
  if (!existsSync(MIRROR))
    throw new Error(`Settld: no mirror at ${MIRROR} to check out ${COMMIT} from (set SETTLD_MIRROR)`);
  const major = Number(process.versions.node.split('.')[0]);
  if (major !== 20)
    throw new Error(
      `Settld ${COMMIT.slice(0, 7)} needs Node 20.x (its preinstall refuses others); this is ${process.version}`,
    );
  log(`settld: checking out ${COMMIT.slice(0, 7)} from ${MIRROR} into ${CHECKOUT}`);
  rmSync(CHECKOUT, { recursive: true, force: true });
  mkdirSync(CHECKOUT, { recursive: true });
  try {
    execFileSync(
      'bash',
      ['-o', 'pipefail', '-c', `git -C "$1" archive "$2" | tar -x -C "$3"`, 'archive', MIRROR, COMMIT, CHECKOUT],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
  } catch (err) {
    throw new Error(
      `Settld: git archive of ${COMMIT} from ${MIRROR} failed: ${(err as { stderr?: Buffer }).stderr?.toString().trim() ?? err}`,
    );
  }
  log(`settld: npm ci --omit=dev in ${CHECKOUT} (its runtime dependencies: pg, the Circle and Coinbase SDKs)`);
  try {
    execFileSync('npm', ['ci', '--omit=dev', '--no-audit', '--no-fund'], {
      cwd: CHECKOUT,
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 600_000,
    });
  } catch (err) {
    const e = err as { stdout?: Buffer; stderr?: Buffer };
    throw new Error(
      `Settld: npm ci in ${CHECKOUT} failed:\n${`${e.stdout ?? ''}${e.stderr ?? ''}`.trim().slice(-2000) || err}`,
    );
  }
  writeFileSync(`${CHECKOUT}/${READY_MARK}`, `${COMMIT}\n`);
  log('settld: checkout ready');
}

// Loaded into Settld's process beside its own code: it exits when our end of its stdin closes, so the server goes
// with this process however this process ends.
const WATCHDOG = `data:text/javascript,${encodeURIComponent("process.stdin.on('close', () => process.exit(0)); process.stdin.resume();")}`;

export interface SettldOptions {
  /** 'ops-token' (default): the operator token; 'api-key': a minted tenant API key, scrypt-checked on each request. */
  auth?: 'ops-token' | 'api-key';
}

export async function startSettld(log: (line: string) => void, options: SettldOptions = {}): Promise<Settld> {
  const auth = options.auth ?? 'ops-token';
  ensureCheckout(log);
  const port = await freePort();
  const opsToken = `tok_ops_${randomBytes(12).toString('hex')}`;
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    PROXY_OPS_TOKEN: opsToken,
    BIND_HOST: '127.0.0.1',
    PORT: String(port),
    STORE: 'memory',
    NODE_ENV: 'development',
    LOG_LEVEL: 'info',
  };
  // Its defaults otherwise: no autotick, no rate limit, one JSON log line a request (to our pipe, kept for errors).
  for (const name of [
    'PROXY_BIND_HOST',
    'PROXY_DATA_DIR',
    'DATABASE_URL',
    'PROXY_AUTOTICK_INTERVAL_MS',
    'NODE_OPTIONS',
  ])
    delete env[name];
  const child = spawn(process.execPath, ['--import', WATCHDOG, 'src/api/server.js'], {
    cwd: CHECKOUT,
    env,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const output: string[] = [];
  const keep = (chunk: Buffer) => {
    output.push(chunk.toString('utf8'));
    if (output.length > 200) output.shift();
  };
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  let exited: string | null = null;
  const gone = new Promise<void>((resolve) =>
    child.once('exit', (code, signal) => ((exited = `exit code ${code} signal ${signal}`), resolve())),
  );
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  const stop = async () => {
    process.off('exit', killOnExit);
    if (exited === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await gone;
      clearTimeout(timer);
    }
  };
  log(`settld: started pid ${child.pid} on 127.0.0.1:${port} (in-memory store)`);

  const http = new HttpClient(port, 30_000);
  try {
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (exited !== null)
        throw new Error(`Settld exited before it was healthy (${exited}):\n${output.join('').slice(-2000)}`);
      const ok = await http.request('GET', '/healthz').then(
        (r) => r.status === 200,
        () => false,
      );
      if (ok) break;
      if (Date.now() > deadline)
        throw new Error(`Settld not healthy on port ${port} within 60 s:\n${output.join('').slice(-2000)}`);
      await new Promise((r) => setTimeout(r, 100));
    }

    // The gateway's credential: an API key for the tenant, minted with the ops token as Settld's x402 quickstart does.
    const mintApiKey = async () => {
      const minted = await http.expect(201, 'POST', '/ops/api-keys', {
        headers: { 'x-proxy-ops-token': opsToken, 'x-proxy-tenant-id': TENANT },
        body: {
          scopes: ['ops_read', 'ops_write', 'finance_read', 'finance_write', 'audit_read'],
          description: 'issue 23 baseline',
        },
      });
      return `${minted.json.keyId}.${minted.json.secret}`;
    };
    const token = auth === 'api-key' ? await mintApiKey() : opsToken;
    log(
      `settld: paid calls present ${auth === 'api-key' ? 'a tenant API key (scrypt-checked per request)' : 'the operator token'}`,
    );
    const run = randomBytes(6).toString('hex');
    let sequence = 0;
    const post = (path: string, status: number, body: unknown, idempotencyKey: string) =>
      http.expect(status, 'POST', path, {
        token,
        headers: { 'x-proxy-tenant-id': TENANT, 'x-settld-protocol': '1.0', 'x-idempotency-key': idempotencyKey },
        body,
      });

    const registered = new Set<string>();
    const register = async (agentId: string) => {
      if (registered.has(agentId)) return;
      const { publicKey } = generateKeyPairSync('ed25519');
      await post(
        '/agents/register',
        201,
        {
          agentId,
          displayName: agentId,
          owner: { ownerType: 'service', ownerId: 'svc_bench' },
          publicKeyPem: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
        },
        `register_${run}_${agentId}`,
      );
      registered.add(agentId);
    };
    const prepare = async (clients: number) => {
      await register(PAYEE);
      for (let c = 0; c < clients; c++) {
        if (registered.has(payer(c))) continue;
        await register(payer(c));
        await post(
          `/agents/${payer(c)}/wallet/credit`,
          201,
          { amountCents: FUNDS_CENTS, currency: 'USD' },
          `credit_${run}_${c}`,
        );
      }
    };

    // The offer the tool's 402 carries (the provider kit's x-payment-required), as the gateway passes it on.
    const offer = `amountCents=${PRICE_CENTS}; currency=USD; providerId=${PAYEE}; toolId=${TOOL_ID}; address=0x0; network=base-sepolia; requestBindingMode=none`;
    const paidCall = async (client: number) => {
      if (!registered.has(payer(client))) throw new Error(`Settld: payer ${client} was not prepared`);
      const key = `${run}_${client}_${sequence++}`;
      const created = await post(
        '/x402/gate/create',
        201,
        {
          payerAgentId: payer(client),
          payeeAgentId: PAYEE,
          amountCents: PRICE_CENTS,
          currency: 'USD',
          holdbackBps: HOLDBACK_BPS,
          disputeWindowMs: DISPUTE_WINDOW_MS,
          toolId: TOOL_ID,
          paymentRequiredHeader: { 'x-payment-required': offer },
        },
        `x402_create_${key}`,
      );
      const gateId = created.json?.gate?.gateId;
      if (typeof gateId !== 'string' || created.json.gate.status !== 'held')
        throw new Error(`gate create: no held gate: ${created.text.slice(0, 300)}`);

      const quoted = await post(
        '/x402/gate/quote',
        200,
        { gateId, providerId: PAYEE, toolId: TOOL_ID, quoteId: `q_${key}` },
        `x402_quote_${key}`,
      );
      const quoteId = quoted.json?.quote?.quoteId;
      if (typeof quoteId !== 'string') throw new Error(`gate quote: no quoteId: ${quoted.text.slice(0, 300)}`);

      const authorized = await post('/x402/gate/authorize-payment', 200, { gateId, quoteId }, `x402_authz_${key}`);
      if (typeof authorized.json?.token !== 'string' || !authorized.json.token)
        throw new Error(`authorize-payment: no token: ${authorized.text.slice(0, 300)}`);

      const responseSha = randomBytes(32).toString('hex');
      const verified = await post(
        '/x402/gate/verify',
        200,
        {
          gateId,
          verificationStatus: 'green',
          runStatus: 'completed',
          policy: RELEASE_ON_GREEN,
          verificationMethod: { mode: 'deterministic', source: 'http_status_v1', attestor: null },
          verificationCodes: [],
          evidenceRefs: [
            `http:request_sha256:${randomBytes(32).toString('hex')}`,
            `http:response_sha256:${responseSha}`,
            'http:status:200',
          ],
        },
        `x402_verify_${key}`,
      );
      const settlement = verified.json?.settlement;
      if (settlement?.status !== 'released' || settlement.releasedAmountCents !== PRICE_CENTS) {
        throw new Error(
          `verify: expected ${PRICE_CENTS} released, got ${settlement?.status} ${settlement?.releasedAmountCents}: ${verified.text.slice(0, 300)}`,
        );
      }
    };

    return { port, pid: child.pid!, stop, paidCall, prepare };
  } catch (err) {
    await stop();
    throw err;
  }
}
