// The Standard Webhooks test vector (the one the specification's reference libraries test with) through our signer
// and our receiver helper, and our signed headers through the stock `standardwebhooks` package's verifier.
import { Webhook, WebhookVerificationError as StockVerificationError } from 'standardwebhooks';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { signatureFor, signedHeaders } from '../../src/domain/webhook-signing.ts';
import { verifyWebhook, WebhookVerificationError } from '../../src/webhooks/verify.ts';

const VECTOR = {
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  msgId: 'msg_p5jXN8AQM9LWM0D4loKWxJek',
  timestamp: 1614265330,
  payload: '{"test": 2432232314}',
  signature: 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=',
};
const headers = {
  'webhook-id': VECTOR.msgId,
  'webhook-timestamp': String(VECTOR.timestamp),
  'webhook-signature': VECTOR.signature,
};

describe('Standard Webhooks test vector', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("our signer produces the vector's signature, alone and in the delivery headers", () => {
    expect(signatureFor(VECTOR.secret, VECTOR.msgId, VECTOR.timestamp, VECTOR.payload)).toBe(VECTOR.signature);
    expect(signedHeaders([VECTOR.secret], VECTOR.msgId, VECTOR.timestamp, VECTOR.payload)).toEqual({
      ...headers,
      'service-signature': VECTOR.signature,
    });
  });

  it('the stock verifier accepts our headers for the vector, and refuses them for another body, id or time', () => {
    vi.useFakeTimers({ now: VECTOR.timestamp * 1000, toFake: ['Date'] });
    const stock = new Webhook(VECTOR.secret);
    const ours = signedHeaders([VECTOR.secret], VECTOR.msgId, VECTOR.timestamp, VECTOR.payload);
    expect(stock.verify(VECTOR.payload, ours)).toEqual({ test: 2432232314 });
    expect(() => stock.verify('{"test": 2432232315}', ours)).toThrow(StockVerificationError);
    expect(() => stock.verify(VECTOR.payload, { ...ours, 'webhook-id': 'msg_other' })).toThrow(StockVerificationError);
    expect(() => stock.verify(VECTOR.payload, { ...ours, 'webhook-timestamp': String(VECTOR.timestamp + 1) })).toThrow(
      StockVerificationError,
    );
    // Both of a rotation's signatures in one header: the stock verifier takes either.
    const rotated = signedHeaders(
      ['whsec_' + Buffer.alloc(32, 7).toString('base64'), VECTOR.secret],
      VECTOR.msgId,
      VECTOR.timestamp,
      VECTOR.payload,
    );
    expect(stock.verify(VECTOR.payload, rotated)).toEqual({ test: 2432232314 });
  });

  it("our receiver helper verifies the vector's signature (then refuses the body: it is no event of ours) and refuses a tampered one", () => {
    const at = { now: VECTOR.timestamp * 1000 };
    const code = (fn: () => unknown) => {
      try {
        fn();
        return 'accepted';
      } catch (err) {
        expect(err).toBeInstanceOf(WebhookVerificationError);
        return (err as WebhookVerificationError).code;
      }
    };
    // Past the signature, only the envelope check is left: `{"test": …}` is not {id, type, createdAt, data}.
    expect(code(() => verifyWebhook(VECTOR.payload, headers, VECTOR.secret, at))).toBe('INVALID_PAYLOAD');
    expect(code(() => verifyWebhook('{"test": 2432232315}', headers, VECTOR.secret, at))).toBe('NO_MATCHING_SIGNATURE');
    expect(
      code(() =>
        verifyWebhook(
          VECTOR.payload,
          { ...headers, 'webhook-signature': 'v1,' + Buffer.alloc(32).toString('base64') },
          VECTOR.secret,
          at,
        ),
      ),
    ).toBe('NO_MATCHING_SIGNATURE');
    expect(code(() => verifyWebhook(VECTOR.payload, headers, VECTOR.secret))).toBe('TIMESTAMP_TOO_OLD');
  });
});
