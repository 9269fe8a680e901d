// Prints `N passed, N failed` summed over vitest JSON reports (the main suite and the fault tests). A file that
// failed before running any test (an import or hook error) counts as one failure, and a missing report counts as
// one failure, so a broken file or a run that never wrote its report can never look green.
import { existsSync, readFileSync } from 'node:fs';

const paths = process.argv.slice(2);
let passed = 0;
let failed = paths.length === 0 ? 1 : 0;
let skipped = 0;
for (const path of paths) {
  if (!existsSync(path)) {
    failed += 1;
    continue;
  }
  const report = JSON.parse(readFileSync(path, 'utf8'));
  const brokenFiles = report.testResults.filter(
    (file) => file.status === 'failed' && file.assertionResults.every((a) => a.status !== 'failed'),
  ).length;
  passed += report.numPassedTests;
  failed += report.numFailedTests + brokenFiles;
  skipped += report.numPendingTests + report.numTodoTests;
}
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(failed > 0 ? 1 : 0);
