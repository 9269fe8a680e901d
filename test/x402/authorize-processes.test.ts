import { describe, expect, it } from 'vitest';
import { createGate, gateParties, post, quote, twoApiProcesses } from './helpers.ts';

/**
 * authorize-payment does not read a gate's commitment before claiming it unless it must: the claim (a unique insert)
 * says whether the gate was still open. Two API processes: the second never saw what the first committed, so its
 * answers must come from the facts, in the contract's order, exactly as if it had read them first.
 */
describe('authorize-payment on a gate committed through another process', () => {
  const processes = twoApiProcesses();

  /** A gate created, quoted and authorized through the first process: the authorize body and its answer. */
  async function authorizedThroughFirst(amount: number) {
    const { first, auth } = processes;
    const { payer, payee } = await gateParties(first, auth, 1_000);
    const gate = await createGate(first, auth, { payerAgentId: payer, payeeAgentId: payee, amount });
    const q = await quote(first, auth, gate.gateId);
    const body = { gateId: gate.gateId, quoteId: q.quoteId, requestSha256: q.requestSha256 };
    const answer = await post(first, auth, '/x402/gate/authorize-payment', body);
    expect(answer.statusCode, answer.body).toBe(200);
    return { body, answer };
  }

  it('repeats the same token for a gate authorized through the other process', async () => {
    const { second, auth } = processes;
    const { body, answer: there } = await authorizedThroughFirst(300);

    const here = await post(second, auth, '/x402/gate/authorize-payment', body);
    expect(here.statusCode, here.body).toBe(200);
    expect(here.json().token).toBe(there.json().token);
    expect(here.json().authorizationRef).toBe(there.json().authorizationRef);
  });

  it('answers X402_GATE_TERMINAL for a settled gate, before any quote or request check, and changes nothing', async () => {
    const { first, second, auth } = processes;
    const { body } = await authorizedThroughFirst(400);
    const verified = await post(first, auth, '/x402/gate/verify', {
      gateId: body.gateId,
      evidence: { responseSha256: 'a'.repeat(64) },
    });
    expect(verified.statusCode, verified.body).toBe(200);
    const commitment = await first.runtime.stores.x402.commitments.findOne({ _id: body.gateId });

    for (const attempt of [body, { ...body, requestSha256: 'b'.repeat(64) }, { ...body, quoteId: 'quo_unknown' }]) {
      const res = await post(second, auth, '/x402/gate/authorize-payment', attempt);
      expect(res.statusCode, res.body).toBe(409);
      expect(res.json()).toMatchObject({ code: 'X402_GATE_TERMINAL', details: { status: 'released' } });
    }
    expect(await first.runtime.stores.x402.commitments.findOne({ _id: body.gateId })).toEqual(commitment);
  });
});
