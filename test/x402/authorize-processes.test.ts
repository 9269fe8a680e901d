import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestApp } from '../helpers/context.ts';
import { createGate, gateParties, post, quote, twoApiProcesses } from './helpers.ts';

/**
 * authorize-payment does not read a gate's commitment before claiming it unless it must: the claim (a unique insert)
 * says whether the gate was still open. Two API processes: the second never saw what the first committed, so its
 * answers must come from the facts, in the contract's order, exactly as if it had read them first.
 */
describe('authorize-payment on a gate committed through another process', () => {
  let first: TestApp;
  let second: TestApp;
  let auth: Record<string, string>;
  let close: () => Promise<void>;
  beforeAll(async () => {
    ({ first, second, auth, close } = await twoApiProcesses());
  });
  afterAll(() => close());

  it('repeats the same token for a gate authorized through the other process', async () => {
    const { payer, payee } = await gateParties(first, auth, 1_000);
    const gate = await createGate(first, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 300 });
    const q = await quote(first, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };
    const there = await post(first, auth, '/x402/gate/authorize-payment', body);
    expect(there.statusCode, there.body).toBe(200);

    const here = await post(second, auth, '/x402/gate/authorize-payment', body);
    expect(here.statusCode, here.body).toBe(200);
    expect(here.json().token).toBe(there.json().token);
    expect(here.json().authorizationRef).toBe(there.json().authorizationRef);
  });

  it('answers X402_GATE_TERMINAL for a settled gate, before any quote or request check, and changes nothing', async () => {
    const { payer, payee } = await gateParties(first, auth, 1_000);
    const gate = await createGate(first, auth, { payerAgentId: payer, payeeAgentId: payee, amount: 400 });
    const q = await quote(first, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };
    expect((await post(first, auth, '/x402/gate/authorize-payment', body)).statusCode).toBe(200);
    const verified = await post(first, auth, '/x402/gate/verify', { gateId: gate.gateId, evidence: { responseSha256: 'a'.repeat(64) } });
    expect(verified.statusCode, verified.body).toBe(200);
    const commitment = await first.runtime.stores.x402.commitments.findOne({ _id: gate.gateId });

    for (const attempt of [body, { ...body, requestSha256: 'b'.repeat(64) }, { ...body, quoteId: 'quo_unknown' }]) {
      const res = await post(second, auth, '/x402/gate/authorize-payment', attempt);
      expect(res.statusCode, res.body).toBe(409);
      expect(res.json()).toMatchObject({ code: 'X402_GATE_TERMINAL', details: { status: 'released' } });
    }
    expect(await first.runtime.stores.x402.commitments.findOne({ _id: gate.gateId })).toEqual(commitment);
  });
});
