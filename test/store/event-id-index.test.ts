import { describe, expect, it } from 'vitest';
import { EventIdIndex } from '../../src/store/event-id-index.ts';
import { collidingEventIds } from '../helpers/agents.ts';

describe('EventIdIndex (which event ids a run holds, as appenders see it)', () => {
  it('points an id at the batch that holds it, and knows nothing of ids it was never given', () => {
    const index = new EventIdIndex();
    index.add('run_a', 1, 3, ['evt_1', 'evt_2', 'evt_3']);
    index.add('run_a', 4, 4, ['evt_4']);
    expect(index.coveredUpTo('run_a')).toBe(4);
    expect(index.candidates('run_a', 'evt_2')).toEqual([1]);
    expect(index.candidates('run_a', 'evt_4')).toEqual([4]);
    expect(index.candidates('run_a', 'evt_5')).toEqual([]);
    expect(index.candidates('run_b', 'evt_1')).toEqual([]); // per run
  });

  it('ignores a batch that is not the next one, so what it covers stays exact', () => {
    const index = new EventIdIndex();
    index.add('run_a', 5, 6, ['evt_5', 'evt_6']); // positions 1..4 were never read
    expect(index.coveredUpTo('run_a')).toBe(0);
    expect(index.candidates('run_a', 'evt_5')).toEqual([]);
    index.add('run_a', 1, 2, ['evt_1', 'evt_2']);
    index.add('run_a', 1, 2, ['evt_1', 'evt_2']); // the same batch seen twice (an append and a walk)
    expect(index.coveredUpTo('run_a')).toBe(2);
    expect(index.candidates('run_a', 'evt_1')).toEqual([1]);
  });

  it('keeps every batch of ids whose hashes collide, so a lookup confirms each', () => {
    // Two ids with the same 32-bit hash: both batches must come back as candidates.
    const pair = collidingEventIds('evt_');
    const index = new EventIdIndex();
    index.add('run_a', 1, 1, [pair[0]]);
    index.add('run_a', 2, 2, [pair[1]]);
    expect(index.candidates('run_a', pair[0])).toEqual([1, 2]);
    expect(index.candidates('run_a', pair[1])).toEqual([1, 2]);
  });

  it('drops the least recently used runs beyond its cap, never the run in use, and forgets a sealed run', () => {
    const index = new EventIdIndex(3);
    index.add('run_a', 1, 2, ['a1', 'a2']);
    index.add('run_b', 1, 1, ['b1']);
    index.add('run_a', 3, 3, ['a3']); // run_a is now the most recent; 4 ids > 3: run_b goes
    expect(index.coveredUpTo('run_b')).toBe(0);
    expect(index.coveredUpTo('run_a')).toBe(3);
    index.add('run_a', 4, 4, ['a4']); // over the cap on its own, but in use: kept
    expect(index.candidates('run_a', 'a4')).toEqual([4]);
    index.drop('run_a');
    expect(index.coveredUpTo('run_a')).toBe(0);
    index.add('run_c', 1, 3, ['c1', 'c2', 'c3']); // the count went down with the drop: run_c fits
    expect(index.coveredUpTo('run_c')).toBe(3);
  });
});
