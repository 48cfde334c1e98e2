#!/usr/bin/env bash
# The whole test suite on a fresh Debian bookworm machine: installs what it needs, builds with
# warnings as errors, runs the unit tests (also under ASan+UBSan and under TSan) and the integration tests
# (each starts its own PostgreSQL cluster, Kafka broker and HTTP receivers on 127.0.0.1).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

echo "== installing dependencies"
scripts/install-deps.sh

echo "== every relative link of the Markdown files resolves"
python3 scripts/check-links.py

echo "== relay/src/core/ headers compile alone and include no third-party header but nlohmann_json"
python3 scripts/check-core-headers.py

echo "== style: clang-format, 120 columns, final newlines, no trailing blanks"
scripts/check-style.sh format

echo "== building (warnings are errors)"
BUILD_DIR=$here/build scripts/build.sh -DOUTBOX_WERROR=ON

echo "== clang-tidy over the relay/src files the last commit changed (all of them: 4.5 min on 2 cores)"
scripts/check-style.sh tidy build

echo "== unit tests"
build/bin/unit_tests

echo "== the README's first command: scripts/quickstart.sh for 4 s, every event printed once, in order"
tests/ops/check-quickstart.py 4

echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
BUILD_DIR=$here/build-asan BUILD_TARGETS=unit_tests BUILD_TYPE=Debug scripts/build.sh -DOUTBOX_WERROR=ON -DOUTBOX_SANITIZE=ON
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build-asan/bin/unit_tests

echo "== unit tests under ThreadSanitizer (the pipelined drain's helper threads)"
BUILD_DIR=$here/build-tsan BUILD_TARGETS=unit_tests BUILD_TYPE=Debug scripts/build.sh -DOUTBOX_WERROR=ON -DOUTBOX_TSAN=ON
# The tests that start librdkafka producers (suites kafka-mock and librdkafka) are left out here:
# librdkafka comes from Debian, not built with TSan, and runs its own threads whose
# synchronisation TSan cannot see, so it reports races inside librdkafka that are not ours (those
# tests run in the two builds above).
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/bin/unit_tests -tse=kafka-mock,librdkafka

if [ -x tests/ops/check-packaging.sh ]; then
  echo "== packaging checks"
  tests/ops/check-packaging.sh
fi

echo "== the Helm chart: helm lint --strict, helm template, the rendered manifests against the Kubernetes types offline"
# helm v4.3.2 and tests/ops/k8s-validate come from the Go module proxy, built by one go build
# (about 3 minutes on a cold Go cache, then cached in ~/.cache/outbox-relay/helm).
tests/ops/check-helm.sh

echo "== container image: the Dockerfile built with buildah (no Docker daemon) and run;" \
  "meanwhile the OpenTelemetry Collector that tests/integration/test_spans.py exports spans to"
# The collector is built from the Go module proxy (tests/ops/otelcol, collector v0.161.0): about
# 5 minutes on a cold Go cache on 2 cores, then cached in ~/.cache/outbox-relay/otelcol (the
# fixture reuses it). In the background beside the image, whose build waits on the network much
# of the time; done before the fuzzer, whose timing it would disturb.
otelcol_log=$(mktemp)
tests/ops/build-otelcol.sh > "$otelcol_log" 2>&1 &
otelcol_pid=$!
tests/image/check.sh
if ! wait "$otelcol_pid"; then
  cat "$otelcol_log"
  echo "FAIL: tests/ops/build-otelcol.sh"
  exit 1
fi
echo "the collector: $(tail -n 1 "$otelcol_log")"
rm -f "$otelcol_log"

venv="${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}"
echo "== the ordering fuzzer: writer behaviours, relay kills and Postgres restarts for 80 s, a fresh seed"
# tests/fuzz/README.md; a failure prints the seed and the history that shows it. Its own checker's
# unit tests first (hand-made histories, no database).
"$venv/bin/pytest" -q -p no:cacheprovider tests/fuzz/test_checker.py
# The sinks come from the seed: a real Kafka broker in 1 run of 5 (at least once or exactly once),
# else failing webhooks in 9 runs of 10 and file sinks in the rest.
"$venv/bin/python" tests/fuzz/fuzz.py --seconds 80 --relay-bin "$here/build/bin/outbox-relay"

echo "== integration tests"
OUTBOX_RELAY_BIN=$here/build/bin/outbox-relay "$venv/bin/pytest" -q -p no:cacheprovider tests/integration "$@"
