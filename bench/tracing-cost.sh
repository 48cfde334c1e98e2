#!/usr/bin/env bash
# The cost of the relay's spans (issue 46, part 3): bench/steady.sh's paced runs for a binary
# without tracing (BEFORE, e.g. a Release build of main), this branch's binary with tracing off,
# and the same with tracing on, exporting to a real OpenTelemetry Collector (tests/ops/otelcol,
# OTLP/HTTP in, spans to a file), in rounds, one after the other in one run.
#
#   bench/tracing-cost.sh BEFORE_BIN AFTER_BIN [ROUNDS] [steady.py options]
#   e.g. bench/tracing-cost.sh /tmp/main/bin/outbox-relay build-bench/bin/outbox-relay 2 --rates 1000,5000
#
# With tracing on, root_spans: true gives every event a span (pgbench's rows carry no traceparent):
# the cost of a span per event, the most the relay builds. The collector's own CPU is not counted
# (it is not the relay's), but it runs on the same cores. Prints each steady.sh report and
# leaves their JSON in bench/out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before=$1 after=$2 rounds=${3:-1}
shift 2
[ $# -gt 0 ] && shift
work=$(mktemp -d)
collector_pid=
cleanup() {
  [ -n "$collector_pid" ] && kill "$collector_pid" 2> /dev/null && wait "$collector_pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
otelcol=$("$root/tests/ops/build-otelcol.sh" | tail -n1)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/otelcol.yaml" << EOF2
receivers: {otlp: {protocols: {http: {endpoint: "127.0.0.1:$port"}}}}
exporters: {file: {path: "$work/spans.jsonl"}}
service:
  telemetry: {metrics: {level: none}, logs: {level: warn}}
  pipelines: {traces: {receivers: [otlp], exporters: [file]}}
EOF2
"$otelcol" --config "$work/otelcol.yaml" > "$work/otelcol.log" 2>&1 &
collector_pid=$!
steady=(bash "$root/bench/steady.sh" --burst-seconds 0 --idle-seconds 0 --wakeup-count 0 "$@")
for round in $(seq "$rounds"); do
  echo "=== round $round: before (no tracing in the binary)"
  "${steady[@]}" --relay-bin "$before"
  echo "=== round $round: after, tracing off"
  "${steady[@]}" --relay-bin "$after"
  echo "=== round $round: after, tracing on (root_spans: a span per event) -> collector on 127.0.0.1:$port"
  "${steady[@]}" --relay-bin "$after" --relay-tracing "otlp_endpoint: http://127.0.0.1:$port; root_spans: true"
done
echo "spans the collector wrote: $(grep -o '"spanId"' "$work/spans.jsonl" | wc -l)"
