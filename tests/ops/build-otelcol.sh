#!/usr/bin/env bash
# Builds the OpenTelemetry Collector that tests/integration/test_spans.py sends the relay's spans
# to (tests/ops/otelcol: the OTLP receiver and the file exporter, collector release v0.161.0) from
# the Go module proxy into ${OUTBOX_OTELCOL_CACHE:-~/.cache/outbox-relay/otelcol}/<hash of that
# module's files and the Go version>/otelcol, reused while that hash holds. Prints the binary's
# path as its last line. The Go module cache is Go's default, shared with tests/ops/check-helm.sh.
#
#   tests/ops/build-otelcol.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
module=$root/tests/ops/otelcol
cache=${OUTBOX_OTELCOL_CACHE:-$HOME/.cache/outbox-relay/otelcol}
go=$(command -v go || true)
[ -z "$go" ] && [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go
[ -n "$go" ] || { echo "no go toolchain (the collector is built from the Go module proxy)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
key=$( (cd "$module" && cat go.mod go.sum ./*.go && "$go" version) | sha256sum | cut -c1-16)
bin=$cache/$key/otelcol
if [ ! -x "$bin" ]; then
  echo "building the OpenTelemetry Collector (tests/ops/otelcol) into $cache/$key (minutes on a cold Go cache)" >&2
  start=$(date +%s)
  mkdir -p "$cache"
  rm -rf "$cache/$key.tmp"
  mkdir -p "$cache/$key.tmp"
  log=$cache/$key.tmp/build.log
  # -s -w: no symbol tables or DWARF (less to link).
  if ! (cd "$module" && "$go" build -trimpath -ldflags "-s -w" -o "$cache/$key.tmp/otelcol" .) > "$log" 2>&1; then
    cat "$log" >&2
    echo "go build of tests/ops/otelcol failed" >&2
    exit 1
  fi
  rm -rf "${cache:?}/$key"
  mv "$cache/$key.tmp" "$cache/$key"
  # Other keys' builds are of older versions of these files: drop them.
  find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
  echo "built the collector in $(($(date +%s) - start)) s" >&2
fi
echo "$bin"
