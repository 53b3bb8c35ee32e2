#!/usr/bin/env bash
# Runs a command with KEYSERVER_TEST_POSTGRES pointing at a PostgreSQL
# database the tests may use.
#
# - KEYSERVER_TEST_POSTGRES already set: that database is used as it is.
# - Otherwise, when PostgreSQL's server programs are installed, a throwaway
#   cluster is created in a temporary directory, listening only on a Unix
#   socket there, and removed afterwards. Nothing on the machine is changed.
#   As root the cluster runs as the "postgres" user (PostgreSQL refuses root).
#   It runs without fsync, as a test cluster need not survive a crash;
#   KEYSERVER_PG_DURABLE=1 keeps PostgreSQL's durable defaults (fsync,
#   synchronous_commit and full_page_writes on), as benchmarks want, and
#   has its write-ahead log warmed (below).
#   KEYSERVER_TEST_POSTGRES_DATA is set to its data directory.
# - Otherwise the command runs without it: the PostgreSQL tests are skipped
#   with a message, or fail when CI is set.
set -euo pipefail

if [ -n "${KEYSERVER_TEST_POSTGRES:-}" ]; then
  exec "$@"
fi

bindir=""
if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
  bindir=$(pg_config --bindir)
fi
if [ -z "$bindir" ]; then
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && bindir=$d
  done
fi
if [ -z "$bindir" ]; then
  echo "with-postgres: PostgreSQL server programs not found; PostgreSQL tests will be skipped (install the postgresql package, or set KEYSERVER_TEST_POSTGRES)" >&2
  exec "$@"
fi

dir=$(mktemp -d /tmp/keyserver-pg.XXXXXX)
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$dir"
  as_pg=(runuser -u postgres --)
fi
cleanup() {
  "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

"${as_pg[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 ||
  { cat "$dir/initdb.log" >&2; exit 1; }
# fsync off: a test cluster that is thrown away need not survive a crash.
durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
if [ "${KEYSERVER_PG_DURABLE:-}" = 1 ]; then
  # min_wal_size: checkpoints keep up to 1 GB of used log segments for
  # reuse (PostgreSQL's default keeps 80 MB).
  durability="-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c min_wal_size=1GB"
fi
"${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-k $dir -c listen_addresses= $durability -c max_connections=300" start >/dev/null ||
  { cat "$dir/server.log" >&2; exit 1; }

export KEYSERVER_TEST_POSTGRES="postgres:///postgres?host=$dir&user=postgres&sslmode=disable"
if [ "${KEYSERVER_PG_DURABLE:-}" = 1 ]; then
  # A cluster in service writes its log into segments its checkpoints
  # freed. A new one has none: it creates each 16 MB segment when the log
  # reaches it, writing it full of zeros and syncing it while every commit
  # waits (40-60 ms here, every ~2.5 s of room messages). So that a
  # benchmark meets the cluster as it runs in service, 64 segments (1 GB)
  # are filled here and a checkpoint frees them for reuse (~4 s).
  psql=psql
  [ -x "$bindir/psql" ] && psql=$bindir/psql
  "$psql" -qX -v ON_ERROR_STOP=1 "$KEYSERVER_TEST_POSTGRES" -c "CREATE TABLE wal_warm (n INT)" \
    -c 'DO $$ BEGIN FOR i IN 1..64 LOOP INSERT INTO wal_warm VALUES (i); PERFORM pg_switch_wal(); END LOOP; END $$' \
    -c "DROP TABLE wal_warm" -c "CHECKPOINT" >/dev/null
fi
export KEYSERVER_TEST_POSTGRES_DATA="$dir/data"
echo "with-postgres: throwaway PostgreSQL at $dir ($durability)" >&2
"$@"
