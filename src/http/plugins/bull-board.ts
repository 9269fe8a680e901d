import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { FastifyAdapter } from '@bull-board/fastify';
import type { FastifyInstance } from 'fastify';
import { QUEUE_NAMES } from '../../queues/index.ts';
import type { Runtime } from '../../runtime.ts';

export const BULL_BOARD_PATH = '/admin/queues';

/** Bull Board for operators, admin only (the auth plugin guards the whole prefix; browsers get a Basic prompt). */
export async function bullBoardPlugin(app: FastifyInstance, opts: { runtime: Runtime }) {
  const serverAdapter = new FastifyAdapter();
  serverAdapter.setBasePath(BULL_BOARD_PATH);
  const { partitions } = opts.runtime.producers;
  createBullBoard({
    // A split queue's partitions are grouped under the queue's name (Bull Board's delimiter grouping: `settle.…`),
    // each shown as `settle · p3`; a queue of one partition is listed as it always was.
    queues: QUEUE_NAMES.flatMap((name) =>
      partitions[name].length === 1
        ? [new BullMQAdapter(partitions[name][0]!)]
        : partitions[name].map(
            (queue, p) =>
              new BullMQAdapter(queue, { prefix: `${name}.`, delimiter: '.', displayName: `${name} · p${p}` }),
          ),
    ),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'Agent Settlement queues' } },
  });
  await app.register(serverAdapter.registerPlugin(), { prefix: BULL_BOARD_PATH });
}
