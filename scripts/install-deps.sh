#!/usr/bin/env bash
# Installs what outbox-relay needs on Debian bookworm, in three profiles:
#   --runtime-build  building the relay: compiler, cmake, ninja, ccache and the -dev libraries it
#                    links (the Dockerfile's build stage)
#   --quickstart     that, plus PostgreSQL 15 and python3 for scripts/pg-cluster.sh's throwaway
#                    cluster (scripts/quickstart.sh)
#   (none)           everything the test command needs besides: brokers, buildah, the Python venv,
#                    the writer examples' toolchains, promtool, clang-format and clang-tidy
#                    (scripts/test.sh, .ci/run)
# Idempotent, and silent when everything is there already.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

profile=all
case "${1:-}" in
  --runtime-build) profile=build ;;
  --quickstart) profile=quickstart ;;
  "") ;;
  *) echo "usage: install-deps.sh [--runtime-build|--quickstart]" >&2; exit 2 ;;
esac

pkgs=(build-essential cmake ninja-build pkg-config
      libpqxx-dev libpq-dev librdkafka-dev nlohmann-json3-dev prometheus-cpp-dev
      libcurl4-openssl-dev libyaml-cpp-dev libcli11-dev
      libcpp-httplib-dev libssl-dev libhiredis-dev libnats-dev librabbitmq-dev
      # CMake configures the unit tests too (header-only, 0.1 MB).
      doctest-dev
      # scripts/build.sh compiles through ccache (cache outside the repo) when it is there: the test
      # command builds three trees (plain, ASan+UBSan, TSan) on every fresh clone, and the
      # Dockerfile's build stage keeps a compiler cache between image builds.
      ccache)
if [ "$profile" != build ]; then
  # scripts/pg-cluster.sh: initdb/pg_ctl of PostgreSQL 15 (psql comes with it), python3 for a
  # free port and the password.
  pkgs+=(postgresql-15 python3)
fi
if [ "$profile" = all ]; then
  pkgs+=(python3-venv openssl)
  # scripts/check-style.sh: the formatting and the static checks (.clang-format, .clang-tidy).
  pkgs+=(clang-format clang-tidy)
  # tests/image/check.sh: builds the Dockerfile without a Docker daemon (buildah, chroot isolation)
  # on a debian:bookworm base made by debootstrap, and runs the image in a private network namespace.
  pkgs+=(buildah debootstrap debian-archive-keyring iproute2)
  # tests/kafka/broker.sh: an Apache Kafka broker resolved from Maven Central by mvn, run on Java 17.
  pkgs+=(maven openjdk-17-jre-headless)
  # tests/integration/test_kafka_exactly_once.py: a second read_committed consumer (kcat -X
  # isolation.level=read_committed) beside the Python one.
  pkgs+=(kcat)
  # tests/integration/test_ops.py: a partition without a reset (packets dropped on lo by iptables).
  pkgs+=(iptables)
  # tests/ops/check-packaging.sh: `docker-compose config` validates docker-compose.yml (no daemon).
  pkgs+=(docker-compose)
  # tests/integration/test_poolers.py: a real PgBouncer in session and transaction pool modes,
  # started by the tests on a free port (the package's own service is not used).
  pkgs+=(pgbouncer)
  # tests/integration/test_redis.py starts its own redis-server on a free port (see below: the
  # package's own service is kept from starting).
  pkgs+=(redis-server)
  # tests/integration/nats_fixtures.py and bench/nats: the tests start their own server with
  # JetStream; the package's system service must not run (see policy-rc.d below).
  pkgs+=(nats-server)
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
  # Server packages (redis-server, nats-server, rabbitmq-server) would start a system-wide instance: the tests run their own.
  # policy-rc.d (exit 101) keeps invoke-rc.d from starting it during the install.
  no_start=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d > /dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    no_start=1
  fi
  rc=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" || rc=$?
  if [ "$no_start" = 1 ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
  [ "$rc" = 0 ] || exit "$rc"
  # ... and not at boot either.
  for service in redis-server nats-server rabbitmq-server; do
    if [ -d /run/systemd/system ] && systemctl is-enabled "$service" > /dev/null 2>&1; then
      $SUDO systemctl disable --now "$service" > /dev/null 2>&1 || true
    fi
  done
fi

if [ "$profile" = all ]; then
  # Python tooling for the integration tests, in a venv outside the repo.
  venv="${OUTBOX_VENV:-$HOME/.cache/outbox-relay/venv}"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/tests/integration/requirements.txt"
fi

if [ "$profile" = all ]; then "$here/examples/install.sh" --if-available; fi  # writer examples, see examples/

if [ "$profile" = all ]; then
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
