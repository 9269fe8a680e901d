#!/usr/bin/env bash
# `npm start`: the whole service on a fresh machine: dependencies, Redis + FerretDB (unless MONGO_URL / REDIS_URL
# point elsewhere), then API + workers in one process on port 3000.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Node 22 LTS or newer: the machine's, or the pinned one from the npm registry in .tools/node (scripts/ensure-node.sh).
source scripts/ensure-node.sh || exit 1
[ -d node_modules ] || npm ci --no-audit --no-fund
# One command moves everything: PORT (the API), REDIS_PORT and MONGO_PORT (the local Redis and FerretDB, and the URLs
# the service uses for them, unless REDIS_URL / MONGO_URL name other servers).
export LOCAL_REDIS_PORT="${REDIS_PORT:-${LOCAL_REDIS_PORT:-6390}}"
export LOCAL_MONGO_PORT="${MONGO_PORT:-${LOCAL_MONGO_PORT:-27027}}"
# Servers on other ports keep their data apart from the default pair's (stop them with the same variables and
# `bash scripts/services.sh down`).
if [ "$LOCAL_REDIS_PORT:$LOCAL_MONGO_PORT" != "6390:27027" ]; then
  export SERVICES_DATA_DIR="${SERVICES_DATA_DIR:-$ROOT/.data/services-$LOCAL_REDIS_PORT-$LOCAL_MONGO_PORT}"
fi
bash scripts/services.sh up
[ -n "${REDIS_URL:-}" ] || export REDIS_URL="redis://127.0.0.1:$LOCAL_REDIS_PORT"
[ -n "${MONGO_URL:-}" ] || export MONGO_URL="mongodb://127.0.0.1:$LOCAL_MONGO_PORT/agent_settlement"
mkdir -p .data
if [ -z "${SERVICE_ADMIN_KEY:-}" ]; then
  # A development admin key, made once and kept out of the logs: read it from the file.
  if [ ! -s .data/admin-key ]; then (umask 077; node -e "process.stdout.write(require('crypto').randomBytes(32).toString('base64url'))" > .data/admin-key); fi
  SERVICE_ADMIN_KEY="$(cat .data/admin-key)"
  export SERVICE_ADMIN_KEY
  echo "start: admin key is in .data/admin-key (use it as: Authorization: Bearer <key>)" >&2
fi
exec node --max-semi-space-size=8 --heap-growing-percent=50 --no-allocation-site-pretenuring --import tsx src/main.ts "${1:-all}"  # as production runs (Dockerfile)
