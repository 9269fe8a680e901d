import { describe, expect, it } from 'vitest';
import { canonicalize, CanonicalJsonError, MAX_DEPTH } from '../../src/domain/canonical-json.ts';

/** The IEEE 754 double with the given bit pattern (RFC 8785 Appendix B lists numbers this way). */
function fromBits(hex: string): number {
  const view = new DataView(new ArrayBuffer(8));
  view.setBigUint64(0, BigInt(`0x${hex}`));
  return view.getFloat64(0);
}

function expectRejected(value: unknown, reason: string): void {
  let caught: unknown;
  try {
    canonicalize(value);
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(CanonicalJsonError);
  expect((caught as CanonicalJsonError).reason).toBe(reason);
  expect((caught as CanonicalJsonError).code).toBe('CANONICAL_JSON_INVALID');
}

describe('canonicalize: RFC 8785 numbers (Appendix B)', () => {
  const cases: Array<[string, string]> = [
    ['0000000000000000', '0'],
    ['8000000000000000', '0'], // -0
    ['0000000000000001', '5e-324'],
    ['8000000000000001', '-5e-324'],
    ['7fefffffffffffff', '1.7976931348623157e+308'],
    ['ffefffffffffffff', '-1.7976931348623157e+308'],
    ['4340000000000000', '9007199254740992'],
    ['c340000000000000', '-9007199254740992'],
    ['4430000000000000', '295147905179352830000'],
    ['44b52d02c7e14af5', '9.999999999999997e+22'],
    ['44b52d02c7e14af6', '1e+23'],
    ['44b52d02c7e14af7', '1.0000000000000001e+23'],
    ['444b1ae4d6e2ef4e', '999999999999999700000'],
    ['444b1ae4d6e2ef4f', '999999999999999900000'],
    ['444b1ae4d6e2ef50', '1e+21'],
    ['3eb0c6f7a0b5ed8c', '9.999999999999997e-7'],
    ['3eb0c6f7a0b5ed8d', '0.000001'],
    ['41b3de4355555553', '333333333.3333332'],
    ['41b3de4355555554', '333333333.33333325'],
    ['41b3de4355555555', '333333333.3333333'],
    ['41b3de4355555556', '333333333.3333334'],
    ['41b3de4355555557', '333333333.33333343'],
    ['becbf647612f3696', '-0.0000033333333333333333'],
    ['43143ff3c1cb0959', '1424953923781206.2'],
  ];
  it.each(cases)('0x%s -> %s', (bits, expected) => {
    expect(canonicalize(fromBits(bits))).toBe(expected);
  });

  it('formats common literals the ECMAScript way', () => {
    expect(canonicalize(1e21)).toBe('1e+21');
    expect(canonicalize(1e-7)).toBe('1e-7');
    expect(canonicalize(0.1 + 0.2)).toBe('0.30000000000000004');
    expect(canonicalize(-0)).toBe('0');
    expect(canonicalize(1e30)).toBe('1e+30');
    expect(canonicalize(4.5)).toBe('4.5');
    expect(canonicalize(2e-3)).toBe('0.002');
    expect(canonicalize(100)).toBe('100');
  });

  it('rejects NaN and the infinities (Appendix B: 0x7fffffffffffffff, 0x7ff0000000000000)', () => {
    expectRejected(fromBits('7fffffffffffffff'), 'NON_FINITE_NUMBER');
    expectRejected(fromBits('7ff0000000000000'), 'NON_FINITE_NUMBER');
    expectRejected(Number.NaN, 'NON_FINITE_NUMBER');
    expectRejected(Number.NEGATIVE_INFINITY, 'NON_FINITE_NUMBER');
    expectRejected({ a: [1, Infinity] }, 'NON_FINITE_NUMBER');
  });
});

describe('canonicalize: RFC 8785 section 3.2.2 example', () => {
  it('serialises the sample document exactly', () => {
    // The RFC's input text, parsed as any receiver would.
    const input = JSON.parse(
      String.raw`{
        "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
        "literals": [null, true, false]
      }`,
    ) as unknown;
    expect(canonicalize(input)).toBe(
      String.raw`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
    );
  });
});

describe('canonicalize: property sorting by UTF-16 code units (RFC 8785 3.2.3)', () => {
  it('orders the RFC example keys', () => {
    const input = {
      '\u20ac': 'Euro Sign',
      '\r': 'Carriage Return',
      '\ufb33': 'Hebrew Letter Dalet With Dagesh',
      '1': 'One',
      '\ud83d\ude00': 'Emoji: Grinning Face',
      '\u0080': 'Control',
      '\u00f6': 'Latin Small Letter O With Diaeresis',
    };
    const out = canonicalize(input);
    // Position of each key in the output (Object.keys of a parsed object would put "1" first, JS-style).
    const order = ['\r', '1', '\u0080', '\u00f6', '\u20ac', '\ud83d\ude00', '\ufb33'].map((k) =>
      out.indexOf(`${JSON.stringify(k)}:`),
    );
    // U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16 order, though not in code point order.
    expect(order.every((pos, i) => pos >= 0 && (i === 0 || pos > (order[i - 1] as number)))).toBe(true);
    expect(out).toBe(
      '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis",' +
        '"\u20ac":"Euro Sign","\ud83d\ude00":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}',
    );
  });

  it('sorts nested objects recursively and keeps array order', () => {
    const value = { b: [3, { z: 1, a: { y: null, x: true } }, 1], a: 'first', A: 0 };
    expect(canonicalize(value)).toBe('{"A":0,"a":"first","b":[3,{"a":{"x":true,"y":null},"z":1},1]}');
  });

  it('gives the same text for the same data whatever the insertion order', () => {
    expect(canonicalize({ x: 1, y: { b: 2, a: 1 } })).toBe(canonicalize({ y: { a: 1, b: 2 }, x: 1 }));
  });
});

describe('canonicalize: strings', () => {
  it('escapes only what JCS escapes', () => {
    expect(canonicalize('\b\t\n\f\r"\\')).toBe('"\\b\\t\\n\\f\\r\\"\\\\"');
    expect(canonicalize('\u0001\u001f')).toBe('"\\u0001\\u001f"');
    // DEL, U+2028, non-ASCII and "/" stay literal.
    expect(canonicalize('\u007f\u2028é/')).toBe('"\u007f\u2028é/"');
  });

  it('accepts well-formed surrogate pairs', () => {
    expect(canonicalize('\ud83d\ude00')).toBe('"\ud83d\ude00"');
  });

  it('rejects lone surrogates in values and keys', () => {
    expectRejected('\ud800', 'LONE_SURROGATE');
    expectRejected('a\ude00b', 'LONE_SURROGATE');
    expectRejected('\ude00\ud83d', 'LONE_SURROGATE'); // reversed pair is two lone surrogates
    expectRejected({ ['k\ud83d']: 1 }, 'LONE_SURROGATE');
    // JSON.parse happily produces one from an escape, so received bodies can carry them.
    expectRejected(JSON.parse('{"payload":"\\ud800"}'), 'LONE_SURROGATE');
  });

  it('reports where the bad value is', () => {
    try {
      canonicalize({ payload: { items: [1, '\udfff'] } });
      expect.unreachable();
    } catch (err) {
      expect((err as CanonicalJsonError).path).toBe('$.payload.items[1]');
    }
  });
});

describe('canonicalize: values outside the JSON data model are rejected, never dropped', () => {
  it('rejects undefined, functions, symbols and bigint', () => {
    expectRejected(undefined, 'UNSUPPORTED_TYPE');
    expectRejected({ a: undefined }, 'UNSUPPORTED_TYPE');
    expectRejected([undefined], 'UNSUPPORTED_TYPE');
    expectRejected({ f: () => 1 }, 'UNSUPPORTED_TYPE');
    expectRejected({ s: Symbol('x') }, 'UNSUPPORTED_TYPE');
    expectRejected({ n: 10n }, 'UNSUPPORTED_TYPE');
  });

  it('rejects sparse array holes, non-plain objects and symbol keys', () => {
    expectRejected([1, , 3], 'UNSUPPORTED_TYPE');
    expectRejected({ at: new Date(0) }, 'UNSUPPORTED_TYPE');
    expectRejected(new Map(), 'UNSUPPORTED_TYPE');
    expectRejected({ [Symbol('k')]: 1 }, 'UNSUPPORTED_TYPE');
  });

  it('rejects cycles and excessive depth but allows shared (non-cyclic) references', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expectRejected(cyclic, 'CIRCULAR');
    const shared = { x: 1 };
    expect(canonicalize({ a: shared, b: shared })).toBe('{"a":{"x":1},"b":{"x":1}}');

    let deep: unknown = 0;
    for (let i = 0; i < MAX_DEPTH + 1; i++) deep = [deep];
    expectRejected(deep, 'TOO_DEEP');
  });

  it('serialises primitives and null-prototype objects', () => {
    expect(canonicalize(null)).toBe('null');
    expect(canonicalize(true)).toBe('true');
    expect(canonicalize([])).toBe('[]');
    expect(canonicalize({})).toBe('{}');
    const bare = Object.create(null) as Record<string, number>;
    bare.b = 2;
    bare.a = 1;
    expect(canonicalize(bare)).toBe('{"a":1,"b":2}');
    // An own "__proto__" key from JSON.parse is ordinary data.
    expect(canonicalize(JSON.parse('{"__proto__":{"x":1},"a":2}'))).toBe('{"__proto__":{"x":1},"a":2}');
  });
});

describe('canonicalize: agrees with the reference `canonicalize` package on JSON data', () => {
  it('matches for a mixed document', async () => {
    const { default: reference } = await import('canonicalize');
    const docs: unknown[] = [
      { z: [1.5, -0, 1e21, 1e-7, 'x\u2028y'], a: { '\u00e9': null, e: [true, false, { k: 'v' }] }, '': 0 },
      [{ b: 1, a: 2 }, [], {}, 'emoji \ud83d\ude00', 123456789012345680000],
      'plain',
      0.1 + 0.2,
    ];
    for (const doc of docs) expect(canonicalize(doc)).toBe(reference(doc));
  });
});
