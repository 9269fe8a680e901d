import { describe, expect, it } from 'vitest';
import {
  escalationIdFor,
  evaluateDailyLimit,
  evaluateStaticPolicy,
  paymentRequiredHeader,
  paymentStatusWord,
  paymentRequirements,
  quoteSha256,
  settleAnswerWord,
  utcDay,
  verifyVerdict,
  X402_SCHEME,
  type WalletPolicy,
} from '../../src/domain/x402.ts';

const open: WalletPolicy = {
  currency: 'USD',
  perCallLimit: null,
  dailyLimit: null,
  allowedPayeeAgentIds: null,
  allowedToolIds: null,
};
const call = { amount: 100, currency: 'USD', payeeAgentId: 'ns:agent:payee', toolId: 'search' as string | null };

describe('x402 domain rules', () => {
  it('evaluates each static rule and fails closed on empty or unmatched lists', () => {
    expect(evaluateStaticPolicy(open, call)).toBeNull();
    expect(evaluateStaticPolicy({ ...open, currency: 'EUR' }, call)?.rule).toBe('currency');
    expect(evaluateStaticPolicy({ ...open, perCallLimit: 100 }, call)).toBeNull();
    expect(evaluateStaticPolicy({ ...open, perCallLimit: 99 }, call)).toMatchObject({
      rule: 'perCallLimit',
      limit: 99,
      amount: 100,
    });
    expect(evaluateStaticPolicy({ ...open, allowedPayeeAgentIds: [] }, call)?.rule).toBe('allowedPayeeAgentIds');
    expect(evaluateStaticPolicy({ ...open, allowedToolIds: ['search'] }, { ...call, toolId: null })?.rule).toBe(
      'allowedToolIds',
    );
    expect(evaluateStaticPolicy({ ...open, allowedToolIds: ['search'] }, call)).toBeNull();
  });

  it('lets the daily total reach the limit, never pass it', () => {
    const policy = { ...open, dailyLimit: 1_000 };
    expect(evaluateDailyLimit(policy, 900, 100)).toBeNull();
    expect(evaluateDailyLimit(policy, 901, 100)).toMatchObject({ rule: 'dailyLimit', spentToday: 901, limit: 1_000 });
    expect(evaluateDailyLimit(open, Number.MAX_SAFE_INTEGER - 1, 1)).toBeNull();
    expect(utcDay(new Date('2025-03-01T23:59:59.999Z'))).toBe('2025-03-01');
  });

  it('builds x402 v2 requirements and a PAYMENT-REQUIRED header that decodes to them', () => {
    const q = {
      gateId: 'gate_a',
      quoteId: 'quo_b',
      requestSha256: 'ab'.repeat(32),
      amount: 2 ** 53 - 1,
      currency: 'USDC',
      payeeAgentId: 'ns:agent:p',
      expiresAt: '2030-01-01T00:00:00.000Z',
    };
    const req = paymentRequirements(q, 'agent-settlement:test', 60);
    expect(req).toEqual({
      scheme: X402_SCHEME,
      network: 'agent-settlement:test',
      asset: 'USDC',
      amount: '9007199254740991',
      payTo: 'ns:agent:p',
      maxTimeoutSeconds: 60,
      extra: { gateId: 'gate_a', quoteId: 'quo_b', requestSha256: q.requestSha256 },
    });
    const decoded = JSON.parse(
      Buffer.from(paymentRequiredHeader(req, { url: 'https://x/y' }), 'base64').toString('utf8'),
    );
    expect(decoded).toEqual({ x402Version: 2, resource: { url: 'https://x/y' }, accepts: [req] });
    expect(quoteSha256(q)).toMatch(/^[0-9a-f]{64}$/);
    expect(quoteSha256({ ...q, amount: 1 })).not.toBe(quoteSha256(q));
  });

  it('derives one escalation per gate and quote, and the verify verdict from authorization and report', () => {
    expect(escalationIdFor('gate_a', 'quo_b')).toBe(escalationIdFor('gate_a', 'quo_b'));
    expect(escalationIdFor('gate_a', 'quo_c')).not.toBe(escalationIdFor('gate_a', 'quo_b'));
    expect(verifyVerdict(true, 'verified')).toBe('pass');
    expect(verifyVerdict(true, 'failed')).toBe('fail');
    expect(verifyVerdict(false, 'failed')).toBe('fail');
    expect(verifyVerdict(false, 'verified')).toBe('fail');
  });
  it("says settlement outcomes in x402's words: only settled and failed are final, a pending or unseen payment is unresolved", () => {
    expect(settleAnswerWord(true, undefined)).toBe('settled');
    expect(settleAnswerWord(false, 'settlement_pending')).toBe('unresolved');
    for (const reason of ['verification_failed', 'invalid_network', 'authorization_expired', 'session_closed'])
      expect(settleAnswerWord(false, reason), reason).toBe('failed');
    expect(paymentStatusWord('settled')).toBe('settled');
    expect(paymentStatusWord('refused')).toBe('failed');
    for (const status of ['unknown', 'authorized', 'settling'] as const)
      expect(paymentStatusWord(status), status).toBe('unresolved');
  });
});
