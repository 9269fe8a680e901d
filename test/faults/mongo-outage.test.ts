import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { outageScenario } from './outage.ts';
import { FerretDbServer } from './servers.ts';
import type { ServiceProcess } from './service.ts';

describe('FerretDB hangs, then is stopped for 10 s and restarted (a FerretDB of this test only)', () => {
  let ferret: FerretDbServer;
  const processes: ServiceProcess[] = [];
  beforeAll(async () => {
    ferret = await FerretDbServer.start();
  });
  afterAll(async () => {
    for (const p of processes) await p.stop().catch(() => undefined);
    await ferret.destroy();
  });

  it('answers 503 within 1 s throughout, recovers within 5 s, and finishes every run exactly once', async () => {
    const figures = await outageScenario(
      {
        name: 'ferretdb',
        mongoUrl: ferret.url('faults'),
        redisUrl: inject('redisUrl'),
        freeze: () => ferret.freeze(),
        thaw: () => ferret.thaw(),
        down: () => ferret.down(),
        up: () => ferret.up(),
      },
      processes,
    );
    console.log(`fault figures: ${JSON.stringify(figures)}`);
    expect(figures.recoveryMs).toBeLessThan(5_000);
  });
});
