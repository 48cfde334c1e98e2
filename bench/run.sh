#!/usr/bin/env bash
# The core benchmark of issue 2, in one command:
#   bench/run.sh [bench.py options]     (bench/bench.py --help lists them; e.g. --rounds 7,
#                                        --no-design, --variants delete,async)
# Builds outbox-relay and outbox-bench (Release, in build-bench/), installs the peer
# (graphile-worker, bench/peer/, from its lockfile) if needed, starts a throwaway PostgreSQL 15
# cluster with fsync on (scripts/pg-cluster.sh, without PG_FAST), runs bench/bench.py, prints the
# table and writes bench/out/core-<time>.json (and bench/out/core-latest.json). Cleans up after
# itself, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BENCH_BUILD_DIR:-$root/build-bench}

echo "[bench] building in $build" >&2
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
  || { cat "$build/bench-cmake.log" >&2; exit 1; }
ninja -C "$build" -j2 outbox-relay outbox-bench >&2

peer=$root/bench/peer
if [ ! -f "$peer/node_modules/.package-lock.json" ] || [ "$peer/package-lock.json" -nt "$peer/node_modules/.package-lock.json" ]; then
  echo "[bench] installing the peer (npm ci)" >&2
  (cd "$peer" && npm ci --no-audit --no-fund >&2)
fi

work=$(mktemp -d /tmp/outbox-bench.XXXXXX)
chmod 755 "$work"
cleanup() {
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
psql -X -q "$url" -c "CREATE DATABASE bench"
bench_url="${url%/*}/bench"

mkdir -p "$root/bench/out"
out="$root/bench/out/core-$(date +%Y%m%d-%H%M%S).json"
python3 "$root/bench/bench.py" --url "$bench_url" --pg-dir "$work/pg" --work "$work" \
  --relay-bin "$build/bin/outbox-relay" --bench-bin "$build/bin/outbox-bench" --out "$out" "$@"
cp "$out" "$root/bench/out/core-latest.json"
