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
      libcpp-httplib-dev libssl-dev
      librabbitmq-dev)
if [ "$runtime_only" = 0 ]; then
  pkgs+=(postgresql-15 python3 python3-venv openssl)
  # scripts/build.sh compiles through ccache (cache outside the repo) when it is there: the test
  # command builds three trees (plain, ASan+UBSan, TSan) on every fresh clone.
  pkgs+=(ccache)
  # tests/kafka/broker.sh: an Apache Kafka broker resolved from Maven Central by mvn, run on Java 17.
  pkgs+=(maven openjdk-17-jre-headless)
  # tests/ops/check-packaging.sh: `docker-compose config` validates docker-compose.yml (no daemon).
  pkgs+=(docker-compose)
  # tests/integration/rabbitmq_fixtures.py: a RabbitMQ node per test module (its own ports and dir).
  pkgs+=(rabbitmq-server)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The tests start their own RabbitMQ nodes: the package's system service must not run (where
  # systemd is the init, the package has just started and enabled it).
  if [[ " ${missing[*]} " == *" rabbitmq-server "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now rabbitmq-server > /dev/null 2>&1 || true
  fi
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
