// Seeds a database directly through the stores' raw collections (insertMany in large chunks): runs, their event
// batches (up to 100 events per batch document, as appends store them), heads, and some finalized
// runs with their seal, artifact and settlement. The documents have the shape and size of real ones.
import type { KeyObject } from 'node:crypto';
import { buildArtifact } from '../../src/domain/artifact.ts';
import { canonicalize } from '../../src/domain/canonical-json.ts';
import { generateEd25519KeyPair, newId, signHexDigest } from '../../src/domain/crypto.ts';
import {
  computeChainHash,
  computePayloadHash,
  EMPTY_HEAD,
  signEvents,
  type ChainHead,
  type EventEnvelope,
} from '../../src/domain/event-chain.ts';
import { signReceipt } from '../../src/domain/receipt.ts';
import type { Terms } from '../../src/domain/terms.ts';
import type { Runtime } from '../../src/runtime.ts';
import { registerAgent } from '../../src/services/agents.ts';
import { createTenant } from '../../src/services/tenants.ts';
import { storedBatchEvents, type ArtifactDoc, type RunBatchDoc, type RunDoc } from '../../src/store/runs.ts';
import { settlementIdFor, type SettlementDoc } from '../../src/store/settlements.ts';

export interface SeedOptions {
  runs: number;
  events: number;
  /** One run in this many (among runs of one event) is finalized, with an artifact and a settlement. */
  finalizedEvery: number;
  /**
   * false (default): every event has its real payloadHash and chainHash (the chain links), and carries a real
   * signature of its agent made once over a template digest (Ed25519 signing 1M events would dominate the seeding
   * time); finalized runs are always signed for real, so their artifacts verify. true: sign every event for real.
   */
  realSignatures: boolean;
  chunkRuns: number;
}

export interface SeedReport {
  runs: number;
  events: number;
  batchDocuments: number;
  finalizedRuns: number;
  longRuns: number;
  seconds: number;
  buildSeconds: number;
  realSignatures: boolean;
  /** Some seeded run ids, for lookups of the same database size. */
  sampleRunIds: string[];
}

interface SeedAgent {
  agentId: string;
  keyId: string;
  privateKey: KeyObject;
  publicKey: string;
  templateSignature: string;
}

const TERMS: Terms = { accuracy: { min: 0.9 }, latencyP95: { max: 800 } };
const BATCH = 100;
const DAY_MS = 86_400_000;

/** Deterministic PRNG (mulberry32), so two seedings of the same size have the same shapes. */
function prng(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Events per run: most runs hold one event (as a single append stores it), some hold a full batch of 100, and the
 * last run takes what is left, so the total is exactly `events`. Shuffled so long runs are spread over the ids.
 */
function runShapes(runs: number, events: number, random: () => number): number[] {
  const counts = new Array<number>(runs).fill(0);
  if (events < runs) {
    for (let i = 0; i < events; i++) counts[i] = 1;
  } else {
    const long = Math.min(runs, Math.floor((events - runs) / (BATCH - 1)));
    for (let i = 0; i < runs; i++) counts[i] = i < long ? BATCH : 1;
    counts[runs - 1]! += events - counts.reduce((a, b) => a + b, 0);
  }
  for (let i = runs - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [counts[i], counts[j]] = [counts[j]!, counts[i]!];
  }
  return counts;
}

function chain(runId: string, count: number, agent: SeedAgent, startedAt: number, real: boolean): EventEnvelope[] {
  const items = Array.from({ length: count }, (_, i) => ({
    id: newId('evt'),
    runId,
    type: 'sample',
    at: new Date(startedAt + i * 1_000).toISOString(),
    payload: {
      latencyMs: 100 + ((i * 37) % 700),
      correct: i % 20 !== 0,
      step: i,
      note: 'tool output digest 0123456789abcdef',
    },
  }));
  if (real) return signEvents(items, EMPTY_HEAD, agent.privateKey, agent.keyId);
  const out: EventEnvelope[] = [];
  let prev: ChainHead = EMPTY_HEAD;
  for (const item of items) {
    const unsigned = { v: 1 as const, seq: prev.seq + 1, ...item };
    const payloadHash = computePayloadHash(unsigned);
    const chainHash = computeChainHash(1, prev.chainHash, payloadHash);
    out.push({
      ...unsigned,
      prevChainHash: prev.chainHash,
      payloadHash,
      chainHash,
      signerKeyId: agent.keyId,
      signature: agent.templateSignature,
    });
    prev = { seq: unsigned.seq, chainHash };
  }
  return out;
}

export async function seedDatabase(
  runtime: Runtime,
  options: SeedOptions,
  log: (line: string) => void,
): Promise<SeedReport> {
  const started = performance.now();
  const { runs: runStore, settlements } = runtime.stores;
  const tenant = await createTenant(runtime, { name: 'seeded' });
  const agents: SeedAgent[] = [];
  for (let i = 0; i < 20; i++) {
    const pair = generateEd25519KeyPair();
    const publicKey = Buffer.from(pair.raw).toString('base64url');
    const { agent, key } = await registerAgent(runtime, tenant._id, { name: `agent-${i}`, publicKey });
    agents.push({
      agentId: agent._id,
      keyId: key.keyId,
      privateKey: pair.privateKey,
      publicKey,
      templateSignature: signHexDigest(pair.privateKey, 'ab'.repeat(32)),
    });
  }
  const payer = agents[0]!;
  const random = prng(42);
  const shapes = runShapes(options.runs, options.events, random);
  const now = Date.now();
  let buildMs = 0;
  const report: SeedReport = {
    runs: options.runs,
    events: 0,
    batchDocuments: 0,
    finalizedRuns: 0,
    longRuns: shapes.filter((n) => n >= BATCH).length,
    seconds: 0,
    buildSeconds: 0,
    realSignatures: options.realSignatures,
    sampleRunIds: [],
  };

  const buildChunk = (from: number, to: number) => {
    const t0 = performance.now();
    const runs: RunDoc[] = [];
    const batches: RunBatchDoc[] = [];
    const heads: Array<{ _id: string; seq: number; chainHash: string | null; sealed: boolean }> = [];
    const artifacts: ArtifactDoc[] = [];
    const settlementDocs: SettlementDoc[] = [];
    const facts: Array<Parameters<typeof settlements.facts.insertOne>[0]> = [];
    for (let i = from; i < to; i++) {
      const runId = newId('run');
      const agent = agents[1 + (i % (agents.length - 1))]!;
      const count = shapes[i]!;
      const createdAt = new Date(now - 30 * DAY_MS + Math.floor((i / options.runs) * 29 * DAY_MS));
      const finalize = count === 1 && i % options.finalizedEvery === 0;
      const events = chain(runId, count, agent, createdAt.getTime(), options.realSignatures || finalize);
      const receivedAt = new Date(createdAt.getTime() + 1_000);
      for (let first = 0; first < events.length; first += BATCH) {
        const slice = events.slice(first, first + BATCH);
        batches.push({
          _id: `${runId}:${slice[0]!.seq}`,
          tenantId: tenant._id,
          runId,
          firstSeq: slice[0]!.seq,
          lastSeq: slice.at(-1)!.seq,
          ...storedBatchEvents(slice),
          receivedAt,
        });
      }
      const head: ChainHead = events.length ? { seq: events.length, chainHash: events.at(-1)!.chainHash } : EMPTY_HEAD;
      heads.push({ _id: runId, ...head, sealed: finalize });
      const run: RunDoc = {
        _id: runId,
        tenantId: tenant._id,
        agentId: agent.agentId,
        terms: TERMS,
        settlement: finalize
          ? { payerAgentId: payer.agentId, amount: 1_000, currency: 'USD', holdbackBps: 0, disputeWindowSeconds: 3_600 }
          : null,
        status: 'in_progress',
        verdict: null,
        artifactId: null,
        createdAt,
        finalizeRequestedAt: null,
        finalHead: null,
        finalizedAt: null,
        finalizeError: null,
      };
      if (finalize) {
        const sealedAt = new Date(receivedAt.getTime() + 1_000);
        batches.push({
          _id: `${runId}:${head.seq + 1}`,
          tenantId: tenant._id,
          runId,
          firstSeq: head.seq + 1,
          lastSeq: head.seq,
          eventsJson: '[]',
          lastChainHash: null,
          seal: { finalHead: head, sealedAt },
          receivedAt: sealedAt,
        });
        const artifact = buildArtifact(
          {
            runId,
            agentId: agent.agentId,
            agentKeys: [{ keyId: agent.keyId, publicKey: agent.publicKey }],
            terms: TERMS,
            events,
            finalizedAt: sealedAt.toISOString(),
          },
          runtime.keys.active,
        );
        const { items: _items, ...eventsHeader } = artifact.events;
        const finalizedAt = new Date(sealedAt.getTime() + 500);
        artifacts.push({
          _id: artifact.artifactId,
          tenantId: tenant._id,
          runId,
          agentId: agent.agentId,
          artifactHash: artifact.artifactHash,
          headerJson: canonicalize({ ...artifact, events: eventsHeader }),
          eventCount: artifact.events.count,
          createdAt: finalizedAt,
        });
        Object.assign(run, {
          status: 'finalized',
          verdict: artifact.evaluation.verdict,
          artifactId: artifact.artifactId,
          finalizeRequestedAt: sealedAt,
          finalHead: head,
          finalizedAt,
        });
        const settlementId = settlementIdFor(runId);
        const pass = artifact.evaluation.verdict === 'pass';
        const decidedAt = new Date(finalizedAt.getTime() + 1_000).toISOString();
        const terms = {
          runId,
          payerWalletId: payer.agentId,
          payeeWalletId: agent.agentId,
          amount: 1_000,
          currency: 'USD',
          holdbackBps: 0,
          disputeWindowSeconds: 3_600,
        };
        const receipt = signReceipt(
          {
            schema: 'SettlementReceipt.v1',
            settlementId,
            ...terms,
            releasedNow: pass ? 1_000 : 0,
            holdback: 0,
            verdict: pass ? 'pass' : 'fail',
            artifactId: artifact.artifactId,
            artifactHash: artifact.artifactHash,
            decidedAt,
          },
          runtime.keys.active,
        );
        const disputeWindowEndsAt = new Date(Date.parse(decidedAt) + 3_600_000).toISOString();
        settlementDocs.push({
          _id: settlementId,
          tenantId: tenant._id,
          ...terms,
          createdAt: finalizedAt,
        });
        facts.push({
          _id: `${settlementId}:decision`,
          settlementId,
          kind: 'decision',
          data: {
            verdict: pass ? 'pass' : 'fail',
            reason: pass ? null : 'TERMS_NOT_MET',
            releaseNow: pass ? 1_000 : 0,
            holdback: 0,
            decidedAt,
            disputeWindowEndsAt,
            receipt,
          },
          at: new Date(decidedAt),
        });
        report.finalizedRuns++;
      }
      runs.push(run);
      report.events += events.length;
      if (report.sampleRunIds.length < 2_000 && random() < 4_000 / options.runs) report.sampleRunIds.push(runId);
    }
    report.batchDocuments += batches.length;
    buildMs += performance.now() - t0;
    return { runs, batches, heads, artifacts, settlementDocs, facts };
  };

  const insertChunk = async (docs: ReturnType<typeof buildChunk>) => {
    const unordered = { ordered: false } as const;
    const many = <T>(insert: (d: T[], o: typeof unordered) => Promise<unknown>, d: T[]) =>
      d.length ? insert(d, unordered) : Promise.resolve();
    await Promise.all([
      many((d, o) => runStore.runs.insertMany(d, o), docs.runs),
      many((d, o) => runStore.batches.insertMany(d, o), docs.batches),
      many((d, o) => runStore.heads.insertMany(d, o), docs.heads),
      many((d, o) => runStore.artifacts.insertMany(d, o), docs.artifacts),
      many((d, o) => settlements.settlements.insertMany(d, o), docs.settlementDocs),
      many((d, o) => settlements.facts.insertMany(d, o), docs.facts),
    ]);
  };

  // Build chunk k while chunk k-1 is being inserted.
  let pending: Promise<void> = Promise.resolve();
  let lastLog = Date.now();
  for (let from = 0; from < options.runs; from += options.chunkRuns) {
    const docs = buildChunk(from, Math.min(options.runs, from + options.chunkRuns));
    await pending;
    pending = insertChunk(docs);
    if (Date.now() - lastLog > 10_000) {
      lastLog = Date.now();
      log(`seeded ${from} runs, ${report.events} events (${((performance.now() - started) / 1000).toFixed(0)} s)`);
    }
  }
  await pending;
  report.seconds = Number(((performance.now() - started) / 1000).toFixed(1));
  report.buildSeconds = Number((buildMs / 1000).toFixed(1));
  return report;
}
