#!/usr/bin/env bash
# Provisions the services the app needs, on loopback only: Redis (Debian's redis-server, AOF on, noeviction, as
# BullMQ advises for production) and FerretDB v1.24.2 (MongoDB wire protocol, SQLite backend, telemetry off).
# Idempotent: installs what is missing, starts what is not running, leaves running servers alone.
#   scripts/services.sh up | down | status
# When MONGO_URL / REDIS_URL are set, those servers are used and the matching local server is not started.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${SERVICES_DATA_DIR:-$ROOT/.data}"
REDIS_PORT="${LOCAL_REDIS_PORT:-6390}"
MONGO_PORT="${LOCAL_MONGO_PORT:-27027}"
FERRETDB="$ROOT/.tools/bin/ferretdb"

log() { echo "services: $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 100); do port_open "$1" && return 0; sleep 0.1; done
  log "$2 did not start listening on 127.0.0.1:$1; see $DATA/$2.log"; tail -20 "$DATA/$2.log" >&2 || true
  return 1
}

ensure_redis_installed() {
  command -v redis-server >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || { log "redis-server is missing; install Debian's redis-server package"; return 1; }
  log "installing redis-server from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq redis-server >/dev/null
}

redis_up() {
  if port_open "$REDIS_PORT"; then return 0; fi
  ensure_redis_installed
  mkdir -p "$DATA/redis"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DATA/redis" --daemonize yes \
    --pidfile "$DATA/redis.pid" --logfile "$DATA/redis.log" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction --save ""
  wait_port "$REDIS_PORT" redis
  log "redis on 127.0.0.1:$REDIS_PORT"
}

ferretdb_up() {
  if port_open "$MONGO_PORT"; then return 0; fi
  bash "$ROOT/scripts/install-ferretdb.sh"
  # Without the _id index patch every lookup scans its whole collection (see scripts/install-ferretdb.sh).
  if ! grep -qaF '_ferretdb_sjson->"_id"' "$FERRETDB"; then
    log "$FERRETDB lacks the _id index patch; remove it and run scripts/install-ferretdb.sh"; return 1
  fi
  mkdir -p "$DATA/ferretdb" "$DATA/ferretdb-state"
  # A database file left at its bare 4 KiB header (FerretDB stopped while creating it) holds no data but stops
  # FerretDB from starting ("no such table: _ferretdb_collections"): set such files aside.
  for f in "$DATA"/ferretdb/*.sqlite; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -le 4096 ] || continue
    mkdir -p "$DATA/ferretdb-broken" && mv "$f" "$DATA/ferretdb-broken/" && rm -f "$f-wal" "$f-shm"
    log "set aside empty database file $(basename "$f")"
  done
  nohup "$FERRETDB" --handler=sqlite --sqlite-url="file:$DATA/ferretdb/?_pragma=synchronous(normal)" --state-dir="$DATA/ferretdb-state" \
    --listen-addr="127.0.0.1:$MONGO_PORT" --debug-addr=127.0.0.1:0 --telemetry=disable --log-level=warn \
    >"$DATA/ferretdb.log" 2>&1 &
  echo $! >"$DATA/ferretdb.pid"
  wait_port "$MONGO_PORT" ferretdb
  log "ferretdb on 127.0.0.1:$MONGO_PORT"
}

stop_pid() {
  local f="$DATA/$1.pid"
  [ -f "$f" ] || return 0
  local pid; pid="$(cat "$f")"
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$f"
}

case "${1:-up}" in
  up)
    [ -n "${REDIS_URL:-}" ] || redis_up
    [ -n "${MONGO_URL:-}" ] || ferretdb_up
    ;;
  down)
    stop_pid ferretdb
    stop_pid redis
    ;;
  status)
    port_open "$REDIS_PORT" && echo "redis: up (127.0.0.1:$REDIS_PORT)" || echo "redis: down"
    port_open "$MONGO_PORT" && echo "ferretdb: up (127.0.0.1:$MONGO_PORT)" || echo "ferretdb: down"
    ;;
  *) echo "usage: scripts/services.sh up|down|status" >&2; exit 2 ;;
esac
