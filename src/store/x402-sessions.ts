import type { Collection, Db } from 'mongodb';
import { recorded } from '../domain/money.ts';
import type { PriceSchedule } from '../domain/pricing.ts';
import type { SignedStatement, StatementChunk } from '../domain/x402-sessions.ts';
import type { UsageSignature, WitnessedUsage } from '../domain/usage.ts';
import type { RedisClient } from '../redis.ts';
import { DueWorkStore, type DuePartitions } from './due-work.ts';
import { ListIndex } from './list-index.ts';
import { insertFirst } from './mongo.ts';

// Payment sessions: a budget reserved once, spent by many calls, settled at close.
//
// Where each fact lives, and why it is still exactly-once without transactions:
// - The session (its terms) is written once, by unique insert; its fate (closed, expired, wound down) is the unique
//   insert of its close record, which every path that ends a session races through.
// - The running budget is a Redis hash, debited by one Lua script per call: the one place where concurrent calls are
//   put in order, so they can never spend a unit more than the budget. The script numbers each debit (`seq`) and
//   remembers its payment id, so a retried call finds its first debit instead of making a second.
// - Each debit becomes a charge by the unique insert of `<sessionId>#<seq>` in MongoDB. A close first stops the
//   script from debiting, then races a `void` insert for every number it handed out whose charge is not recorded:
//   a call that crashed between its debit and its insert is voided (it never answered, so nothing was served), and
//   a call still in flight either lands first (charged) or finds the void and is refused. The close thus reads a
//   final list of charges, and the statement it signs is the same whoever computes it.
// Redis runs with an append-only file (scripts/services.sh): a Redis that loses a session's hash is rebuilt from
// the charges when the session's first charge (`#1`) exists, else started afresh (nothing was charged).
// - Two caches derived from the charges, each written once by unique insert and never updated, so that a close costs
//   the calls of other sessions nothing: statement chunks (every 256 seqs of an open session, summed up in the
//   background once all of them are decided; the close reads one chunk instead of 256 charges) and, once closed, the
//   payment index (payment id -> seq), which answers a call retried after the close in place of the Redis record of
//   its payment id: Redis keeps nothing per charge of a closed session.

export interface SessionDoc {
  _id: string;
  tenantId: string;
  payerAgentId: string;
  /** The payees the session may pay, in the order given (a payee's index names its settlement). */
  payeeAgentIds: string[];
  /** The wallet the budget is reserved from: the payer's own, or the sponsor wallet that pays for it. */
  walletId: string;
  sponsorWalletId: string | null;
  currency: string;
  budget: number;
  maxPerCall: number;
  holdbackBps: number;
  disputeWindowSeconds: number;
  expiresAt: Date;
  createdAt: Date;
  /** A session priced by use: its schedule and the schedule's hash (absent or null: charges name amounts). */
  pricing?: PriceSchedule | null;
  pricingSha256?: string | null;
  /** Pay a payee at close only for usage its payer acknowledged (absent: false). */
  requireAcknowledgedUsage?: boolean;
}

export interface ChargeDoc {
  /** `<sessionId>#<seq>`: the seq the budget script handed out. */
  _id: string;
  sessionId: string;
  seq: number;
  /** `void`: the debit was never recorded as a charge (its call crashed, or a close got there first). */
  state: 'charged' | 'void';
  paymentId: string | null;
  payeeAgentId: string | null;
  amount: number;
  requestSha256: string | null;
  at: Date;
  receipt: { receiptHash: string; signature: { alg: 'Ed25519'; keyId: string; value: string } } | null;
  /** A charge priced from witnessed usage: the record and its signatures as charged (the payer's if sent with it). */
  usage?: WitnessedUsage | null;
}

/**
 * Whether the payer acknowledged a charge's usage, decided once by unique insert of `<sessionId>#<seq>`: the payer's
 * acknowledgement (its signature) or the close's mark that none came (`payerSignature: null`), whichever is first.
 * A fact, never updated; the statement reads it.
 */
export interface UsageAckDoc {
  _id: string;
  sessionId: string;
  seq: number;
  paymentId: string;
  payerSignature: UsageSignature | null;
  at: Date;
}

/** A statement chunk (see StatementChunk): `<sessionId>#<chunk>`, chunk 0 holding seqs 1..256. */
export interface StatementChunkDoc extends StatementChunk {
  _id: string;
  sessionId: string;
  chunk: number;
}

/**
 * One bucket of a closed session's payment index, `<sessionId>#<bucket>`: the payment ids its statement charged, with
 * their seqs side by side, and those the budget had seen that it did not charge (a hold or debit the close voided).
 */
export interface PaymentBucketDoc {
  _id: string;
  sessionId: string;
  paymentIds: string[];
  seqs: number[];
  refused: string[];
}

export type CloseReason = 'closed' | 'expired' | 'wound_down';

/** A session's fate, recorded once: why and when it ended, and the statement of everything it paid. */
export interface CloseDoc {
  _id: string;
  tenantId: string;
  reason: CloseReason;
  /** The wound-down agent, when that ended it. */
  woundDownAgentId: string | null;
  at: Date;
  statement: SignedStatement;
}

/**
 * A debit as the budget script remembers it under its payment id: `charge` (a charge of `amount`) or `hold` (up to
 * `amount` held by a facilitator verify, captured at its settle for what the call cost). A hold is bound to what was
 * verified: the payee (its index in the session's payee list) and the request hash; its capture must name the same.
 */
export interface Debit {
  seq: number;
  amount: number;
  mode: 'charge' | 'hold';
  binding?: HoldBinding;
}

export interface HoldBinding {
  payeeIndex: number;
  requestSha256: string | null;
}

/** What the budget script says of a debit. */
export type DebitResult =
  | ({ kind: 'new'; remaining: number } & Debit)
  | ({ kind: 'repeat' } & Debit)
  | { kind: 'closed' }
  | { kind: 'expired' }
  | { kind: 'budget'; remaining: number }
  | { kind: 'missing' };

/**
 * What the capture script says: the hold now charged for less (or as much), a repeat, more than was held, a capture
 * for another payee or request than the hold was verified for (`mismatch`), or no such hold.
 */
export type CaptureResult = ({ kind: 'captured' | 'repeat' | 'over' | 'mismatch' } & Debit) | { kind: 'unknown' };

/** What a budget repair did (see X402SessionStore.repairBudget). */
export interface RepairResult {
  /** The budget was not in Redis (nothing repaired: rebuild it instead). */
  missing: boolean;
  /** The seq Redis had handed out before, and after. */
  seqBefore: number;
  seqAfter: number;
  spentBefore: number;
  spentAfter: number;
  /** Payment ids whose debit Redis had numbered with a seq a recorded charge of another payment holds. */
  dropped: number;
}

export interface BudgetState {
  state: 'open' | 'closed';
  budget: number;
  spent: number;
  seq: number;
}

/**
 * Debits a call once: a payment id seen before answers its first debit; nothing is debited past the budget. Values
 * are `seq:amount:c` (a charge) or `seq:amount:h:<payee index>:<request sha256 or ->` (a hold and what it is bound to).
 */
const DEBIT = `
local prior = redis.call('HGET', KEYS[2], ARGV[1])
if prior then return {'repeat', prior} end
local s = redis.call('HMGET', KEYS[1], 'state', 'budget', 'spent', 'exp')
if not s[1] then return {'missing'} end
if s[1] ~= 'open' then return {'closed'} end
if tonumber(ARGV[3]) >= tonumber(s[4]) then return {'expired'} end
local amount = tonumber(ARGV[2])
local remaining = tonumber(s[2]) - tonumber(s[3])
if amount > remaining then return {'budget', tostring(remaining)} end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HINCRBY', KEYS[1], 'spent', amount)
local value = seq .. ':' .. amount .. ':' .. ARGV[4]
redis.call('HSET', KEYS[2], ARGV[1], value)
return {'new', value, tostring(remaining - amount)}
`;

/**
 * Puts a session's budget right against its recorded charges (MongoDB, the record) after Redis lost its last writes
 * (a replica promoted behind its primary, an append-only file cut short): every recorded charge is remembered under
 * its payment id, a payment id Redis numbered with a seq that a recorded charge of another payment holds is dropped
 * (its call re-debits under a fresh seq), the seq counter is lifted past every recorded charge, and `spent` becomes
 * what was recorded plus every debit still in flight (never less than was charged: a repair may only shrink what
 * is left). ARGV: highest recorded seq, then seq, payment id and amount of each recorded charge.
 */
const REPAIR = `
local s = redis.call('HMGET', KEYS[1], 'state', 'seq', 'spent')
if not s[1] then return {'missing'} end
local recorded = {}
local spent = 0
for i = 2, #ARGV, 3 do
  local seq, pid, amount = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  recorded[seq] = pid
  spent = spent + amount
  redis.call('HSET', KEYS[2], pid, seq .. ':' .. amount .. ':c')
end
local dropped = 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local pid, value = all[i], all[i + 1]
  local seq, amount = string.match(value, '^(%d+):(%d+):')
  local owner = recorded[seq]
  if owner == nil then
    spent = spent + tonumber(amount)
  elseif owner ~= pid then
    redis.call('HDEL', KEYS[2], pid)
    dropped = dropped + 1
  end
end
local seqAfter = math.max(tonumber(s[2]), tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'seq', seqAfter, 'spent', spent)
return {'repaired', s[2], tostring(seqAfter), s[3], tostring(spent), tostring(dropped)}
`;

/**
 * Turns a hold into a charge of at most what it held, once, for the payee and request it was verified for; what it
 * held beyond that goes back to the budget.
 */
const CAPTURE = `
local prior = redis.call('HGET', KEYS[2], ARGV[1])
if not prior then return {'unknown'} end
local seq, held, mode, binding = string.match(prior, '^(%d+):(%d+):(%a):?(.*)$')
if mode == 'c' then return {'repeat', prior} end
if binding ~= ARGV[3] then return {'mismatch', prior} end
local amount = tonumber(ARGV[2])
if amount > tonumber(held) then return {'over', prior} end
local value = seq .. ':' .. amount .. ':c'
redis.call('HSET', KEYS[2], ARGV[1], value)
redis.call('HINCRBY', KEYS[1], 'spent', amount - tonumber(held))
return {'captured', value}
`;

function parseDebit(value: string): Debit {
  const [seq, amount, mode, payeeIndex, requestSha256] = value.split(':') as [string, string, string, string?, string?];
  if (mode !== 'h') return { seq: Number(seq), amount: Number(amount), mode: 'charge' };
  const binding =
    payeeIndex === undefined
      ? undefined
      : {
          payeeIndex: Number(payeeIndex),
          requestSha256: !requestSha256 || requestSha256 === '-' ? null : requestSha256,
        };
  return { seq: Number(seq), amount: Number(amount), mode: 'hold', ...(binding ? { binding } : {}) };
}

/** A hold's binding as the scripts store and compare it. */
function bindingValue(binding: HoldBinding): string {
  return `${binding.payeeIndex}:${binding.requestSha256 ?? '-'}`;
}

/** Starts a session's budget unless it exists (a rebuild racing a charge never resets what was spent). */
const INIT = `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'budget', ARGV[2], 'spent', ARGV[3], 'seq', ARGV[4], 'exp', ARGV[5])
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return 1
`;

/** Stops all debits and answers how many seqs were handed out (every one of them is then decided by the close). */
const STOP = `
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HSET', KEYS[1], 'state', 'closed')
return tonumber(redis.call('HGET', KEYS[1], 'seq'))
`;

/** Charges read at once when a close reads a session's whole list. */
const READ_BATCH = 64;
/** How long a closed session's budget (its state, a few fields) keeps refusing calls in Redis before it goes. */
const CLOSED_BUDGET_TTL_SECONDS = 7 * 86_400;

export function chargeId(sessionId: string, seq: number): string {
  return `${sessionId}#${seq}`;
}

export class X402SessionStore {
  readonly sessions: Collection<SessionDoc>;
  readonly charges: Collection<ChargeDoc>;
  readonly closes: Collection<CloseDoc>;
  readonly chunks: Collection<StatementChunkDoc>;
  readonly paymentIndex: Collection<PaymentBucketDoc>;
  readonly usageAcks: Collection<UsageAckDoc>;
  /** Sessions with work to come: their expiry, or a close to finish (see DueWorkStore). */
  readonly due: DueWorkStore;
  /** Terms never change: a session seen once is served from memory. */
  private readonly known = new Map<string, SessionDoc>();
  /** The session list (see list-index.ts): a session is entered before it is stored. */
  readonly listed: ListIndex;

  constructor(
    db: Db,
    private readonly redis: RedisClient,
    private readonly redisPrefix: string,
    listed: ListIndex,
    partitions?: DuePartitions,
  ) {
    this.listed = listed;
    this.sessions = db.collection<SessionDoc>('x402_sessions');
    this.charges = db.collection<ChargeDoc>('x402_session_charges');
    this.closes = db.collection<CloseDoc>('x402_session_closes');
    this.chunks = db.collection<StatementChunkDoc>('x402_session_statement_chunks');
    this.paymentIndex = db.collection<PaymentBucketDoc>('x402_session_payment_index');
    this.usageAcks = db.collection<UsageAckDoc>('x402_session_usage_acks');
    this.due = new DueWorkStore(db, 'x402_sessions', redis, redisPrefix, { partitions });
  }

  private keys(sessionId: string): [string, string] {
    // One hash tag: both keys live in one Redis Cluster slot, as the scripts need.
    const tag = `${this.redisPrefix}:{ses:${sessionId}}`;
    return [`${tag}:budget`, `${tag}:payments`];
  }

  /** Records a session once; a repeat (same id) gets the first one back with `created` false. */
  async record(doc: SessionDoc): Promise<{ session: SessionDoc; created: boolean }> {
    await this.listed.add({
      kind: 'sessions',
      id: doc._id,
      tenantId: doc.tenantId,
      at: doc.createdAt,
      agentIds: [doc.payerAgentId, ...doc.payeeAgentIds],
    });
    if (await insertFirst(this.sessions, doc)) return { session: doc, created: true };
    return { session: recorded(await this.get(doc._id), `session ${doc._id}`), created: false };
  }

  async get(sessionId: string): Promise<SessionDoc | null> {
    const known = this.known.get(sessionId);
    if (known) return known;
    const doc = await this.sessions.findOne({ _id: sessionId });
    if (doc) this.remember(doc);
    return doc;
  }

  /** The session as MongoDB holds it now, never from memory (the ledger audit must see a refused session gone). */
  storedSession(sessionId: string): Promise<SessionDoc | null> {
    return this.sessions.findOne({ _id: sessionId });
  }

  remember(doc: SessionDoc): void {
    if (this.known.size > 100_000) this.known.clear();
    this.known.set(doc._id, doc);
  }

  /** A session whose funding was refused never held money: it goes (nothing points at it but its due record). */
  async removeRefused(sessionId: string): Promise<void> {
    this.known.delete(sessionId);
    await this.sessions.deleteOne({ _id: sessionId });
    await this.due.done(sessionId);
  }

  /** Debits `amount` under `paymentId`: a charge, or a hold bound to `binding` (what its verify was for). */
  async debit(
    sessionId: string,
    paymentId: string,
    amount: number,
    mode: Debit['mode'],
    now: Date,
    binding?: HoldBinding,
  ): Promise<DebitResult> {
    const [budget, payments] = this.keys(sessionId);
    const tag = mode === 'hold' ? `h:${bindingValue(binding ?? { payeeIndex: 0, requestSha256: null })}` : 'c';
    const answer = (await this.redis.eval(
      DEBIT,
      2,
      budget,
      payments,
      paymentId,
      String(amount),
      String(now.getTime()),
      tag,
    )) as string[];
    const [kind, value, remaining] = answer as [string, string | undefined, string | undefined];
    if (kind === 'new') return { kind, ...parseDebit(value!), remaining: Number(remaining) };
    if (kind === 'repeat') return { kind, ...parseDebit(value!) };
    if (kind === 'budget') return { kind, remaining: Number(value) };
    return { kind: kind as 'closed' | 'expired' | 'missing' };
  }

  async capture(sessionId: string, paymentId: string, amount: number, binding: HoldBinding): Promise<CaptureResult> {
    const [budget, payments] = this.keys(sessionId);
    const [kind, value] = (await this.redis.eval(
      CAPTURE,
      2,
      budget,
      payments,
      paymentId,
      String(amount),
      bindingValue(binding),
    )) as [string, string | undefined];
    return kind === 'unknown'
      ? { kind }
      : { kind: kind as 'captured' | 'repeat' | 'over' | 'mismatch', ...parseDebit(value!) };
  }

  /** See REPAIR: `recorded` are the session's recorded charges (state `charged`). */
  async repairBudget(sessionId: string, recorded: ChargeDoc[]): Promise<RepairResult> {
    const [budget, payments] = this.keys(sessionId);
    const highest = Math.max(0, ...recorded.map((c) => c.seq));
    const args = recorded.flatMap((c) => [String(c.seq), c.paymentId ?? '', String(c.amount)]);
    const answer = (await this.redis.eval(REPAIR, 2, budget, payments, String(highest), ...args)) as string[];
    if (answer[0] === 'missing')
      return { missing: true, seqBefore: 0, seqAfter: 0, spentBefore: 0, spentAfter: 0, dropped: 0 };
    const [, seqBefore, seqAfter, spentBefore, spentAfter, dropped] = answer.map(Number) as [
      number,
      number,
      number,
      number,
      number,
      number,
    ];
    return { missing: false, seqBefore, seqAfter, spentBefore, spentAfter, dropped };
  }

  /** The debit a payment id holds in the session's budget, or null when the budget never saw it. */
  async debitOf(sessionId: string, paymentId: string): Promise<Debit | null> {
    const [, payments] = this.keys(sessionId);
    const value = await this.redis.hget(payments, paymentId);
    return value ? parseDebit(value) : null;
  }

  /** Every payment id the budget has a debit of, a few hundred per Redis command (never one long command). */
  async debitedPaymentIds(sessionId: string): Promise<string[]> {
    const [, payments] = this.keys(sessionId);
    const ids: string[] = [];
    let cursor = '0';
    do {
      const [next, page] = await this.redis.hscan(payments, cursor, 'COUNT', 500);
      for (let i = 0; i < page.length; i += 2) ids.push(page[i]!);
      cursor = next;
    } while (cursor !== '0');
    return ids;
  }

  /** Starts the budget (or rebuilds it after Redis lost it) unless it is there; `payments` maps payment ids to seq:amount:c. */
  async initBudget(
    sessionId: string,
    s: BudgetState & { expiresAt: Date },
    payments: Array<[string, string]> = [],
  ): Promise<void> {
    const [budget, paymentsKey] = this.keys(sessionId);
    await this.redis.eval(
      INIT,
      2,
      budget,
      paymentsKey,
      s.state,
      String(s.budget),
      String(s.spent),
      String(s.seq),
      String(s.expiresAt.getTime()),
      ...payments.flat(),
    );
  }

  async budgetState(sessionId: string): Promise<BudgetState | null> {
    const [budget] = this.keys(sessionId);
    const [state, total, spent, seq] = await this.redis.hmget(budget, 'state', 'budget', 'spent', 'seq');
    if (state === null) return null;
    return { state: state as BudgetState['state'], budget: Number(total), spent: Number(spent), seq: Number(seq) };
  }

  /** Stops debits for good; answers the last seq handed out, or null when the budget is not in Redis (rebuild first). */
  async stopDebits(sessionId: string): Promise<number | null> {
    const [budget] = this.keys(sessionId);
    const seq = Number(await this.redis.eval(STOP, 1, budget));
    return seq < 0 ? null : seq;
  }

  /**
   * A closed session's budget: its payment records go (the payment index in MongoDB answers a retried call), its
   * state (closed: debits refused in one script) stays a while, then goes too.
   */
  async retireBudget(sessionId: string): Promise<void> {
    const [budget, payments] = this.keys(sessionId);
    // UNLINK: a hash of many payments is freed off Redis' main thread.
    await this.redis.pipeline().unlink(payments).expire(budget, CLOSED_BUDGET_TTL_SECONDS).exec();
  }

  /** Records a debit as a charge, or as void: the unique insert decides; answers the charge that holds the seq. */
  async recordCharge(doc: ChargeDoc): Promise<ChargeDoc> {
    if (await insertFirst(this.charges, doc)) return doc;
    return recorded(await this.charges.findOne({ _id: doc._id }), `session charge ${doc._id}`);
  }

  /** Decides a seq as void (no charge), unless a charge holds it already: answers what holds the seq. */
  recordVoid(sessionId: string, seq: number, at: Date): Promise<ChargeDoc> {
    return this.recordCharge({
      _id: chargeId(sessionId, seq),
      sessionId,
      seq,
      state: 'void',
      paymentId: null,
      payeeAgentId: null,
      amount: 0,
      requestSha256: null,
      at,
      receipt: null,
    });
  }

  /**
   * Decides whether a charge's usage is acknowledged, once: the payer's acknowledgement and the close's mark of it as
   * unacknowledged (`payerSignature: null`) race by the unique insert of `<sessionId>#<seq>`, as a charge and a void
   * race for a seq. Answers the record that holds it.
   */
  async decideAck(doc: UsageAckDoc): Promise<UsageAckDoc> {
    if (await insertFirst(this.usageAcks, doc)) return doc;
    return recorded(await this.usageAcks.findOne({ _id: doc._id }), `usage acknowledgement ${doc._id}`);
  }

  getAck(sessionId: string, seq: number): Promise<UsageAckDoc | null> {
    return this.usageAcks.findOne({ _id: chargeId(sessionId, seq) });
  }

  getCharge(sessionId: string, seq: number): Promise<ChargeDoc | null> {
    return this.charges.findOne({ _id: chargeId(sessionId, seq) });
  }

  /** Charges 1..lastSeq by `_id`, in order; a missing one is null. */
  chargesThrough(sessionId: string, lastSeq: number): Promise<Array<ChargeDoc | null>> {
    return this.chargesBetween(sessionId, 1, lastSeq);
  }

  /** Charges from..to by `_id`, in order, `batch` reads at a time; a missing one is null. */
  async chargesBetween(
    sessionId: string,
    from: number,
    to: number,
    batch = READ_BATCH,
  ): Promise<Array<ChargeDoc | null>> {
    const found: Array<ChargeDoc | null> = [];
    for (let first = from; first <= to; first += batch) {
      const seqs = Array.from({ length: Math.min(batch, to - first + 1) }, (_, i) => first + i);
      found.push(...(await Promise.all(seqs.map((seq) => this.getCharge(sessionId, seq)))));
    }
    return found;
  }

  getChunk(sessionId: string, chunk: number): Promise<StatementChunkDoc | null> {
    return this.chunks.findOne({ _id: `${sessionId}#${chunk}` });
  }

  /** Records a chunk once (any two are the same: both are made from the same charges). */
  async recordChunk(sessionId: string, chunk: number, summary: StatementChunk): Promise<void> {
    await insertFirst(this.chunks, { _id: `${sessionId}#${chunk}`, sessionId, chunk, ...summary });
  }

  getPaymentBucket(sessionId: string, bucket: number): Promise<PaymentBucketDoc | null> {
    return this.paymentIndex.findOne({ _id: `${sessionId}#${bucket}` });
  }

  /** Records a closed session's payment index, each bucket once (a second writer's buckets are the same). */
  async recordPaymentIndex(
    sessionId: string,
    buckets: Array<{ paymentIds: string[]; seqs: number[]; refused: string[] }>,
  ): Promise<void> {
    await Promise.all(
      buckets.map((b, i) => insertFirst(this.paymentIndex, { _id: `${sessionId}#${i}`, sessionId, ...b })),
    );
  }

  /**
   * Charges recorded past `lastSeq` (by `_id`, a batch at a time, until a batch finds none): after Redis lost its last
   * writes, the seqs it handed out before are recorded above the seq it now holds. Answers seqs lastSeq+1 up to the
   * highest one found (a missing one is null): empty when Redis' seq is the truth, as it is but after a rollback. A
   * smaller batch is a cheaper look (the ledger audit's), which a gap of that many unrecorded seqs can fool.
   */
  async chargesBeyond(sessionId: string, lastSeq: number, batchSize = READ_BATCH): Promise<Array<ChargeDoc | null>> {
    const found: Array<ChargeDoc | null> = [];
    for (let from = lastSeq + 1; ; from += batchSize) {
      const batch = await Promise.all(Array.from({ length: batchSize }, (_, i) => this.getCharge(sessionId, from + i)));
      if (batch.every((c) => c === null)) break;
      found.push(...batch);
    }
    while (found.length > 0 && found[found.length - 1] === null) found.pop();
    return found;
  }

  /**
   * Every charge of a session, read by its `sessionId` (a scan of the collection on FerretDB): only when Redis lost
   * an open session's budget, never on a hot path.
   */
  allCharges(sessionId: string): Promise<ChargeDoc[]> {
    return this.charges.find({ sessionId }).toArray();
  }

  /** Records the session's fate once; answers the fate that holds it (this one, or the first). */
  async recordClose(doc: CloseDoc): Promise<{ close: CloseDoc; won: boolean }> {
    if (await insertFirst(this.closes, doc)) return { close: doc, won: true };
    return { close: recorded(await this.closes.findOne({ _id: doc._id }), `session close ${doc._id}`), won: false };
  }

  closeOf(sessionId: string): Promise<CloseDoc | null> {
    return this.closes.findOne({ _id: sessionId });
  }
}
