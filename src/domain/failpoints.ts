// Named crash points on the money paths, for the crash-point tests: `failpoint('x402.create.locked')` between two
// durable writes does nothing unless a test armed that name. Armed in-process (armFailpoint: the action throws, as
// a crash of the request would stop it there) or, for tests that SIGKILL a real process, by the environment:
// FAILPOINTS=name[,name…] kills this process at the first of them it reaches. Both are refused in production.

const armed = new Map<string, () => void>();

function refuseInProduction(): void {
  if (process.env.NODE_ENV === 'production') throw new Error('failpoints are for tests; refused in production');
}

for (const name of (process.env.FAILPOINTS ?? '')
  .split(',')
  .map((n) => n.trim())
  .filter(Boolean)) {
  refuseInProduction();
  armed.set(name, () => process.kill(process.pid, 'SIGKILL'));
}

/** A crash point: inert unless armed (one map lookup when nothing is armed). */
export function failpoint(name: string): void {
  if (armed.size === 0) return;
  armed.get(name)?.();
}

/** Arms a crash point in this process; `times` limits how often it fires (then it disarms itself). */
export function armFailpoint(
  name: string,
  action: () => void = () => {
    throw new FailpointCrash(name);
  },
  times = 1,
): void {
  refuseInProduction();
  let left = times;
  armed.set(name, () => {
    if (--left <= 0) armed.delete(name);
    action();
  });
}

export function disarmFailpoints(): void {
  armed.clear();
}

/** What an armed crash point throws by default: the request stops there, as if its process had died. */
export class FailpointCrash extends Error {
  constructor(readonly point: string) {
    super(`failpoint ${point}`);
  }
}
