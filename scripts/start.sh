#!/usr/bin/env bash
# `npm start`: the whole service on a fresh machine: dependencies, Redis + FerretDB (unless MONGO_URL / REDIS_URL
# point elsewhere), then API + workers in one process on port 3000.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -d node_modules ] || npm ci --no-audit --no-fund
bash scripts/services.sh up
mkdir -p .data
if [ -z "${SERVICE_ADMIN_KEY:-}" ]; then
  # A development admin key, made once and kept out of the logs: read it from the file.
  if [ ! -s .data/admin-key ]; then (umask 077; node -e "process.stdout.write(require('crypto').randomBytes(32).toString('base64url'))" > .data/admin-key); fi
  SERVICE_ADMIN_KEY="$(cat .data/admin-key)"
  export SERVICE_ADMIN_KEY
  echo "start: admin key is in .data/admin-key (use it as: Authorization: Bearer <key>)" >&2
fi
exec node --max-semi-space-size=8 --heap-growing-percent=50 --import tsx src/main.ts "${1:-all}"  # as production runs (Dockerfile)
