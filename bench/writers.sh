#!/usr/bin/env bash
# Writer cost of the outbox (issue 9, acceptance 1; DESIGN section 9), in one command:
#   bench/writers.sh [writers.py options]      e.g. --rounds 3 --seconds 8 (the defaults),
#                                              --relay-bin DIR/outbox-relay, --no-relay;
#                                              bench/writers.sh --help lists them all
# What: commits/s of pgbench writers (-n -M prepared, unpaced) into three tables of one database,
# side by side in one run: plain_events (LIKE outbox_events INCLUDING ALL, fillfactor 50, no
# triggers), outbox_events as migrated by the binary under test, prev_events migrated to schema
# version 1 (the previous release). Four workloads: 32 and 4 clients, single-row INSERT txn or
# UPDATE orders + INSERT event txn. Rounds rotate the order of the tables; TRUNCATE + VACUUM
# orders + CHECKPOINT before every point; median commits/s per (workload, table), ratio to the
# no-trigger table, target >= 0.90 for outbox_events. Then 32 single-row writers into
# outbox_events with `outbox-relay run` draining: their commits/s and whether the relay keeps up.
# How: a throwaway PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh without PG_FAST),
# bench/writers.py; it uses build-bench/bin/outbox-relay (Release; not built here: build it
# with cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-bench
# outbox-relay, or pass --relay-bin), copied at the start so a rebuild cannot mix versions.
# Prints a markdown table and writes bench/out/writers-<time>.json and bench/out/writers-latest.json.
# Cleans up (cluster stopped, scratch directory removed) also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
export PATH="$PGBIN:$PATH"

for a in "$@"; do
  case "$a" in -h|--help) exec python3 "$root/bench/writers.py" --help ;; esac
done
for tool in psql pgbench initdb pg_ctl python3; do
  command -v "$tool" > /dev/null || { echo "writers.sh: $tool not found (PGBIN=$PGBIN; install PostgreSQL 15: scripts/install-deps.sh)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/outbox-writers.XXXXXX)
chmod 755 "$work"
cleanup() {
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  rm -rf "$work"
}
child=
trap cleanup EXIT
# Ctrl-C or TERM: ask the Python side to stop its relay and writers first (it turns SIGTERM into
# KeyboardInterrupt), then the EXIT trap stops the cluster.
trap 'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" || true; fi; exit 130' INT TERM HUP

echo "[writers] starting PostgreSQL (fsync on) in $work/pg" >&2
# The URL (with the cluster's password) travels in the environment, never on a command line.
BENCH_DATABASE_URL=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
export BENCH_DATABASE_URL

mkdir -p "$root/bench/out"
out="$root/bench/out/writers-$(date +%Y%m%d-%H%M%S).json"
python3 "$root/bench/writers.py" --pg-dir "$work/pg" --work "$work" --out "$out" "$@" &
child=$!
wait "$child"
