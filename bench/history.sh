#!/usr/bin/env bash
# A drain beside a long history (issue 45, part 2): does a claim slow down when the table keeps
# millions of processed rows (mark mode, the default)?
#   bench/history.sh [--relay-bin BIN] [--history 3000000] [--backlog 100000] [--rounds 3]
#                    [--big-backlog 1000000] [--shared-buffers 128MB] [--no-settle]
# What: one throwaway PostgreSQL 15 cluster (fsync on, shared_buffers as given), two databases
# migrated by the binary under test: `empty` and `hist`. hist's history is made the way a real
# one is: events inserted by writers (transactions of 1,000 rows) and drained by `outbox-relay run`
# (its own marks set processed_at), --history of them; then autovacuum is left to do what it does:
# the rounds start once it has cleared the history's dead row versions (n_dead_tup below 5 % of
# --history, as in a table whose history grew over days), or at once with --no-settle (the
# vacuum debt of 3 million marks made a minute before, measured in the first run).
# Each round drains a backlog of --backlog events in each database, alternating (empty first in odd
# rounds, hist first in even ones): the backlog is committed while no relay runs (transactions of
# 1,000 rows), then the relay starts; the time is from its "ordering lanes rebalanced" log line to
# the moment no row is pending (polled every 50 ms through the pending index's predicate). Sink: a
# file without fsync on /dev/null, default relay config. empty is truncated before each of its
# drains. Then, in `empty`, one --big-backlog drain against one --backlog drain, as events/s.
# Prints every drain (seconds, events/s, dead tuples of the table when it started) and the ratios
# hist/empty of the rounds' events/s; the targets are issue 45's (>= 0.9 beside the history,
# >= 0.95 for the big backlog). Run it on a quiet machine; it takes about 5 minutes with the
# defaults. Cleans up (relay stopped, cluster stopped and removed) also on failure or Ctrl-C.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
relay_bin=$here/build/bin/outbox-relay
history=3000000 backlog=100000 rounds=3 big=1000000 shared_buffers=128MB settle=1
while [ $# -gt 0 ]; do
  case "$1" in
    --relay-bin) relay_bin=$2; shift 2 ;;
    --history) history=$2; shift 2 ;;
    --backlog) backlog=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --big-backlog) big=$2; shift 2 ;;
    --shared-buffers) shared_buffers=$2; shift 2 ;;
    --no-settle) settle=0; shift ;;
    *) echo "bench/history.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/outbox-history-XXXXXX)
chmod 755 "$work"  # the cluster runs as postgres
cp "$relay_bin" "$work/outbox-relay"  # a rebuild meanwhile cannot mix versions
relay_pid=
cleanup() {
  [ -n "$relay_pid" ] && kill "$relay_pid" 2> /dev/null && wait "$relay_pid" 2> /dev/null
  "$here/scripts/pg-cluster.sh" stop "$work/cluster" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

url=$("$here/scripts/pg-cluster.sh" start "$work/cluster")
port=${url##*:}; port=${port%%/*}
export PGPASSWORD; PGPASSWORD=$(cat "$work/cluster/pwfile")
psql_db() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$1" "${@:2}"; }
psql_db postgres -c "ALTER SYSTEM SET shared_buffers = '$shared_buffers'"
"$here/scripts/pg-cluster.sh" restart "$work/cluster" > /dev/null
psql_db postgres -c "CREATE DATABASE empty" -c "CREATE DATABASE hist"
for db in empty hist; do DATABASE_URL=${url%/*}/$db "$work/outbox-relay" migrate > /dev/null; done
cat > "$work/config.yaml" << 'YAML'
http: {enabled: false}
sinks: [{name: out, type: file, path: /dev/null, fsync: false}]
YAML

pending() {  # through the pending index's predicate (processed_at IS NULL alone would scan the table)
  psql_db "$1" -tAc "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_lettered_at IS NULL"
}
insert() {  # db count: writers' transactions of 1,000 events (keys k0..k999, ~140-byte payloads)
  local done=0
  while [ "$done" -lt "$2" ]; do
    psql_db "$1" -c "INSERT INTO outbox_events (topic, aggregate_id, payload)
      SELECT 'order.paid', 'k' || (g % 1000), jsonb_build_object('n', g, 'amount', g % 9973, 'note', repeat('x', 100))
        FROM generate_series($done + 1, $done + 1000) g"
    done=$((done + 1000))
  done
}
drain() {  # db label: prints "label db seconds events/s dead_tuples"
  local n dead log=$work/relay-$1-$2.log
  n=$(pending "$1")
  dead=$(psql_db "$1" -tAc "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_events'")
  DATABASE_URL=${url%/*}/$1 "$work/outbox-relay" run --config "$work/config.yaml" > "$log" 2>&1 &
  relay_pid=$!
  until grep -q "ordering lanes rebalanced" "$log"; do sleep 0.02; done
  local t0 t1; t0=$(date +%s.%N)
  while [ "$(pending "$1")" != 0 ]; do sleep 0.05; done
  t1=$(date +%s.%N)
  kill "$relay_pid"; wait "$relay_pid" || true; relay_pid=
  awk -v l="$2" -v d="$1" -v a="$t0" -v b="$t1" -v n="$n" -v dead="$dead" \
    'BEGIN { printf "%s %s %.3f %.0f %s\n", l, d, b - a, n / (b - a), dead }'
}

echo "history: $history events into hist, drained by the relay ($(date +%H:%M:%S))" >&2
insert hist "$history"
drain hist history > /dev/null
dead_tuples() { psql_db "$1" -tAc "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_events'"; }
if [ "$settle" = 1 ]; then
  settled=$(date +%s)
  echo "waiting for autovacuum to clear the history's dead row versions ($(dead_tuples hist) now)" >&2
  while [ "$(dead_tuples hist)" -gt $((history / 20)) ]; do
    [ $(($(date +%s) - settled)) -gt 900 ] && { echo "autovacuum did not settle within 15 minutes" >&2; exit 1; }
    sleep 5
  done
  echo "autovacuum settled after $(($(date +%s) - settled)) s: $(dead_tuples hist) dead row versions" >&2
fi
echo "rounds: $rounds x $backlog events per database, alternating ($(date +%H:%M:%S))" >&2
results=$work/results
for r in $(seq 1 "$rounds"); do
  order="empty hist"; [ $((r % 2)) = 0 ] && order="hist empty"
  for db in $order; do
    [ "$db" = empty ] && psql_db empty -c "TRUNCATE outbox_events"
    insert "$db" "$backlog"
    drain "$db" "round$r" | tee -a "$results"
  done
done
echo "big backlog: $big against $backlog in empty ($(date +%H:%M:%S))" >&2
for n in "$backlog" "$big"; do
  psql_db empty -c "TRUNCATE outbox_events"
  insert empty "$n"
  drain empty "backlog$n" | tee -a "$results"
done
echo
echo "| drain | database | seconds | events/s | dead tuples at start |"
echo "| --- | --- | ---: | ---: | ---: |"
awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$results"
awk '$1 ~ /^round/ { rate[$1 " " $2] = $4; rounds[$1] = 1 }
     $1 ~ /^backlog/ { big[++nb] = $4 }
     END {
       for (r in rounds) printf "%s: hist/empty %.2f\n", r, rate[r " hist"] / rate[r " empty"]
       if (nb == 2) printf "big backlog / backlog (events/s): %.2f\n", big[2] / big[1]
     }' "$results" | sort
