import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/context.ts';

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: any;
}

/** Sends bytes exactly as given over a loopback socket and parses the answer (the server closes or ends it). */
function raw(port: number, text: string): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error('no answer within 5 s'));
    }, 5_000);
    socket.on('data', (c) => {
      chunks.push(c);
      const text = Buffer.concat(chunks).toString('utf8');
      const split = text.indexOf('\r\n\r\n');
      if (split === -1) return;
      const length = Number(/content-length: (\d+)/i.exec(text.slice(0, split))?.[1] ?? -1);
      if (length >= 0 && Buffer.byteLength(text.slice(split + 4)) >= length) socket.end();
    });
    socket.on('error', () => undefined); // the server may reset after answering; what it sent is what counts
    socket.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString('utf8');
      const [head = '', body = ''] = [
        text.slice(0, text.indexOf('\r\n\r\n')),
        text.slice(text.indexOf('\r\n\r\n') + 4),
      ];
      const [statusLine, ...lines] = head.split('\r\n');
      const headers = Object.fromEntries(
        lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
      );
      let parsed: unknown = body;
      try {
        parsed = JSON.parse(body);
      } catch {
        // left as text; the assertions say what was expected
      }
      resolve({ status: Number(statusLine?.split(' ')[1]), headers, body: parsed });
    });
    socket.write(text);
  });
}

function expectContractError(answer: RawAnswer, status: number, code: string) {
  expect(answer.status, JSON.stringify(answer.body)).toBe(status);
  expect(answer.body).toEqual(
    expect.objectContaining({ code, message: expect.any(String), requestId: expect.stringMatching(/^\S+$/) }),
  );
  expect(answer.headers['x-request-id']).toBe(answer.body.requestId);
  expect(answer.headers['content-type']).toMatch(/^application\/json/);
}

describe('errors raised before the handlers leave in the contract shape, with a request id', () => {
  let t: TestApp;
  let port: number;
  beforeAll(async () => {
    t = await startTestApp();
    await t.app.listen({ host: '127.0.0.1', port: 0 });
    port = (t.app.server.address() as AddressInfo).port;
  });
  afterAll(async () => {
    await t.close();
  });

  it('answers a URL with broken percent-encoding with 400', async () => {
    const answer = await raw(port, 'GET /v1/runs/%E0%A4%A HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n');
    expectContractError(answer, 400, 'VALIDATION_FAILED');
    expect(answer.body.details.errors[0].path).toBe('url');
  });

  it('answers a URL over 8 KiB with 414, whether Node parses it (10 KiB) or refuses it (20 KiB)', async () => {
    for (const length of [10_000, 20_000]) {
      const answer = await raw(
        port,
        `GET /v1/runs/${'a'.repeat(length)} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n`,
      );
      expectContractError(answer, 414, 'URI_TOO_LONG');
    }
  });

  it('answers headers over 16 KiB with 431', async () => {
    const answer = await raw(
      port,
      `GET /healthz HTTP/1.1\r\nHost: localhost\r\nx-filler: ${'b'.repeat(20_000)}\r\n\r\n`,
    );
    expectContractError(answer, 431, 'HEADERS_TOO_LARGE');
  });

  it('answers a request that is not HTTP with 400', async () => {
    const answer = await raw(port, 'HELLO THERE\r\n\r\n');
    expectContractError(answer, 400, 'BAD_REQUEST');
  });

  it('answers a body over 1 MiB with 413 over a real connection', async () => {
    const body = JSON.stringify({ name: 'x'.repeat(1024 * 1024 + 10) });
    const answer = await new Promise<RawAnswer>((resolve, reject) => {
      const req = httpRequest(
        {
          host: '127.0.0.1',
          port,
          method: 'POST',
          path: '/ops/tenants',
          headers: { ...t.admin, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            resolve({
              status: res.statusCode!,
              headers: res.headers as Record<string, string>,
              body: JSON.parse(Buffer.concat(chunks).toString('utf8')),
            }),
          );
        },
      );
      req.on('error', (err) =>
        (err as NodeJS.ErrnoException).code === 'EPIPE' || (err as NodeJS.ErrnoException).code === 'ECONNRESET'
          ? undefined
          : reject(err),
      );
      req.end(body);
    });
    expectContractError(answer, 413, 'BODY_TOO_LARGE');
  });

  it('still answers a normal request on the same server', async () => {
    const answer = await raw(port, 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n');
    expect(answer.status).toBe(200);
    expect(answer.headers['x-request-id']).toMatch(/^req_/);
  });
});
