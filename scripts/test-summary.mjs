// Prints `N passed, N failed` from vitest's JSON report. A file that failed before running any test (an import or
// hook error) counts as one failure, so a broken file can never look green.
import { existsSync, readFileSync } from 'node:fs';

const path = process.argv[2];
if (!path || !existsSync(path)) {
  console.log('0 passed, 1 failed');
  process.exit(1);
}
const report = JSON.parse(readFileSync(path, 'utf8'));
const brokenFiles = report.testResults.filter((file) => file.status === 'failed' && file.assertionResults.every((a) => a.status !== 'failed')).length;
const passed = report.numPassedTests;
const failed = report.numFailedTests + brokenFiles;
const skipped = report.numPendingTests + report.numTodoTests;
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(failed > 0 ? 1 : 0);
