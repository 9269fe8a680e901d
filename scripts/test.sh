#!/usr/bin/env bash
# `npm test`: the full suite against real Redis and a real MongoDB wire-protocol server (provisioned here unless
# MONGO_URL / REDIS_URL are set). The last line is a plain summary: `N passed, N failed`.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -d node_modules ] || npm ci --no-audit --no-fund || exit 1
bash scripts/services.sh up || { echo "0 passed, 1 failed"; exit 1; }
mkdir -p .data
rm -f .data/vitest.json
npx vitest run --reporter=default --reporter=json --outputFile.json=.data/vitest.json "$@"
status=$?
node scripts/test-summary.mjs .data/vitest.json || status=1
exit $status
