#!/usr/bin/env bash
# The Redis sink benchmark of issue 13, in one command:
#   bench/redis/run.sh [bench.py options, e.g. --rounds 4]
# Builds outbox-relay (Release, in build-bench-redis/), starts a throwaway PostgreSQL 15 cluster
# with fsync on (scripts/pg-cluster.sh) and a throwaway redis-server (appendonly yes, appendfsync
# always) on a free 127.0.0.1 port, runs bench/redis/bench.py with the test venv's Python
# (psycopg, redis-py): drains of 200,000 events to the file sink and to the Redis sink in the same
# run. Prints the table and writes bench/out/redis-<time>.json (and bench/out/redis-latest.json).
# Cleans up after itself, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BENCH_BUILD_DIR:-$root/build-bench-redis}
python=${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python

echo "[bench-redis] building in $build" >&2
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
  || { cat "$build/bench-cmake.log" >&2; exit 1; }
ninja -C "$build" -j2 outbox-relay >&2
"$python" -c 'import psycopg, redis' 2> /dev/null \
  || { echo "[bench-redis] the venv lacks psycopg/redis: run scripts/install-deps.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/outbox-bench-redis.XXXXXX)
chmod 755 "$work"
redis_pid=
cleanup() {
  if [ -n "${out:-}" ] && [ -d "$work/logs" ]; then
    mkdir -p "${out%.json}.logs"
    cp -r "$work/logs/." "${out%.json}.logs/" || true
    cp "$work/redis/redis.log" "${out%.json}.logs/redis-server.log" 2> /dev/null || true
  fi
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2> /dev/null || true; wait "$redis_pid" 2> /dev/null || true; fi
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench-redis] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
psql -X -q "$url" -c "CREATE DATABASE bench"
bench_url="${url%/*}/bench"

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/redis"
echo "[bench-redis] starting redis-server on 127.0.0.1:$port in $work/redis" >&2
redis-server --bind 127.0.0.1 --port "$port" --dir "$work/redis" --logfile "$work/redis/redis.log" \
  --daemonize no --save "" --appendonly yes --appendfsync always --protected-mode no &
redis_pid=$!
for _ in $(seq 100); do
  redis-cli -p "$port" ping > /dev/null 2>&1 && break
  sleep 0.1
done

mkdir -p "$root/bench/out"
out="$root/bench/out/redis-$(date +%Y%m%d-%H%M%S).json"
"$python" "$root/bench/redis/bench.py" --url "$bench_url" --redis-port "$port" --work "$work" \
  --relay-bin "$build/bin/outbox-relay" --out "$out" "$@"
cp "$out" "$root/bench/out/redis-latest.json"
