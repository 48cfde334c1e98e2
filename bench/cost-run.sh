#!/usr/bin/env bash
# Shared by bench/steady.sh and bench/writers.sh: runs bench/NAME.py on a throwaway PostgreSQL 15
# cluster with fsync on, writes bench/out/NAME-<time>.json, and cleans up (cluster stopped,
# scratch directory removed) also on failure or Ctrl-C.  Usage: bench/cost-run.sh NAME [options]
# (BENCH_PYTHON: the Python to run it with; python3 by default). NAME may name a folder of bench/,
# e.g. experiments/writer_marks.
set -euo pipefail
name=${1:?usage: cost-run.sh NAME [options]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
export PATH="$PGBIN:$PATH"

for a in "$@"; do
  case "$a" in -h|--help) exec "${BENCH_PYTHON:-python3}" "$root/bench/$name.py" --help ;; esac
done
for tool in psql pgbench initdb pg_ctl python3; do
  command -v "$tool" > /dev/null || { echo "$name.sh: $tool not found (PGBIN=$PGBIN; install PostgreSQL 15: scripts/install-deps.sh)" >&2; exit 1; }
done

work=$(mktemp -d "/tmp/outbox-${name//\//-}.XXXXXX")
chmod 755 "$work"
cleanup() {
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  # The server's log (autovacuum runs, checkpoints) outlives the scratch directory.
  if [ -s "$work/pg/server.log" ]; then
    mkdir -p "$(dirname "$root/bench/out/$name")" && cp "$work/pg/server.log" "$root/bench/out/$name-server-$(date -u +%Y%m%d-%H%M%S).log" || true
  fi
  rm -rf "$work"
}
child=
trap cleanup EXIT
# Ctrl-C or TERM: ask the Python side to stop its relay and writers first (it turns SIGTERM into
# KeyboardInterrupt), then the EXIT trap stops the cluster.
trap 'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" || true; fi; exit 130' INT TERM HUP

echo "[$name] starting PostgreSQL (fsync on) in $work/pg" >&2
# The URL (with the cluster's password) travels in the environment, never on a command line.
BENCH_DATABASE_URL=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
export BENCH_DATABASE_URL

mkdir -p "$(dirname "$root/bench/out/$name")"
out="$root/bench/out/$name-$(date +%Y%m%d-%H%M%S).json"
"${BENCH_PYTHON:-python3}" "$root/bench/$name.py" --pg-dir "$work/pg" --work "$work" --out "$out" "$@" &
child=$!
wait "$child"
