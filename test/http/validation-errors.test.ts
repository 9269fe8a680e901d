import { Type, type TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { explainValidationErrors } from '../../src/http/validation-errors.ts';
import { registerAgent } from '../helpers/agents.ts';
import { startTestApp, type TestApp } from '../helpers/context.ts';

// Raw schema phrases TypeBox (and ajv) write, which no caller should have to decode.
const RAW_PHRASES =
  /schema is false|must not have additional properties|must match a schema in anyOf|must have required properties|must be equal to constant/;

function expectOnePerPath(errors: Array<{ path: string; message: string }>) {
  expect(new Set(errors.map((e) => e.path)).size).toBe(errors.length);
  for (const e of errors) expect(e.message).not.toMatch(RAW_PHRASES);
}

describe('validation errors: one clear error per offending path', () => {
  let t: TestApp;
  let auth: Record<string, string>;
  let agentId: string;
  beforeAll(async () => {
    t = await startTestApp();
    ({ auth } = await t.tenantWithKey(['agents:write', 'runs:write']));
    agentId = (await registerAgent(t, auth)).agentId;
  });
  afterAll(() => t.close());

  const post = (url: string, payload: unknown) =>
    t.app.inject({ method: 'POST', url, headers: auth, payload: payload as Record<string, unknown> });

  it('names an unknown key once, with the keys its object takes (not "schema is false")', async () => {
    const res = await post('/v1/runs', { agentId, bogus: 1 });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toEqual({
      code: 'VALIDATION_FAILED',
      message: 'body.bogus is not a known field (expected one of agentId, terms, pricing, settlement)',
      details: {
        errors: [
          { path: 'body.bogus', message: 'is not a known field (expected one of agentId, terms, pricing, settlement)' },
        ],
      },
      requestId: expect.any(String),
    });
  });

  it('names a wrong type with what was expected and the JSON type it got', async () => {
    const res = await post('/v1/runs', {
      agentId,
      settlement: { payerAgentId: agentId, amount: '25', currency: 'USD' },
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      message: 'body.settlement.amount expected an integer from 1 to 9007199254740991, got a string',
      details: {
        errors: [
          { path: 'body.settlement.amount', message: 'expected an integer from 1 to 9007199254740991, got a string' },
        ],
      },
    });
  });

  it('names a missing field at the field itself', async () => {
    const res = await post('/v1/runs', {});
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({
      code: 'VALIDATION_FAILED',
      message: 'body.agentId is required (expected a string)',
      details: { errors: [{ path: 'body.agentId', message: 'is required (expected a string)' }] },
    });
  });

  it('picks the union branch the body came closest to: one wrong key in an agent registration is one error', async () => {
    // Before: seven errors, from both branches of {agentId | namespace + name}, two of them "schema is false".
    const pair = await registerAgent(t, auth); // a valid public key to reuse
    const agent = await t.app.inject({ method: 'GET', url: `/v1/agents/${pair.agentId}`, headers: auth });
    const publicKey = agent.json().keys[0].publicKey as string;
    const res = await post('/v1/agents', { name: 'helper', publicKey, displayNme: 'Helper' });
    expect(res.statusCode).toBe(400);
    expect(res.json().details.errors).toEqual([
      {
        path: 'body.displayNme',
        message: 'is not a known field (expected one of namespace, name, publicKey, displayName, metadata)',
      },
    ]);
    const given = await post('/v1/agents', { agentId: 'acme:agent:x', publicKey, bogus: true });
    expect(given.json().details.errors).toEqual([
      {
        path: 'body.bogus',
        message: 'is not a known field (expected one of agentId, publicKey, displayName, metadata)',
      },
    ]);
  });

  it('keeps several problems apart, one per path, in body order', async () => {
    const res = await post('/v1/runs', {
      agentId,
      terms: { accuracy: { min: 'high' } },
      settlement: { payerAgentId: agentId, amount: 1.5, currency: 'usd', holdbackBps: 10_001 },
    });
    expect(res.statusCode).toBe(400);
    const { errors } = res.json().details;
    expectOnePerPath(errors);
    expect(errors).toEqual([
      { path: 'body.terms.accuracy.min', message: 'expected a number, got a string' },
      {
        path: 'body.settlement.amount',
        message: expect.stringMatching(/^expected an integer .* got a number with a fraction$/),
      },
      { path: 'body.settlement.currency', message: 'must match the pattern ^[A-Z][A-Z0-9]{2,11}$' },
      { path: 'body.settlement.holdbackBps', message: 'must be at most 10000' },
    ]);
    expect(res.json().message).toBe(
      'body.terms.accuracy.min expected a number, got a string (and 3 more in details.errors)',
    );
  });

  it('explains query strings and path parameters the same way, without a JSON type (they are all strings)', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/v1/runs?limit=many', headers: auth });
    expect(res.statusCode).toBe(400);
    expect(res.json().details.errors).toEqual([
      { path: 'querystring.limit', message: expect.stringMatching(/^expected an integer from 1 to \d+$/) },
    ]);
  });
});

describe('explainValidationErrors on unions', () => {
  const explain = (schema: TSchema, value: unknown) =>
    explainValidationErrors(schema, value, Compile(schema).Errors(value) as never, { describeActual: true }).map(
      (e) => [e.instancePath, e.message],
    );

  it('says what a union takes when no branch comes closer, and keeps the unknown key every branch refuses', () => {
    const bound = Type.Union([
      Type.Object({ min: Type.Number() }, { additionalProperties: false }),
      Type.Object({ max: Type.Number() }, { additionalProperties: false }),
    ]);
    expect(explain(Type.Object({ bound }), { bound: { mn: 1 } })).toEqual([
      ['/bound', 'expected an object with min or an object with max'],
      ['/bound/mn', 'is not a known field (expected one of min, max)'],
    ]);
  });

  it('names literal and nullable unions by what they accept', () => {
    const schema = Type.Object({
      status: Type.Union([Type.Literal('open'), Type.Literal('closed')]),
      note: Type.Union([Type.String(), Type.Null()]),
    });
    expect(explain(schema, { status: 'shut', note: 7 })).toEqual([
      ['/status', 'expected one of "open", "closed"'],
      ['/note', 'expected a string or null'],
    ]);
  });

  it('follows the branch that fits into nested arrays, and reports nothing under a value of the wrong type', () => {
    const item = Type.Object({ v: Type.Literal(1), id: Type.String() }, { additionalProperties: false });
    const body = Type.Union([
      Type.Object({ event: item }, { additionalProperties: false }),
      Type.Object({ events: Type.Array(item) }, { additionalProperties: false }),
    ]);
    expect(
      explain(body, {
        events: [
          { v: 1, id: 'a' },
          { v: 2, id: 3 },
        ],
      }),
    ).toEqual([
      ['/events/1/v', 'must be 1'],
      ['/events/1/id', 'expected a string, got an integer'],
    ]);
    expect(explain(body, { events: 'all' })).toEqual([['/events', 'expected an array, got a string']]);
  });

  it('escapes keys as JSON pointers so a key with a slash stays one segment', () => {
    const schema = Type.Object({ a: Type.String() }, { additionalProperties: false });
    expect(explain(schema, { a: 'x', 'b/c': 1 })).toEqual([['/b~1c', 'is not a known field (expected a)']]);
  });
});
