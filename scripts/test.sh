#!/usr/bin/env bash
# `npm test`: the full suite against real Redis and a real MongoDB wire-protocol server (provisioned here unless
# MONGO_URL / REDIS_URL are set), then the fault tests (test/faults/, one file at a time: they stop and kill servers
# of their own) and the contract test (schemathesis over openapi/openapi.json against a service process). The last
# line is a plain summary over both: `N passed, N failed`.
#   scripts/test.sh [vitest args…]   both runs, filtered by the args
#   scripts/test.sh --faults [args…] the fault tests only (`npm run test:faults`)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The suite runs on the Node npm start runs on: 22 LTS or newer (scripts/ensure-node.sh).
source scripts/ensure-node.sh || { echo "0 passed, 1 failed"; exit 1; }
[ -d node_modules ] || npm ci --no-audit --no-fund || exit 1
bash scripts/services.sh up || { echo "0 passed, 1 failed"; exit 1; }
mkdir -p .data
rm -f .data/vitest.json .data/vitest-faults.json
status=0
reports=()
if [ "${1:-}" = "--faults" ]; then
  shift
else
  # With a filter, one of the two runs may have no matching file; that is not a failure.
  npx vitest run --reporter=default --reporter=json --outputFile.json=.data/vitest.json ${1:+--passWithNoTests} "$@" || status=1
  reports+=(.data/vitest.json)
fi
faults_started=$(date +%s)
npx vitest run -c vitest.faults.config.ts --reporter=default --reporter=json --outputFile.json=.data/vitest-faults.json ${1:+--passWithNoTests} "$@" || status=1
echo "fault tests took $(( $(date +%s) - faults_started ))s"
reports+=(.data/vitest-faults.json)
node scripts/test-summary.mjs "${reports[@]}" || status=1
exit $status
