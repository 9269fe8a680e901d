// The outage log's bookkeeping (without servers), and which failures count as an outage (one of them through a
// proxy to the test FerretDB).
import { connect, createServer, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import { MongoClient, MongoNetworkError } from 'mongodb';
import { pino } from 'pino';
import { describe, expect, inject, it } from 'vitest';
import { toErrorBody } from '../src/http/plugins/errors.ts';
import { DependencyOutages, unreachableDependency } from '../src/outages.ts';

function recorder() {
  const lines: Array<Record<string, any>> = [];
  const stream = new Writable({
    write(chunk, _enc, done) {
      for (const line of String(chunk).split('\n').filter(Boolean)) lines.push(JSON.parse(line));
      done();
    },
  });
  return { lines, outages: new DependencyOutages(pino({ level: 'info' }, stream)) };
}

describe('DependencyOutages', () => {
  it('writes one line when a dependency goes and one when every connection that lost it is back, with the count', () => {
    const { lines, outages } = recorder();
    const api = {};
    const worker = {};
    outages.lost('redis', api, new Error('connect ECONNREFUSED 127.0.0.1:6390'));
    for (let i = 0; i < 50; i++) outages.lost('redis', i % 2 ? api : worker, new Error('connect ECONNREFUSED'));
    expect(outages.absorb(new Error('Connection is closed.'))).toBe(true);
    expect(outages.countIfDown('redis')).toBe(true);
    expect(outages.absorb(new Error('E11000 duplicate key'))).toBe(false);
    outages.reached('redis', api);
    expect(outages.isDown('redis')).toBe(true); // the worker's connection is still away
    outages.reached('redis', worker);
    outages.reached('redis', worker); // a repeat changes nothing
    expect(lines.map((l) => [l.dependency, l.state])).toEqual([
      ['redis', 'down'],
      ['redis', 'up'],
    ]);
    expect(lines[0]).toMatchObject({ msg: 'redis unreachable', error: 'Error: connect ECONNREFUSED 127.0.0.1:6390' });
    expect(lines[1]).toMatchObject({ msg: 'redis reachable again', failures: 53, downMs: expect.any(Number) });
  });

  it('outside an outage, writes a connection failure at most once per interval, with the count left out', () => {
    const { lines, outages } = recorder();
    const err = new MongoNetworkError('read ECONNRESET');
    expect(unreachableDependency(err)).toBe('mongodb');
    for (let i = 0; i < 20; i++) expect(outages.absorb(err)).toBe(true);
    expect(outages.countIfDown('mongodb')).toBe(false);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ dependency: 'mongodb', msg: 'mongodb call failed', failuresNotLogged: 0 });
  });

  it('a stall the request deadline answers: one line for many requests (apart from failed calls), none inside an outage', () => {
    const { lines, outages } = recorder();
    for (let i = 0; i < 30; i++) outages.answeredStalled('mongodb', 800);
    outages.absorb(new MongoNetworkError('connection timed out')); // a line of its own kind
    expect(lines.map((l) => l.msg)).toEqual([
      'request deadline passed while a backend stalls; answering 503',
      'mongodb call failed',
    ]);
    expect(lines[0]).toMatchObject({ backend: 'mongodb', deadlineMs: 800, answersNotLogged: 0 });
    outages.lost('redis', {}, new Error('connect ECONNREFUSED'));
    outages.answeredStalled('redis', 800);
    expect(lines.map((l) => l.msg).slice(2)).toEqual(['redis unreachable']); // counted into the outage instead
  });

  it('takes an insert whose server went away mid-way (the driver wraps it in a MongoBulkWriteError) for an outage: 503, not 500', async () => {
    // The test FerretDB behind a proxy that this test cuts once the client has found the server.
    const target = new URL(inject('mongoUrl'));
    const sockets = new Set<Socket>();
    const proxy = createServer((client) => {
      const upstream = connect(Number(target.port), target.hostname);
      for (const s of [client, upstream]) {
        sockets.add(s);
        s.on('error', () => undefined);
        s.on('close', () => sockets.delete(s));
      }
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const { port } = proxy.address() as { port: number };
    const client = new MongoClient(`mongodb://127.0.0.1:${port}/outage_wrap`, {
      serverSelectionTimeoutMS: 2_000,
      heartbeatFrequencyMS: 60_000,
    });
    try {
      await client.db().command({ ping: 1 });
      const cut = new Promise<void>((resolve) => proxy.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await cut;
      const err = await client
        .db()
        .collection('claims')
        .insertMany([{ _id: 'a' }, { _id: 'b' }] as never[], { ordered: false })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect((err as Error).name).toBe('MongoBulkWriteError');
      expect(unreachableDependency(err)).toBe('mongodb');
      expect(toErrorBody(err, 'req_1')).toMatchObject({ status: 503, body: { code: 'UNAVAILABLE' } });
    } finally {
      await client.close();
    }
  });

  it('takes a write to a MongoDB connection its server just closed (EPIPE, unwrapped by the driver) for an outage', () => {
    const err = Object.assign(new Error('This socket has been ended by the other party'), { code: 'EPIPE' });
    expect(unreachableDependency(err)).toBe('mongodb');
    expect(toErrorBody(err, 'req_1')).toMatchObject({ status: 503, body: { code: 'UNAVAILABLE' } });
    expect(unreachableDependency(new Error('This socket has been ended by the other party'))).toBeNull(); // not a socket's own
  });
});
