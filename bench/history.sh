#!/usr/bin/env bash
# A drain beside a long history (issue 45, part 2): does a claim slow down when the table keeps
# millions of processed rows (mark mode, the default)?
#   bench/history.sh [--relay-bin BIN] [--history 3000000] [--backlog 100000] [--rounds 3]
#                    [--big-backlog 1000000] [--shared-buffers 128MB] [--no-settle]
#                    [--probe exists|count] [--statements] [--explain FILE]
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
# the moment no row is pending (polled every 50 ms through the pending index: with --probe exists,
# the default, whether any row is; --probe count counts them, as the first runs did). Sink: a
# file without fsync on /dev/null, default relay config. empty is truncated before each of its
# drains. Then, in `empty`, one --big-backlog drain against one --backlog drain, as events/s.
# Prints every drain (seconds, events/s, dead tuples of the table when it started, the heap pages
# the backlog sat on before the drain and its rows after, the table's heap and index blocks read
# and hit and the HOT share of its updates over the drain, CPU per event of the relay, of the
# cluster's processes and of the rest of the machine) and the ratios hist/empty of the rounds'
# events/s (and of their relay + Postgres CPU per event); the targets are issue 45's (>= 0.9 beside the history,
# >= 0.95 for the big backlog). --statements: each drain's top statements (pg_stat_statements,
# also those inside the claim function) on stderr. --explain FILE: 2 % of the rounds' statements
# with their plans (auto_explain: ANALYZE, BUFFERS, nested statements) into FILE. Run it on a
# quiet machine; it takes about 8 minutes with the defaults. Cleans up (relay stopped, cluster
# stopped and removed) also on failure or Ctrl-C.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
relay_bin=$here/build/bin/outbox-relay
history=3000000 backlog=100000 rounds=3 big=1000000 shared_buffers=128MB settle=1 statements=0 explain= probe=exists
while [ $# -gt 0 ]; do
  case "$1" in
    --relay-bin) relay_bin=$2; shift 2 ;;
    --history) history=$2; shift 2 ;;
    --backlog) backlog=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --big-backlog) big=$2; shift 2 ;;
    --shared-buffers) shared_buffers=$2; shift 2 ;;
    --no-settle) settle=0; shift ;;
    --statements) statements=1; shift ;;
    --explain) explain=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
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
preload=
[ "$statements" = 1 ] && preload="'pg_stat_statements'"
[ -n "$explain" ] && preload="${preload:+$preload, }'auto_explain'"
[ -n "$preload" ] && psql_db postgres -c "ALTER SYSTEM SET shared_preload_libraries = $preload"
"$here/scripts/pg-cluster.sh" restart "$work/cluster" > /dev/null
if [ "$statements" = 1 ]; then  # also the statements inside the claim function
  psql_db postgres -c "ALTER SYSTEM SET pg_stat_statements.track = 'all'" -c "SELECT pg_reload_conf()" > /dev/null
fi
psql_db postgres -c "CREATE DATABASE empty" -c "CREATE DATABASE hist"
for db in empty hist; do
  DATABASE_URL=${url%/*}/$db "$work/outbox-relay" migrate > /dev/null
  psql_db "$db" -c "CREATE EXTENSION pg_freespacemap"
  if [ "$statements" = 1 ]; then psql_db "$db" -c "CREATE EXTENSION pg_stat_statements"; fi
done
cat > "$work/config.yaml" << 'YAML'
http: {enabled: false}
sinks: [{name: out, type: file, path: /dev/null, fsync: false}]
YAML

pending() {  # through the pending index's predicate (processed_at IS NULL alone would scan the table)
  psql_db "$1" -tAc "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_lettered_at IS NULL"
}
# The drain's end: with --probe exists (the default) whether any row is pending (the pending index's
# first live entry); with --probe count the count of pending rows, as the first runs did: that
# count reads every pending row's page each 50 ms, in a 1,000,000 backlog 13.7 s of Postgres time
# and 2.1 million blocks read in a 22-s drain (bench/RESULTS.md, "Where a drain's time goes beside
# a history"), which the drain then waits for on a 2-core machine.
still_pending() {
  if [ "$probe" = count ]; then
    pending "$1"
  else
    psql_db "$1" -tAc "SELECT count(*) FROM (SELECT 1 FROM outbox_events
      WHERE processed_at IS NULL AND dead_lettered_at IS NULL LIMIT 1) AS p"
  fi
}
postmaster=$(head -1 "$work/cluster/data/postmaster.pid")
ticks() {  # pid: its CPU ticks (user + system), 0 once it is gone
  awk '{ print $14 + $15 }' "/proc/$1/stat" 2> /dev/null || echo 0
}
pg_ticks() {  # "pid:ticks" of each of the cluster's processes alive now
  local pid
  for pid in $(pgrep -P "$postmaster"); do printf '%s:%s,' "$pid" "$(ticks "$pid")"; done
}
cpu_ticks() {  # relay_pid: "relay postgres-processes machine" CPU ticks (the machine: every process)
  echo "$(ticks "$1") $(pg_ticks) $(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat)"
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
stats() {  # db: heap blocks read, hit; index blocks read, hit; updates, HOT updates (cumulative)
  psql_db "$1" -tAc "SELECT s.heap_blks_read, s.heap_blks_hit, s.idx_blks_read, s.idx_blks_hit,
      t.n_tup_upd, t.n_tup_hot_upd
    FROM pg_statio_user_tables AS s JOIN pg_stat_user_tables AS t USING (relid)
    WHERE s.relname = 'outbox_events'" | tr '|' ' '
}
drain() {  # db label: prints "label db seconds events/s dead_tuples pages_before pages_after blocks..."
  local n pages first dead before after log=$work/relay-$1-$2.log
  # The pending rows and the heap pages they are on (the same rows pending() reads).
  read -r n pages first < <(psql_db "$1" -tAc "SELECT count(*), count(DISTINCT (ctid::text::point)[0]),
      coalesce(min(id), 0) FROM outbox_events WHERE processed_at IS NULL AND dead_lettered_at IS NULL" | tr '|' ' ')
  dead=$(psql_db "$1" -tAc "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_events'")
  before=$(stats "$1")
  if [ "$statements" = 1 ]; then psql_db "$1" -tAc "SELECT pg_stat_statements_reset()" > /dev/null; fi
  DATABASE_URL=${url%/*}/$1 "$work/outbox-relay" run --config "$work/config.yaml" > "$log" 2>&1 &
  relay_pid=$!
  until grep -q "ordering lanes rebalanced" "$log"; do sleep 0.02; done
  local t0 t1 c0 c1; t0=$(date +%s.%N); c0=$(cpu_ticks "$relay_pid")
  while [ "$(still_pending "$1")" != 0 ]; do sleep 0.05; done
  t1=$(date +%s.%N); c1=$(cpu_ticks "$relay_pid")
  kill "$relay_pid"; wait "$relay_pid" || true; relay_pid=
  sleep 0.3  # the relay's backends report their block counts as they exit
  after=$(stats "$1")
  if [ "$statements" = 1 ]; then  # the drain's statements by time, to stderr
    echo "statements of drain $2 in $1:" >&2
    psql_db "$1" -c "SELECT calls, round(total_exec_time) AS ms, shared_blks_hit AS hit,
        shared_blks_read AS read, shared_blks_dirtied AS dirtied, shared_blks_written AS written,
        left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS query
      FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      ORDER BY total_exec_time DESC LIMIT 8" >&2
  fi
  local landed
  landed=$(psql_db "$1" -tAc "SELECT count(DISTINCT (ctid::text::point)[0]) FROM outbox_events WHERE id >= $first")
  # CPU in us per event: the relay; Postgres (every process of the cluster, the probe's own
  # sessions excepted: they are gone); the rest of the machine (the probes' psql and their
  # sessions, other users' processes).
  local hz; hz=$(getconf CLK_TCK)
  awk -v l="$2" -v d="$1" -v a="$t0" -v b="$t1" -v n="$n" -v dead="$dead" -v p="$pages" -v q="$landed" \
      -v x="$before" -v y="$after" -v c="$c0" -v e="$c1" -v hz="$hz" \
    'BEGIN { split(x, u, " "); split(y, v, " "); split(c, f, " "); split(e, g, " ")
             us = 1000000 / hz / n; relay = (g[1] - f[1]) * us
             # Per process: what it used since the drain began (a process started since: all of it).
             np = split(f[2], pf, ","); for (i = 1; i <= np; i++) { split(pf[i], kv, ":"); was[kv[1]] = kv[2] }
             np = split(g[2], pg_, ","); pg = 0
             for (i = 1; i <= np; i++) { split(pg_[i], kv, ":"); if (kv[1] != "") pg += kv[2] - was[kv[1]] }
             pg *= us
             printf "%s %s %.3f %.0f %s %s %s %d %d %d %d %.0f %.1f %.1f %.1f\n", l, d, b - a, n / (b - a), dead, p, q,
                    v[1] - u[1], v[2] - u[2], v[3] - u[3], v[4] - u[4],
                    (v[5] - u[5]) ? 100 * (v[6] - u[6]) / (v[5] - u[5]) : 0,
                    relay, pg, (g[3] - f[3]) * us - relay - pg }'
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
layout() {  # db: the table's pages by free space (the free space map, as vacuum left it), to stderr
  psql_db "$1" -c "SELECT count(*) AS pages, count(*) FILTER (WHERE avail >= 7680) AS empty,
      count(*) FILTER (WHERE avail >= 4096 AND avail < 7680) AS half_or_more_free,
      count(*) FILTER (WHERE avail < 4096) AS fuller FROM pg_freespace('outbox_events')" >&2
}
echo "the history's pages:" >&2; layout hist
if [ -n "$explain" ]; then  # a sample of the rounds' statements, plans with buffers, into the server log
  psql_db postgres -c "ALTER SYSTEM SET auto_explain.log_min_duration = 0" \
    -c "ALTER SYSTEM SET auto_explain.log_analyze = on" -c "ALTER SYSTEM SET auto_explain.log_buffers = on" \
    -c "ALTER SYSTEM SET auto_explain.log_nested_statements = on" \
    -c "ALTER SYSTEM SET auto_explain.sample_rate = 0.02" \
    -c "ALTER SYSTEM SET log_line_prefix = '%m [%p] %d '" -c "SELECT pg_reload_conf()" > /dev/null
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
if [ -n "$explain" ]; then
  psql_db postgres -c "ALTER SYSTEM SET auto_explain.log_min_duration = -1" -c "SELECT pg_reload_conf()" > /dev/null
  cp "$work/cluster/server.log" "$explain"
fi
echo "big backlog: $big against $backlog in empty ($(date +%H:%M:%S))" >&2
for n in "$backlog" "$big"; do
  psql_db empty -c "TRUNCATE outbox_events"
  insert empty "$n"
  drain empty "backlog$n" | tee -a "$results"
done
echo
echo "| drain | database | seconds | events/s | dead tuples at start | backlog's heap pages | after the drain" \
  "| heap blocks read / hit | index blocks read / hit | HOT % of updates" \
  "| CPU us/event: relay, Postgres, rest of the machine |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s | %s, %s, %s |\n",
         $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 }' "$results"
awk '$1 ~ /^round/ { rate[$1 " " $2] = $4; rounds[$1] = 1 }
     $1 ~ /^round/ { cpu[$1 " " $2] = $13 + $14 }
     $1 ~ /^backlog/ { big[++nb] = $4 }
     END {
       for (r in rounds) printf "%s: hist/empty %.2f (relay + Postgres CPU per event: %.2f)\n", r,
         rate[r " hist"] / rate[r " empty"], cpu[r " empty"] / cpu[r " hist"]
       if (nb == 2) printf "big backlog / backlog (events/s): %.2f\n", big[2] / big[1]
     }' "$results" | sort
