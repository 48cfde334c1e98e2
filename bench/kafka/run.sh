#!/usr/bin/env bash
# The Kafka sink benchmark of issue 3, in one command:
#   bench/kafka/run.sh [bench.py options, e.g. --rounds 3 --latency-seconds 60]
#   bench/kafka/run.sh --eos [eos_cost.py options]: what exactly_once: true costs (issue 44)
# BENCH_RELAY_BIN=path (--eos only): that relay binary instead of a Release build.
# BENCH_KAFKA_PROPS="k=v ...": extra lines for the broker's server.properties (a diagnosis).
# Builds outbox-relay and outbox-bench (Release, in build-bench-kafka/), starts a throwaway
# PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh) and a throwaway Apache Kafka broker
# (tests/kafka/broker.sh: KRaft, jars from Maven Central on first use), runs bench/kafka/bench.py
# with the test venv's Python (psycopg, confluent-kafka), prints the table and writes
# bench/out/kafka-<time>.json (and bench/out/kafka-latest.json). Cleans up after itself, also on
# failure or Ctrl-C. Needs what scripts/install-deps.sh installs (java 17 and mvn among it).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BENCH_BUILD_DIR:-$root/build-bench-kafka}
python=${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python

relay_bin=${BENCH_RELAY_BIN:-$build/bin/outbox-relay}
if [ -z "${BENCH_RELAY_BIN:-}" ]; then
  echo "[bench-kafka] building in $build" >&2
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
    || { cat "$build/bench-cmake.log" >&2; exit 1; }
  ninja -C "$build" -j2 outbox-relay outbox-bench >&2
fi
"$python" -c 'import psycopg, confluent_kafka' 2> /dev/null \
  || { echo "[bench-kafka] the venv lacks psycopg/confluent-kafka: run scripts/install-deps.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/outbox-bench-kafka.XXXXXX)
chmod 755 "$work"
cleanup() {
  # Keep the relay and broker logs next to the results (bench/out is not committed).
  if [ -n "${out:-}" ] && [ -d "$work/logs" ]; then
    mkdir -p "${out%.json}.logs"
    cp -r "$work/logs/." "${out%.json}.logs/" || true
    cp "$work/kafka/server.log" "${out%.json}.logs/kafka-server.log" 2> /dev/null || true
  fi
  "$root/tests/kafka/broker.sh" stop "$work/kafka" || true
  "$root/scripts/pg-cluster.sh" stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench-kafka] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
psql -X -q "$url" -c "CREATE DATABASE bench"
bench_url="${url%/*}/bench"
echo "[bench-kafka] starting Apache Kafka in $work/kafka" >&2
# BENCH_KAFKA_PROPS="k=v ...": extra server.properties lines (a diagnosis; say so with the figures).
# shellcheck disable=SC2086
brokers=$("$root/tests/kafka/broker.sh" start "$work/kafka" "" ${BENCH_KAFKA_PROPS:-})

mkdir -p "$root/bench/out"
if [ "${1:-}" = --eos ]; then
  # issue 44: exactly_once: true beside the at-least-once sink (bench/kafka/eos_cost.py).
  shift
  out="$root/bench/out/kafka-eos-$(date +%Y%m%d-%H%M%S).json"
  "$python" "$root/bench/kafka/eos_cost.py" --url "$bench_url" --brokers "$brokers" --work "$work" \
    --broker-pid-file "$work/kafka/pid" --relay-bin "$relay_bin" --out "$out" "$@"
  exit 0
fi
out="$root/bench/out/kafka-$(date +%Y%m%d-%H%M%S).json"
"$python" "$root/bench/kafka/bench.py" --url "$bench_url" --brokers "$brokers" --work "$work" \
  --relay-bin "$build/bin/outbox-relay" --bench-bin "$build/bin/outbox-bench" --out "$out" "$@"
cp "$out" "$root/bench/out/kafka-latest.json"
