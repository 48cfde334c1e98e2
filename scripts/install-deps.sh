#!/usr/bin/env bash
# Installs everything outbox-relay needs to build and test on Debian bookworm.
# Used by the README's commands, .ci/run and the Dockerfile. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

runtime_only=0
[ "${1:-}" = "--runtime-build" ] && runtime_only=1

pkgs=(build-essential cmake ninja-build pkg-config
      libpqxx-dev libpq-dev librdkafka-dev nlohmann-json3-dev prometheus-cpp-dev doctest-dev
      libcurl4-openssl-dev libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev
      libcpp-httplib-dev libssl-dev)
# The nats sink: nats.c (NATS and JetStream C client).
pkgs+=(libnats-dev)
if [ "$runtime_only" = 0 ]; then
  pkgs+=(postgresql-15 python3 python3-venv openssl)
  # scripts/build.sh compiles through ccache (cache outside the repo) when it is there: the test
  # command builds three trees (plain, ASan+UBSan, TSan) on every fresh clone.
  pkgs+=(ccache)
  # tests/kafka/broker.sh: an Apache Kafka broker resolved from Maven Central by mvn, run on Java 17.
  pkgs+=(maven openjdk-17-jre-headless)
  # tests/ops/check-packaging.sh: `docker-compose config` validates docker-compose.yml (no daemon).
  pkgs+=(docker-compose)
  # tests/integration/nats_fixtures.py and bench/nats: the tests start their own server with
  # JetStream; the package's system service must not run (see policy-rc.d below).
  pkgs+=(nats-server)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  # Servers the tests start themselves (nats-server, ...) must not start as system services when
  # their package is installed: a policy-rc.d that says "no" while this install runs (101: action
  # forbidden), if the machine has none of its own.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" > /dev/null
    $SUDO chmod 755 "$policy"
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || { [ -z "$policy" ] || $SUDO rm -f "$policy"; exit 1; }
  [ -z "$policy" ] || $SUDO rm -f "$policy"
fi
if [ "$runtime_only" = 0 ] && [ -d /run/systemd/system ] && systemctl is-enabled nats-server > /dev/null 2>&1; then
  # Nor at the next boot.
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO systemctl disable --now nats-server > /dev/null 2>&1 || true
fi

if [ "$runtime_only" = 0 ]; then
  # Python tooling for the integration tests, in a venv outside the repo.
  venv="${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/tests/integration/requirements.txt"
fi

if [ "$runtime_only" = 0 ]; then
  # promtool for tests/ops/check-packaging.sh, unpacked from Debian's prometheus package into a
  # cache dir outside the repo: installing the package would also install and start a server.
  tools="${OUTBOX_TOOLS:-$HOME/.cache/outbox-relay/bin}"
  if ! command -v promtool > /dev/null && [ ! -x "$tools/promtool" ]; then
    tmp=$(mktemp -d)
    chmod 1777 "$tmp"  # apt's download sandbox user writes here
    if ! (cd "$tmp" && apt-get download -qq prometheus) 2> "$tmp/err"; then
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO=sudo
      $SUDO apt-get update -qq
      (cd "$tmp" && apt-get download -qq prometheus) 2> "$tmp/err" || true
    fi
    deb=$(ls "$tmp"/prometheus_*.deb 2> /dev/null | head -n1 || true)
    if [ -n "$deb" ] && mkdir -p "$tools" && dpkg-deb --fsys-tarfile "$deb" | tar -x -O ./usr/bin/promtool > "$tools/promtool.new"; then
      chmod 755 "$tools/promtool.new"
      mv "$tools/promtool.new" "$tools/promtool"
    else
      echo "install-deps: promtool not available; tests/ops/check-packaging.sh falls back to a schema check" >&2
      grep -v unsandboxed "$tmp/err" >&2 || true
      rm -f "$tools/promtool.new"
    fi
    rm -rf "$tmp"
  fi
fi
