import { expect } from 'vitest';
import type { TestApp } from './context.ts';

/** The money invariant audit (GET /ops/ledger/audit) finds nothing wrong. */
export async function expectCleanAudit(t: TestApp): Promise<void> {
  const res = await t.app.inject({ method: 'GET', url: '/ops/ledger/audit', headers: t.admin });
  expect(res.statusCode, res.body).toBe(200);
  expect(res.json().violations).toEqual([]);
  expect(res.json()).toMatchObject({ clean: true, complete: true });
}
