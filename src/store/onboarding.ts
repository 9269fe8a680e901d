import type { Collection, Db } from 'mongodb';
import { insertFirst } from './mongo.ts';

/** What the smoke test's MCP session saw (no secret: the API key is never part of it). */
export interface SmokeTestOutcome {
  passed: boolean;
  /** The step that failed: spawn, initialize, tools/list, tools/call or timeout. */
  failedStep: string | null;
  serverInfo: { name: string; version: string } | null;
  toolNames: string[];
  call: { tool: string; isError: boolean; result: unknown } | null;
  error: { message: string; details: Record<string, unknown> } | null;
  durationMs: number;
}

export interface SmokeTestDoc {
  _id: string;
  tenantId: string;
  outcome: SmokeTestOutcome;
  /** The MCP server's process id, kept for diagnosis (and for tests proving it is gone); never shown to clients. */
  pid: number | null;
  createdAt: Date;
}

export interface PaidCallStep {
  step: string;
  ok: boolean;
  ms: number;
  status?: number;
  code?: string;
}

export interface PaidCallAttemptDoc {
  _id: string;
  tenantId: string;
  seq: number;
  sponsorWalletId: string | null;
  createdAt: Date;
  /** The last failed run of this attempt (a cache: the attempt may be run again and pass). */
  lastFailure: { step: string; steps: PaidCallStep[]; at: Date; status: number | null; code: string } | null;
}

export interface PaidCallResultDoc {
  _id: string;
  tenantId: string;
  result: 'passed' | 'degraded';
  ids: Record<string, string | null>;
  steps: PaidCallStep[];
  checks: Record<string, boolean>;
  finishedAt: Date;
}

/** `<tenantId>#<seq>`: one per attempt, so a tenant's history is read newest first by `_id` lookups alone. */
interface PaidCallIndexDoc {
  _id: string;
  tenantId: string;
  seq: number;
  attemptId: string;
}

interface HeadDoc {
  _id: string;
  seq: number;
}

const SEQ_DIGITS = 12;

export function paidCallIndexId(tenantId: string, seq: number): string {
  return `${tenantId}#${String(seq).padStart(SEQ_DIGITS, '0')}`;
}

/** Onboarding records: smoke test outcomes and first paid call attempts, every lookup by `_id`. */
export class OnboardingStore {
  private readonly smokeTests: Collection<SmokeTestDoc>;
  private readonly attempts: Collection<PaidCallAttemptDoc>;
  private readonly results: Collection<PaidCallResultDoc>;
  private readonly index: Collection<PaidCallIndexDoc>;
  private readonly heads: Collection<HeadDoc>;

  constructor(db: Db) {
    this.smokeTests = db.collection<SmokeTestDoc>('onboarding_smoke_tests');
    this.attempts = db.collection<PaidCallAttemptDoc>('onboarding_paid_calls');
    this.results = db.collection<PaidCallResultDoc>('onboarding_paid_call_results');
    this.index = db.collection<PaidCallIndexDoc>('onboarding_paid_call_index');
    this.heads = db.collection<HeadDoc>('onboarding_paid_call_heads');
  }

  /** Records a smoke test's outcome once; a repeated job finds the first one. */
  async recordSmokeTest(doc: SmokeTestDoc): Promise<SmokeTestDoc> {
    if (await insertFirst(this.smokeTests, doc)) return doc;
    return (await this.smokeTest(doc._id))!;
  }

  smokeTest(smokeTestId: string): Promise<SmokeTestDoc | null> {
    return this.smokeTests.findOne({ _id: smokeTestId });
  }

  attempt(attemptId: string): Promise<PaidCallAttemptDoc | null> {
    return this.attempts.findOne({ _id: attemptId });
  }

  result(attemptId: string): Promise<PaidCallResultDoc | null> {
    return this.results.findOne({ _id: attemptId });
  }

  /** The highest claimed sequence of a tenant: the head cache, then forward while the next slot is taken. */
  private async lastSeq(tenantId: string): Promise<number> {
    let seq = (await this.heads.findOne({ _id: tenantId }))?.seq ?? 0;
    while (await this.index.findOne({ _id: paidCallIndexId(tenantId, seq + 1) })) seq++;
    return seq;
  }

  /**
   * Starts an attempt, or returns the one already started under this id. Its history slot is claimed by unique
   * insert (two starts can never share one); the attempt record goes in first, so a crash in between leaves an
   * attempt that the next start with the same id finishes indexing.
   */
  async startAttempt(input: {
    attemptId: string;
    tenantId: string;
    sponsorWalletId: string | null;
  }): Promise<PaidCallAttemptDoc> {
    const existing = await this.attempt(input.attemptId);
    if (existing && existing.seq > 0) return existing;
    const attempt: PaidCallAttemptDoc = existing ?? {
      _id: input.attemptId,
      tenantId: input.tenantId,
      seq: 0,
      sponsorWalletId: input.sponsorWalletId,
      createdAt: new Date(),
      lastFailure: null,
    };
    if (!existing && !(await insertFirst(this.attempts, attempt))) return (await this.attempt(input.attemptId))!; // started concurrently
    let seq = await this.lastSeq(input.tenantId);
    for (;;) {
      seq++;
      if (
        await insertFirst(this.index, {
          _id: paidCallIndexId(input.tenantId, seq),
          tenantId: input.tenantId,
          seq,
          attemptId: input.attemptId,
        })
      )
        break;
    }
    await this.attempts.updateOne({ _id: input.attemptId }, { $set: { seq } }); // cache of the claimed slot
    await this.heads.updateOne({ _id: input.tenantId }, { $max: { seq } }, { upsert: true }).catch(() => undefined); // a hint only
    return { ...attempt, seq };
  }

  async recordFailure(attemptId: string, failure: NonNullable<PaidCallAttemptDoc['lastFailure']>): Promise<void> {
    await this.attempts.updateOne({ _id: attemptId }, { $set: { lastFailure: failure } });
  }

  /** The first finished result of an attempt stands. */
  async recordResult(doc: PaidCallResultDoc): Promise<PaidCallResultDoc> {
    if (await insertFirst(this.results, doc)) return doc;
    return (await this.result(doc._id))!;
  }

  /** A page of a tenant's attempts, newest first, below sequence `before` (exclusive; null = from the newest). */
  async history(
    tenantId: string,
    limit: number,
    before: number | null,
  ): Promise<{
    items: Array<{ seq: number; attempt: PaidCallAttemptDoc; result: PaidCallResultDoc | null }>;
    nextBefore: number | null;
  }> {
    const top = before === null ? await this.lastSeq(tenantId) : before - 1;
    const seqs = Array.from({ length: Math.max(0, Math.min(limit, top)) }, (_, i) => top - i);
    const slots = await Promise.all(seqs.map((seq) => this.index.findOne({ _id: paidCallIndexId(tenantId, seq) })));
    const items = await Promise.all(
      slots
        .filter((slot): slot is PaidCallIndexDoc => slot !== null)
        .map(async (slot) => {
          const [attempt, result] = await Promise.all([this.attempt(slot.attemptId), this.result(slot.attemptId)]);
          return { seq: slot.seq, attempt: attempt!, result };
        }),
    );
    const lowest = seqs.at(-1);
    // A crash between claiming a slot and caching it can leave an attempt with two slots; it is listed at the cached one.
    const listed = items.filter((i) => i.attempt && (i.attempt.seq === 0 || i.attempt.seq === i.seq));
    return { items: listed, nextBefore: lowest !== undefined && lowest > 1 ? lowest : null };
  }
}
