#!/usr/bin/env bash
# The nats sink benchmark of issue 13, in one command:
#   bench/nats/run.sh [bench.py options, e.g. --rounds 3 --events 200000]
# Builds outbox-relay (Release, in build-bench-nats/; OUTBOX_RELAY_BIN=path uses a built binary
# instead), starts a throwaway PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh) and a
# throwaway nats-server with JetStream (file storage) on a free 127.0.0.1 port, runs
# bench/nats/bench.py with the test venv's Python (psycopg, nats-py): drains of 200,000 pending
# events to the nats sink and to the file sink, alternating, in the same run. Prints the table and
# writes bench/out/nats-<time>.json (and bench/out/nats-latest.json). Cleans up after itself, also
# on failure or Ctrl-C. Needs what scripts/install-deps.sh installs (nats-server among it).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python

if [ -n "${OUTBOX_RELAY_BIN:-}" ]; then
  relay_bin=$OUTBOX_RELAY_BIN
else
  build=${BENCH_BUILD_DIR:-$root/build-bench-nats}
  echo "[bench-nats] building in $build" >&2
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
    || { cat "$build/bench-cmake.log" >&2; exit 1; }
  ninja -C "$build" -j2 outbox-relay >&2
  relay_bin=$build/bin/outbox-relay
fi
"$python" -c 'import psycopg, nats' 2> /dev/null \
  || { echo "[bench-nats] the venv lacks psycopg/nats-py: run scripts/install-deps.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/outbox-bench-nats.XXXXXX)
chmod 755 "$work"
nats_pid=""
cleanup() {
  if [ -n "${out:-}" ] && [ -d "$work/logs" ]; then
    mkdir -p "${out%.json}.logs"
    cp -r "$work/logs/." "${out%.json}.logs/" || true
    cp "$work/nats/server.log" "${out%.json}.logs/nats-server.log" 2> /dev/null || true
  fi
  [ -z "$nats_pid" ] || { kill "$nats_pid" 2> /dev/null || true; wait "$nats_pid" 2> /dev/null || true; }
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench-nats] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
psql -X -q "$url" -c "CREATE DATABASE bench"
bench_url="${url%/*}/bench"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
mkdir -p "$work/nats"
echo "[bench-nats] starting nats-server (JetStream, file store) on 127.0.0.1:$port" >&2
nats-server -a 127.0.0.1 -p "$port" -js -sd "$work/nats/store" -l "$work/nats/server.log" &
nats_pid=$!

mkdir -p "$root/bench/out"
out="$root/bench/out/nats-$(date +%Y%m%d-%H%M%S).json"
"$python" "$root/bench/nats/bench.py" --url "$bench_url" --nats "nats://127.0.0.1:$port" --work "$work" \
  --relay-bin "$relay_bin" --out "$out" "$@"
cp "$out" "$root/bench/out/nats-latest.json"
