#!/usr/bin/env bash
# A throwaway single-node Apache Kafka broker (KRaft: one process is broker and controller) on
# 127.0.0.1, for the Kafka sink's integration tests and benchmark. The jars come from Maven
# Central through tests/kafka/pom.xml into a cache outside the repository; nothing is committed.
#
#   broker.sh fetch                       resolve the jars (mvn, first run only); print the lib dir
#   broker.sh start DIR [PORT] [k=v ...]  format DIR, start, wait until ready, print 127.0.0.1:PORT
#                                         (k=v: extra server.properties lines; PORT "" = free port)
#   broker.sh stop DIR                    SIGTERM and wait (SIGKILL after 30 s)
#   broker.sh kill DIR                    SIGKILL, for crash tests
#   broker.sh restart DIR                 start again on the same port, config and data
#   broker.sh run-class CLASS ARGS...     run a class from the broker's classpath, e.g.
#                                         org.apache.kafka.tools.ProducerPerformance
#
# Env: OUTBOX_KAFKA_CACHE (default ~/.cache/outbox-relay/kafka), KAFKA_HEAP_OPTS (default
# -Xms256m -Xmx1g), KAFKA_START_TIMEOUT seconds (default 120). Needs java (17+) and, on the
# first run, mvn.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${OUTBOX_KAFKA_CACHE:-$HOME/.cache/outbox-relay/kafka}
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")
lib="$cache/lib-$version"
heap=${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}

die() { echo "broker.sh: $*" >&2; exit 1; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

fetch() {
  # The stamp is newer than the pom when the jars match it.
  if [ -f "$lib/.complete" ] && [ "$lib/.complete" -nt "$here/pom.xml" ]; then return; fi
  command -v mvn > /dev/null || die "mvn not found: install maven (Debian: apt-get install maven)"
  mkdir -p "$cache"
  rm -rf "$lib.tmp"
  echo "broker.sh: resolving Apache Kafka $version from Maven Central into $lib" >&2
  mvn -B -q -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies -DoutputDirectory="$lib.tmp" >&2 \
    || die "mvn dependency:copy-dependencies failed"
  rm -rf "$lib"
  mv "$lib.tmp" "$lib"
  touch "$lib/.complete"
}

java_run() {
  command -v java > /dev/null || die "java not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jre-headless)"
  # shellcheck disable=SC2086
  java $heap -Dlog4j2.configurationFile="$here/log4j2.properties" -cp "$lib/*" "$@"
}

alive() { [ -f "$1/pid" ] && kill -0 "$(cat "$1/pid")" 2> /dev/null; }

launch() {
  local dir=$1 port
  port=$(cat "$dir/port")
  [ -f "$dir/server.log" ] && mv "$dir/server.log" "$dir/server.log.$(date +%s%N)"
  # shellcheck disable=SC2086
  nohup java $heap -Dlog4j2.configurationFile="$here/log4j2.properties" -cp "$lib/*" \
    kafka.Kafka "$dir/server.properties" < /dev/null > "$dir/server.log" 2>&1 &
  echo $! > "$dir/pid"
  local deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-120}))
  until grep -q "Kafka Server started" "$dir/server.log" 2> /dev/null; do
    alive "$dir" || { tail -n 30 "$dir/server.log" >&2; die "the broker exited while starting (log: $dir/server.log)"; }
    [ $SECONDS -lt $deadline ] || { kill -9 "$(cat "$dir/pid")"; die "the broker did not start within ${KAFKA_START_TIMEOUT:-120}s (log: $dir/server.log)"; }
    sleep 0.2
  done
  echo "127.0.0.1:$port"
}

cmd=${1:-}
[ -n "$cmd" ] || die "usage: broker.sh fetch|start|stop|kill|restart|run-class ..."
shift
case "$cmd" in
  fetch)
    fetch
    echo "$lib"
    ;;
  start)
    dir=$(realpath -m "${1:?missing DIR}")
    port=${2:-}
    [ -n "$port" ] || port=$(free_port)
    shift $(($# < 2 ? $# : 2))
    fetch
    ! alive "$dir" || die "a broker already runs in $dir"
    mkdir -p "$dir"
    controller_port=$(free_port)
    echo "$port" > "$dir/port"
    {
      echo "process.roles=broker,controller"
      echo "node.id=1"
      echo "controller.quorum.voters=1@127.0.0.1:$controller_port"
      echo "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port"
      echo "controller.listener.names=CONTROLLER"
      echo "inter.broker.listener.name=PLAINTEXT"
      echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
      echo "log.dirs=$dir/data"
      echo "num.partitions=3"
      echo "default.replication.factor=1"
      echo "offsets.topic.replication.factor=1"
      echo "offsets.topic.num.partitions=3"
      echo "transaction.state.log.replication.factor=1"
      echo "transaction.state.log.min.isr=1"
      echo "share.coordinator.state.topic.replication.factor=1"
      echo "share.coordinator.state.topic.min.isr=1"
      echo "group.initial.rebalance.delay.ms=0"
      echo "auto.create.topics.enable=true"
      echo "num.network.threads=2"
      echo "num.io.threads=4"
      for kv in "$@"; do echo "$kv"; done
    } > "$dir/server.properties"
    cluster_id=$(java_run kafka.tools.StorageTool random-uuid 2> /dev/null | tail -n 1)
    java_run kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" > "$dir/format.log" 2>&1 \
      || { cat "$dir/format.log" >&2; die "formatting $dir failed"; }
    launch "$dir"
    ;;
  restart)
    dir=$(realpath -m "${1:?missing DIR}")
    [ -f "$dir/server.properties" ] || die "no broker was started in $dir"
    ! alive "$dir" || die "the broker in $dir is still running"
    fetch
    launch "$dir"
    ;;
  stop)
    dir=$(realpath -m "${1:?missing DIR}")
    if alive "$dir"; then
      pid=$(cat "$dir/pid")
      kill -TERM "$pid"
      for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2> /dev/null; then kill -KILL "$pid"; fi
    fi
    ;;
  kill)
    dir=$(realpath -m "${1:?missing DIR}")
    if alive "$dir"; then
      pid=$(cat "$dir/pid")
      kill -KILL "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.05; done
    fi
    ;;
  run-class)
    fetch
    java_run "$@"
    ;;
  *)
    die "unknown command '$cmd' (fetch|start|stop|kill|restart|run-class)"
    ;;
esac
