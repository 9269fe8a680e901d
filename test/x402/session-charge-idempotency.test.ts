// Issue 38: `x-idempotency-key` (contract section 4: accepted on every POST, as `Idempotency-Key` is) was ignored by
// POST /x402/sessions/{id}/charges, which read only `Idempotency-Key` as the call's payment id.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';
import { gateParties, get, post, X402_SCOPES } from './helpers.ts';

describe('x402 session charges: Idempotency-Key and x-idempotency-key', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp({ overrides: { RATE_LIMIT_MAX: '100000', SWEEP_INTERVAL_MS: '3600000' } });
    ({ auth } = await t.tenantWithKey([...X402_SCOPES]));
  });
  afterAll(() => t.close());

  async function openSession() {
    const { payer, payee } = await gateParties(t, auth, 100);
    const res = await post(
      t,
      auth,
      '/x402/sessions',
      { payerAgentId: payer, payeeAgentIds: [payee], currency: 'USD', budget: 50, maxPerCall: 10 },
      { 'idempotency-key': `open-${payer}` },
    );
    expect(res.statusCode, res.body).toBe(201);
    return { payee, sessionId: res.json().sessionId as string };
  }

  const chargeWith = (sessionId: string, header: string, key: string, body: Record<string, unknown>) =>
    post(t, auth, `/x402/sessions/${sessionId}/charges`, body, { [header]: key });
  const sessionOf = async (sessionId: string) => (await get(t, auth, `/x402/sessions/${sessionId}`)).json();

  for (const header of ['x-idempotency-key', 'idempotency-key']) {
    it(`${header}: same key and body replays the first charge; same key, other body is 422 IDEMPOTENCY_KEY_REUSED`, async () => {
      const { payee, sessionId } = await openSession();
      const body = { payeeAgentId: payee, amount: 7, requestSha256: 'a'.repeat(64) };
      const first = await chargeWith(sessionId, header, 'call-1', body);
      expect(first.statusCode, first.body).toBe(201);
      expect(first.json()).toMatchObject({ seq: 1, paymentId: 'call-1', amount: 7, remaining: 43, repeated: false });
      expect(first.headers['idempotent-replayed']).toBeUndefined();

      const again = await chargeWith(sessionId, header, 'call-1', body);
      expect(again.statusCode, again.body).toBe(201);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.json()).toMatchObject({
        chargeId: first.json().chargeId,
        seq: 1,
        paymentId: 'call-1',
        amount: 7,
        repeated: true,
      });
      expect(again.json().receipt).toEqual(first.json().receipt);

      for (const other of [
        { ...body, amount: 8 },
        { ...body, requestSha256: 'b'.repeat(64) },
      ]) {
        const reused = await chargeWith(sessionId, header, 'call-1', other);
        expect(reused.statusCode, reused.body).toBe(422);
        expect(reused.json()).toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED', details: { paymentId: 'call-1' } });
      }
      expect(await sessionOf(sessionId)).toMatchObject({ spent: 7, remaining: 43, charges: 1 });
    });
  }

  it('x-idempotency-key: concurrent duplicates are charged once and each answers the one receipt', async () => {
    const { payee, sessionId } = await openSession();
    const answers = await Promise.all(
      Array.from({ length: 5 }, () =>
        chargeWith(sessionId, 'x-idempotency-key', 'call-at-once', { payeeAgentId: payee, amount: 3 }),
      ),
    );
    expect(
      answers.map((a) => a.statusCode),
      answers.map((a) => a.body).join('\n'),
    ).toEqual(Array(5).fill(201));
    expect(new Set(answers.map((a) => a.json().receipt.receiptHash)).size).toBe(1);
    expect(await sessionOf(sessionId)).toMatchObject({ spent: 3, charges: 1 });
  });

  it('x-idempotency-key: the quoted structured-field form is the same key; a malformed key is 400 and charges nothing', async () => {
    const { payee, sessionId } = await openSession();
    const first = await chargeWith(sessionId, 'x-idempotency-key', 'call-q', { payeeAgentId: payee, amount: 2 });
    const quoted = await chargeWith(sessionId, 'x-idempotency-key', '"call-q"', { payeeAgentId: payee, amount: 2 });
    expect(quoted.statusCode, quoted.body).toBe(201);
    expect(quoted.json().receipt).toEqual(first.json().receipt);
    const bad = await chargeWith(sessionId, 'x-idempotency-key', 'no spaces allowed', {
      payeeAgentId: payee,
      amount: 2,
    });
    expect(bad.statusCode, bad.body).toBe(400);
    expect(bad.json()).toMatchObject({ code: 'INVALID_IDEMPOTENCY_KEY' });
    expect(await sessionOf(sessionId)).toMatchObject({ spent: 2, charges: 1 });
  });

  it('a paymentId in the body stays the payment id (its reuse stays 409 X402_SESSION_PAYMENT_REUSED); a malformed key beside it is 400', async () => {
    const { payee, sessionId } = await openSession();
    const first = await chargeWith(sessionId, 'x-idempotency-key', 'header-key', {
      paymentId: 'body-id',
      payeeAgentId: payee,
      amount: 4,
    });
    expect(first.json()).toMatchObject({ paymentId: 'body-id' });
    const reused = await post(t, auth, `/x402/sessions/${sessionId}/charges`, {
      paymentId: 'body-id',
      payeeAgentId: payee,
      amount: 5,
    });
    expect(reused.statusCode).toBe(409);
    expect(reused.json()).toMatchObject({ code: 'X402_SESSION_PAYMENT_REUSED' });
    // A malformed key is refused beside a body paymentId too, as on every POST.
    const bad = await chargeWith(sessionId, 'x-idempotency-key', 'bad key', {
      paymentId: 'body-2',
      payeeAgentId: payee,
      amount: 4,
    });
    expect(bad.json()).toMatchObject({ code: 'INVALID_IDEMPOTENCY_KEY' });
    expect(await sessionOf(sessionId)).toMatchObject({ spent: 4, charges: 1 });
  });
});
