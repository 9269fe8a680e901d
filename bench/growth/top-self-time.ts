// Top self-time functions of a V8 .cpuprofile (from node --cpu-prof; `npm run bench` writes them with
// BENCH_CPU_PROF=<dir>). Usage: node --import tsx bench/growth/top-self-time.ts <file.cpuprofile> [count]
import { readFileSync } from 'node:fs';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

const [file, countArg] = process.argv.slice(2);
if (!file) {
  console.error('usage: top-self-time.ts <file.cpuprofile> [count]');
  process.exit(2);
}
const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile;
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const selfUs = new Map<string, number>();
let totalUs = 0;
profile.samples.forEach((id, i) => {
  const node = byId.get(id)!;
  const { functionName, url, lineNumber } = node.callFrame;
  const where = url ? `${url.replace(/^file:\/\/.*?\/(node_modules|dist)\//, '$1/')}:${lineNumber + 1}` : '';
  const key = `${functionName || '(anonymous)'} ${where}`.trim();
  const us = profile.timeDeltas[i] ?? 0;
  selfUs.set(key, (selfUs.get(key) ?? 0) + us);
  totalUs += us;
});
const busyUs = totalUs - (selfUs.get('(idle)') ?? 0);
console.log(`${file}: ${(totalUs / 1e6).toFixed(1)} s profiled, ${(busyUs / 1e6).toFixed(1)} s not idle`);
for (const [key, us] of [...selfUs].sort((a, b) => b[1] - a[1]).slice(0, Number(countArg ?? 25))) {
  console.log(
    `${(us / 1e3).toFixed(0).padStart(8)} ms  ${((us / busyUs) * 100).toFixed(1).padStart(5)}% of busy  ${key}`,
  );
}
