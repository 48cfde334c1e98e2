#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the quickstart, tests and benchmarks.
#   pg-cluster.sh start DIR [PORT]   initdb into DIR/data, start on 127.0.0.1, print the URL
#   pg-cluster.sh stop DIR           stop it (the directory stays; rm -rf it yourself)
#   pg-cluster.sh restart DIR        pg_ctl restart -m fast
# Runs the server as the 'postgres' user when called as root (initdb refuses root).
# PG_FAST=1 turns fsync off (tests only: a crash of the machine would lose the cluster).
set -euo pipefail
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
cmd=${1:?usage: pg-cluster.sh start|stop|restart DIR [PORT]}
dir=$(realpath -m "${2:?missing DIR}")

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

case "$cmd" in
  start)
    port=${3:-$(free_port)}
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    password=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
    umask 077
    printf '%s\n' "$password" > "$dir/pwfile"
    [ "$(id -u)" = 0 ] && chown postgres "$dir/pwfile"
    as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" -E UTF8 --no-locale \
      --auth-local=trust --auth-host=scram-sha-256 > "$dir/initdb.log" 2>&1
    {
      echo "listen_addresses = '127.0.0.1'"
      echo "port = $port"
      echo "unix_socket_directories = '$dir'"
      echo "max_connections = 200"
      echo "max_prepared_transactions = 20"
      echo "shared_buffers = 256MB"
      if [ "${PG_FAST:-0}" = 1 ]; then echo "fsync = off"; echo "synchronous_commit = off"; fi
    } >> "$dir/data/postgresql.conf"
    as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start > /dev/null
    url="postgresql://postgres:$password@127.0.0.1:$port/postgres"
    printf '%s\n' "$url" > "$dir/url"
    echo "$url"
    ;;
  stop)
    [ -d "$dir/data" ] && as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop > /dev/null 2>&1 || true
    ;;
  restart)
    as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart > /dev/null
    ;;
  *)
    echo "usage: pg-cluster.sh start|stop|restart DIR [PORT]" >&2
    exit 2
    ;;
esac
