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
  createBullBoard({
    queues: QUEUE_NAMES.map((name) => new BullMQAdapter(opts.runtime.producers.queues[name])),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'Agent Settlement queues' } },
  });
  await app.register(serverAdapter.registerPlugin(), { prefix: BULL_BOARD_PATH });
}
