#!/usr/bin/env bash
# Where a poll's Postgres time goes at 1,000 events/s (issue 28), an experiment. For each binary
# given, alternating, 2 rounds: a database migrated by it, `outbox-relay run` to a file sink,
# pgbench -R 1000 -c 8 (single-row INSERTs) for 20 s, then pg_stat_statements (track = all: the
# statements inside the claim function too) and pg_stat_user_functions. A throwaway cluster with
# fsync on; the password travels in the environment only.
#   bench/experiments/poll_statements.sh NAME=BINARY [NAME=BINARY ...]   (NAME in lower case: a database name)
#   e.g. main=/tmp/main/build-bench/bin/outbox-relay new=build-bench/bin/outbox-relay
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,8p "$0"; exit 2; }
export PATH=/usr/lib/postgresql/15/bin:$PATH
root=$(cd "$(dirname "$0")/../.." && pwd)
w=$(mktemp -d /tmp/outbox-poll-statements.XXXXXX)
chmod 755 "$w"
relay=
# A relay left running would hold the caller's lock (flock) and reconnect for ever.
trap 'if [ -n "$relay" ]; then kill "$relay" 2> /dev/null || true; fi; "$root/scripts/pg-cluster.sh" stop "$w/pg"; rm -rf "$w"' EXIT
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$w/pg")
cat >> "$w/pg/data/postgresql.conf" <<CONF
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
track_functions = pl
CONF
"$root/scripts/pg-cluster.sh" restart "$w/pg"
export PGHOST=127.0.0.1 PGUSER=postgres PGPORT=${url##*:} PGPASSWORD
PGPORT=${PGPORT%%/*}
PGPASSWORD=$(cat "$w/pg/pwfile")
cat > "$w/insert.sql" <<'SQL'
\set k random(1, 1000)
\set o random(1, 10000000)
INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', 'k' || :k, ('{"order_id": ' || :o || ', "amount_cents": 1999, "currency": "EUR", "customer": "c-00042", "status": "paid"}')::jsonb);
SQL
# "name ticks" lines: the relay process's CPU (user + system, clock ticks), then each of its
# Postgres sessions' (application_name:pid, spaces as underscores).
session_cpu() {
  local ticks pid app
  echo "relay $(awk '{ print $14 + $15 }' "/proc/$2/stat")"
  psql -X -At -d "$1" -F ' ' -c "SELECT pid, replace(application_name, ' ', '_') FROM pg_stat_activity
                                   WHERE application_name LIKE 'outbox-relay %'" |
    while read -r pid app; do
      ticks=$(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2> /dev/null) && echo "$app:$pid $ticks"
    done
}
for round in 1 2; do
  for spec in "$@"; do
    name=${spec%%=*}
    bin=${spec#*=}
    db=$name$round
    psql -X -q -d postgres -c "CREATE DATABASE $db"
    export DATABASE_URL=${url%/postgres}/$db
    "$bin" migrate > /dev/null
    psql -X -q -d "$db" -c "CREATE EXTENSION pg_stat_statements"
    printf 'relay:\n  batch_size: 500\nhttp:\n  enabled: false\nlog:\n  level: warn\nsinks:\n  - name: bench\n    type: file\n    path: "%s"\n    fsync: true\n' \
      "$w/$db.jsonl" > "$w/$db.yaml"
    "$bin" run --config "$w/$db.yaml" > "$w/$db.log" 2>&1 &
    relay=$!
    unset DATABASE_URL
    sleep 3
    psql -X -q -d "$db" -c "SELECT pg_stat_statements_reset()" -c "SELECT pg_stat_reset()" > /dev/null
    cpu_before=$(session_cpu "$db" "$relay")
    pgbench -n -M prepared -R 1000 -c 8 -j 2 -T 20 -f "$w/insert.sql" "$db" > "$w/$db.pgbench" 2>&1
    sleep 1
    cpu_after=$(session_cpu "$db" "$relay")
    events=$(grep -c . "$w/$db.jsonl")
    echo "== $name, round $round: CPU us an event (relay process, then each of its sessions):"
    join <(echo "$cpu_before" | sort) <(echo "$cpu_after" | sort) |
      awk -v n="$events" -v hz="$(getconf CLK_TCK)" '{ printf "   %-28s %7.1f\n", $1, ($3 - $2) * 1e6 / hz / n }'
    echo "== $name, round $round: $events events in the sink"
    psql -X -d "$db" \
      -c "SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
                 round((total_exec_time / calls * 1000)::numeric, 1) AS us_per_call, toplevel AS top,
                 left(regexp_replace(query, '\s+', ' ', 'g'), 150) AS query
            FROM pg_stat_statements
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND query NOT ILIKE '%pg_stat_statements%'
           ORDER BY total_exec_time DESC LIMIT 14" \
      -c "SELECT funcname, calls, round(self_time::numeric, 1) AS self_ms,
                 round((self_time / nullif(calls, 0) * 1000)::numeric, 1) AS self_us_per_call FROM pg_stat_user_functions"
    kill "$relay"
    wait "$relay" || true
  done
done
