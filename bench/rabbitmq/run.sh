#!/usr/bin/env bash
# The RabbitMQ sink benchmark of issue 13, in one command:
#   bench/rabbitmq/run.sh [bench.py options, e.g. --rounds 2 --events 200000]
# Builds outbox-relay (Release, in build-bench-rabbitmq/; BENCH_RELAY_BIN=path skips the build),
# starts a throwaway PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh, without PG_FAST)
# and a throwaway RabbitMQ node (tests/integration/rabbitmq_fixtures.py: free 127.0.0.1 ports, its
# own epmd), runs bench/rabbitmq/bench.py with the test venv's Python (psycopg, pika): drains of
# 200,000 pending events to the rabbitmq sink and to the file sink in the same run, alternating.
# Prints the table and writes bench/out/rabbitmq-<time>.json. Cleans up after itself.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python

relay_bin=${BENCH_RELAY_BIN:-}
if [ -z "$relay_bin" ]; then
  build=${BENCH_BUILD_DIR:-$root/build-bench-rabbitmq}
  echo "[bench-rabbitmq] building in $build" >&2
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
    || { cat "$build/bench-cmake.log" >&2; exit 1; }
  ninja -C "$build" -j2 outbox-relay >&2
  relay_bin=$build/bin/outbox-relay
fi
"$python" -c 'import psycopg, pika' 2> /dev/null \
  || { echo "[bench-rabbitmq] the venv lacks psycopg/pika: run scripts/install-deps.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/outbox-bench-rabbitmq.XXXXXX)
chmod 755 "$work"
cleanup() {
  "$root/scripts/pg-cluster.sh" stop "$work/pg" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench-rabbitmq] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
psql -X -q "$url" -c "CREATE DATABASE bench"
bench_url="${url%/*}/bench"
DATABASE_URL=$bench_url "$relay_bin" migrate > /dev/null

mkdir -p "$root/bench/out"
out="$root/bench/out/rabbitmq-$(date +%Y%m%d-%H%M%S).json"
"$python" "$root/bench/rabbitmq/bench.py" --url "$bench_url" --work "$work" --relay-bin "$relay_bin" \
  --out "$out" "$@"
