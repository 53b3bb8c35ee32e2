#!/usr/bin/env bash
# make bench: starts the daemon on a fresh SQLite database, and on PostgreSQL
# when its server programs are installed (a throwaway cluster, see
# with-postgres.sh), and runs keyserver-bench against each with its
# defaults. Extra arguments go to keyserver-bench.
set -euo pipefail
cd "$(dirname "$0")/.."

bench_one() { # name database-uri
  local name=$1 db=$2 dir port pid
  dir=$(mktemp -d /tmp/keyserver-bench.XXXXXX)
  port=$((20000 + RANDOM % 20000))
  # bcrypt at its minimum and no login or registration limits: set-up
  # registers and logs in hundreds of users from one address, and password
  # hashing is not what is measured.
  bin/keyserver --data-dir "$dir" --database "$db" --client-listen "127.0.0.1:$port" \
    --federation-listen "127.0.0.1:$((port + 1))" --client-api-bcrypt-cost 4 \
    --client-api-login-rate-limit-per-second 0 --client-api-registration-rate-limit-per-second 0 \
    --log-level warn >"$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "== $name"
  bin/keyserver-bench -url "http://127.0.0.1:$port" "${BENCH_ARGS[@]}" || status=1
  echo "daemon resident memory: $(( $(awk '/VmRSS/ {print $2}' /proc/$pid/status) / 1024 )) MB"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

BENCH_ARGS=("$@")
status=0
if [ "${1:-}" != "--postgres-only" ]; then
  # The ceiling: the same workload against fixed answers, no database.
  port=$((20000 + RANDOM % 20000))
  bin/keyserver-bench -serve-fixed "127.0.0.1:$port" & fixed=$!
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "== ceiling (fixed answers, no database)"
  bin/keyserver-bench -url "http://127.0.0.1:$port" "${BENCH_ARGS[@]}" || true
  kill "$fixed"; wait "$fixed" 2>/dev/null || true
  bench_one sqlite "file:/tmp/keyserver-bench-$$.db"
  rm -f /tmp/keyserver-bench-$$.db*
else
  BENCH_ARGS=("${@:2}")
fi
if [ -z "${KEYSERVER_TEST_POSTGRES:-}" ] && [ "${INNER:-}" = "" ]; then
  INNER=1 exec scripts/with-postgres.sh "$0" --postgres-only "${BENCH_ARGS[@]}"
fi
if [ -n "${KEYSERVER_TEST_POSTGRES:-}" ]; then
  bench_one postgres "$KEYSERVER_TEST_POSTGRES"
fi
exit $status
