#!/usr/bin/env bash
# make bench: starts the daemon on a fresh SQLite database, and on PostgreSQL
# when its server programs are installed (a throwaway cluster with
# PostgreSQL's durable settings, see with-postgres.sh), and runs
# keyserver-bench against each, after the same workload against fixed
# answers without a database (the ceiling). keyserver-bench is given the
# daemons' process IDs, and the cluster's data directory when it runs here,
# so that it reports their CPU time per request.
#
#   scripts/bench.sh [--daemons N] [keyserver-bench flags...]
#
# --daemons N (N > 1) starts N daemons on one PostgreSQL database, with the
# clients spread over them, and measures only PostgreSQL (and the ceiling).
# Extra arguments go to keyserver-bench, for example -phases sync.
set -euo pipefail
cd "$(dirname "$0")/.."

DAEMONS=${DAEMONS:-1}
if [ "${1:-}" = "--daemons" ]; then
  DAEMONS=$2
  shift 2
fi
POSTGRES_ONLY=${POSTGRES_ONLY:-}
[ "$DAEMONS" -gt 1 ] && POSTGRES_ONLY=1
BENCH_ARGS=("$@")
# The sync phase holds thousands of connections: the tool and the daemons
# get the most file descriptors allowed.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

wait_health() { # port
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "bench: nothing answers on 127.0.0.1:$1" >&2
  return 1
}

bench_one() { # name database-uri [postgres-data-dir]
  local name=$1 db=$2 pgdata=${3:-} base i dir port
  local dirs=() urls=() pids=() metrics=() extra=()
  base=$((20000 + RANDOM % 20000))
  for i in $(seq "$DAEMONS"); do
    dir=$(mktemp -d /tmp/keyserver-bench.XXXXXX)
    port=$((base + 3 * (i - 1)))
    dirs+=("$dir")
    # Daemons on one database serve one server: they share the first's
    # signing key.
    local key=()
    [ "$i" -gt 1 ] && key=(--signing-key-path "${dirs[0]}/signing.key")
    # bcrypt at its minimum and no login or registration limits: set-up
    # registers and logs in hundreds of users from one address, and password
    # hashing is not what is measured. No cap on connections per address:
    # every client of the tool comes from 127.0.0.1. The admin token lets
    # the sync phase put users in rooms, and the metrics tell it when every
    # request waits and how many statements the database was sent.
    bin/keyserver --data-dir "$dir" --database "$db" --client-listen "127.0.0.1:$port" \
      --federation-listen "127.0.0.1:$((port + 1))" --client-api-bcrypt-cost 4 "${key[@]}" \
      --client-api-login-rate-limit-per-second 0 --client-api-registration-rate-limit-per-second 0 \
      --client-api-max-connections-per-address 0 --admin-token bench-admin \
      --metrics-listen "127.0.0.1:$((port + 2))" --log-level warn >"$dir/log" 2>&1 &
    pids+=($!)
    urls+=("http://127.0.0.1:$port")
    metrics+=("http://127.0.0.1:$((port + 2))/metrics")
    wait_health "$port"
  done
  [ -n "$pgdata" ] && extra=(-postgres-data "$pgdata")
  echo "== $name$([ "$DAEMONS" -gt 1 ] && echo ", $DAEMONS daemons on one database")"
  if [[ $db == postgres* ]]; then
    echo "PostgreSQL settings: $(psql -Atc "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
      WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'min_wal_size')" "$db" 2>/dev/null || echo "unknown (psql failed)")"
  fi
  bin/keyserver-bench -url "$(IFS=,; echo "${urls[*]}")" -pid "$(IFS=,; echo "${pids[*]}")" -admin-token bench-admin \
    -metrics-url "$(IFS=,; echo "${metrics[*]}")" "${extra[@]}" "${BENCH_ARGS[@]}" || status=1
  for i in "${!pids[@]}"; do
    echo "daemon $((i + 1)) resident memory: $(( $(awk '/VmRSS/ {print $2}' "/proc/${pids[$i]}/status") / 1024 )) MB"
  done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "${dirs[@]}"
}

status=${BENCH_STATUS:-0}
if [ -z "${INNER:-}" ]; then
  # The ceiling: the same workload against fixed answers, no database.
  port=$((20000 + RANDOM % 20000))
  bin/keyserver-bench -serve-fixed "127.0.0.1:$port" & fixed=$!
  wait_health "$port"
  echo "== ceiling (fixed answers, no database)"
  bin/keyserver-bench -url "http://127.0.0.1:$port" -pid "$fixed" "${BENCH_ARGS[@]}" || true
  kill "$fixed"; wait "$fixed" 2>/dev/null || true
  if [ -z "$POSTGRES_ONLY" ]; then
    bench_one sqlite "file:/tmp/keyserver-bench-$$.db"
    rm -f /tmp/keyserver-bench-$$.db*
  fi
  if [ -z "${KEYSERVER_TEST_POSTGRES:-}" ]; then
    # A throwaway cluster with fsync and synchronous_commit on, as
    # PostgreSQL runs by default, its log segments ready for reuse as in a
    # cluster in service (see with-postgres.sh).
    INNER=1 DAEMONS=$DAEMONS BENCH_STATUS=$status KEYSERVER_PG_DURABLE=1 exec scripts/with-postgres.sh "$0" "${BENCH_ARGS[@]}"
  fi
fi
if [ -n "${KEYSERVER_TEST_POSTGRES:-}" ]; then
  # The cluster's CPU is measured when its data directory is known: the
  # throwaway's, or one named in KEYSERVER_TEST_POSTGRES_DATA.
  bench_one postgres "$KEYSERVER_TEST_POSTGRES" "${KEYSERVER_TEST_POSTGRES_DATA:-}"
fi
exit $status
