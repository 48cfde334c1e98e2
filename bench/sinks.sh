#!/usr/bin/env bash
# Every sink beside its broker's own benchmark tool and the file sink, in one run (issue 30):
#   bench/sinks.sh [--relay-bin PATH] [sinks.py options: --sinks kafka,nats,rabbitmq,redis,webhook
#                  --events 200000 --rounds 3 --no-steady --relay-bin-old PATH --compare-sinks ...]
# Builds outbox-relay (Release, in build-bench/; --relay-bin PATH measures a given binary), starts
# a throwaway PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh, without PG_FAST), and
# runs bench/sinks.py with the test venv's Python, which starts each broker as the tests and the
# sink benchmarks do. The tools install once, from the registries, into ~/.cache/outbox-relay/:
#   natscli v0.5.0 (nats bench) and hey v0.1.5       go install, through the Go module proxy
#   RabbitMQ PerfTest 2.22.1                         mvn, bench/sinks/perf-test.pom.xml
#   Kafka's ProducerPerformance                      tests/kafka/broker.sh's jars (kafka-tools)
#   redis-benchmark                                  Debian's redis-tools (with redis-server)
# Prints the table and writes bench/out/sinks-<time>.json (and bench/out/sinks-latest.json).
# Cleans up after itself, also on failure or Ctrl-C. Needs what scripts/install-deps.sh installs
# (go, java, mvn, the brokers, the venv).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}/bin/python
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}
natscli_version=v0.5.0
hey_version=v0.1.5
perf_test_version=$(sed -n 's:.*<perf-test.version>\(.*\)</perf-test.version>.*:\1:p' "$root/bench/sinks/perf-test.pom.xml")

relay_bin=
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --relay-bin) relay_bin=${2:?--relay-bin needs a path}; shift 2 ;;
    --relay-bin=*) relay_bin=${1#*=}; shift ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
      [ -x "$python" ] && "$python" "$root/bench/sinks.py" --help | sed -n '/^options:/,$p'
      exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

if [ -z "$relay_bin" ]; then
  build=${BENCH_BUILD_DIR:-$root/build-bench}
  echo "[bench-sinks] building in $build" >&2
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$build/bench-cmake.log" 2>&1 \
    || { cat "$build/bench-cmake.log" >&2; exit 1; }
  ninja -C "$build" -j2 outbox-relay >&2
  relay_bin=$build/bin/outbox-relay
fi
"$python" -c 'import psycopg, confluent_kafka, nats, pika, redis' 2> /dev/null \
  || { echo "[bench-sinks] the venv lacks psycopg/confluent-kafka/nats-py/pika/redis: run scripts/install-deps.sh" >&2; exit 1; }
for tool in go java mvn nats-server redis-server redis-benchmark /usr/lib/rabbitmq/bin/rabbitmq-server; do
  command -v "$tool" > /dev/null || { echo "[bench-sinks] $tool not found: run scripts/install-deps.sh" >&2; exit 1; }
done

# The tools, once (idempotent: a stamp per version).
mkdir -p "$cache/bin"
go_tool() {  # go_tool NAME MODULE VERSION: $cache/bin/NAME-VERSION
  local name=$1 module=$2 version=$3
  [ -x "$cache/bin/$name-$version" ] && return
  echo "[bench-sinks] installing $module@$version into $cache/bin" >&2
  local tmp
  tmp=$(mktemp -d)
  GOBIN=$tmp GOFLAGS=-mod=mod go install "$module@$version" >&2
  mv "$tmp/$name" "$cache/bin/$name-$version"
  rm -rf "$tmp"
}
go_tool nats github.com/nats-io/natscli/nats "$natscli_version"
go_tool hey github.com/rakyll/hey "$hey_version"
perf_test_lib=$cache/perf-test/lib-$perf_test_version
if [ ! -f "$perf_test_lib/.complete" ]; then
  echo "[bench-sinks] resolving RabbitMQ PerfTest $perf_test_version from Maven Central into $perf_test_lib" >&2
  rm -rf "$perf_test_lib.tmp"
  mvn -B -q -Dstyle.color=never -f "$root/bench/sinks/perf-test.pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$perf_test_lib.tmp" >&2
  rm -rf "$perf_test_lib"
  mv "$perf_test_lib.tmp" "$perf_test_lib"
  touch "$perf_test_lib/.complete"
fi
"$root/tests/kafka/broker.sh" fetch > /dev/null

work=$(mktemp -d /tmp/outbox-bench-sinks.XXXXXX)
chmod 755 "$work"
cleanup() {
  if [ -n "${out:-}" ] && [ -d "$work/logs" ]; then
    mkdir -p "${out%.json}.logs"
    cp -r "$work/logs/." "${out%.json}.logs/" || true
  fi
  # sinks.py stops the brokers it started; this is for a Kafka broker left by a killed run.
  "$root/tests/kafka/broker.sh" stop "$work/kafka" > /dev/null 2>&1 || true
  "$root/scripts/pg-cluster.sh" stop "$work/pg" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench-sinks] building the webhook receiver (bench/webhook/receiver)" >&2
(cd "$root/bench/webhook/receiver" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -o "$work/receiver" .)

echo "[bench-sinks] starting PostgreSQL (fsync on) in $work/pg" >&2
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$work/pg")
psql -X -q "$url" -c "CREATE DATABASE bench"
bench_url="${url%/*}/bench"

mkdir -p "$root/bench/out"
out="$root/bench/out/sinks-$(date +%Y%m%d-%H%M%S).json"
"$python" "$root/bench/sinks.py" --url "$bench_url" --work "$work" --pg-dir "$work/pg" --relay-bin "$relay_bin" \
  --nats-cli "$cache/bin/nats-$natscli_version" --hey "$cache/bin/hey-$hey_version" --hey-version "$hey_version" \
  --perf-test-lib "$perf_test_lib" --receiver-bin "$work/receiver" --out "$out" "${args[@]}"
cp "$out" "$root/bench/out/sinks-latest.json"
