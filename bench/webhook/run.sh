#!/usr/bin/env bash
# The webhook sink benchmark of issue 4, in one command:
#   bench/webhook/run.sh [bench.py options, e.g. --rounds 5 --in-flight 1,16,64 --keys 1000]
# Builds outbox-relay (Release, in build-bench-webhook/) and the Go receiver
# (bench/webhook/receiver, standard library only), starts a throwaway PostgreSQL 15 cluster with
# fsync on (scripts/pg-cluster.sh, without PG_FAST), runs bench/webhook/bench.py, prints the table
# and writes bench/out/webhook-<time>.json (and bench/out/webhook-latest.json). Cleans up after
# itself, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BENCH_BUILD_DIR:-$root/build-bench-webhook}

echo "[bench] building outbox-relay in $build" >&2
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
  || { cat "$build/bench-cmake.log" >&2; exit 1; }
ninja -C "$build" -j2 outbox-relay >&2

work=$(mktemp -d /tmp/outbox-webhook-bench.XXXXXX)
chmod 755 "$work"
cleanup() {
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench] building the Go receiver" >&2
(cd "$root/bench/webhook/receiver" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -o "$work/receiver" .)

echo "[bench] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")

mkdir -p "$root/bench/out"
out="$root/bench/out/webhook-$(date +%Y%m%d-%H%M%S).json"
python3 "$root/bench/webhook/bench.py" --url "$url" --work "$work" --relay-bin "$build/bin/outbox-relay" \
  --receiver-bin "$work/receiver" --pg-dir "$work/pg" --out "$out" "$@"
cp "$out" "$root/bench/out/webhook-latest.json"
