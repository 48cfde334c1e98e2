#!/usr/bin/env bash
# What one lean poll costs Postgres, form by form, an experiment. For each binary given: a database
# migrated by it, `outbox-relay run` for a few seconds with log_min_duration_statement = 0 (small
# events, then four of 300 KB through a 256 KiB window: when a poll rather than the claim function
# takes them, the form that cuts by bytes is timed too), each poll statement's text and parameters
# from the server's log (the forms found are listed); then, the relay stopped and 8 small events
# pending (the window set to the default 64 MiB, which they fit), each statement PREPAREd in one
# session (a generic plan, as the relay's) and EXECUTEd N times: that backend's CPU (/proc, user +
# system) and the wall time, microseconds a call, ROUNDS rounds alternating; min and median. A
# throwaway cluster with fsync on; the password travels in the environment only.
#   bench/experiments/poll_forms.sh [-n CALLS] [-r ROUNDS] NAME=BINARY [NAME=BINARY ...]   (NAME: a database name)
#   e.g. bench/experiments/poll_forms.sh old=/tmp/00de3bc/outbox-relay new=build-bench/bin/outbox-relay
set -euo pipefail
calls=3000
rounds=5
while getopts n:r: opt; do
  case $opt in
    n) calls=$OPTARG ;;
    r) rounds=$OPTARG ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
export PATH=/usr/lib/postgresql/15/bin:$PATH
root=$(cd "$(dirname "$0")/../.." && pwd)
w=$(mktemp -d /tmp/outbox-poll-forms.XXXXXX)
chmod 755 "$w"
relay=
trap 'if [ -n "$relay" ]; then kill "$relay" 2> /dev/null || true; fi; "$root/scripts/pg-cluster.sh" stop "$w/pg"; rm -rf "$w"' EXIT
url=$(env -u PG_FAST "$root/scripts/pg-cluster.sh" start "$w/pg")
export PGHOST=127.0.0.1 PGUSER=postgres PGPORT=${url##*:} PGPASSWORD
PGPORT=${PGPORT%%/*}
PGPASSWORD=$(cat "$w/pg/pwfile")
small="'{\"order_id\": 1, \"amount_cents\": 1999, \"currency\": \"EUR\", \"customer\": \"c-00042\", \"status\": \"paid\"}'"
for spec in "$@"; do
  name=${spec%%=*}
  bin=${spec#*=}
  psql -X -q -d postgres -c "CREATE DATABASE $name"
  DATABASE_URL=${url%/postgres}/$name "$bin" migrate > /dev/null
  psql -X -q -d "$name" -c "ALTER DATABASE $name SET log_min_duration_statement = 0"
  from=$(stat -c %s "$w/pg/server.log")  # this binary's statements are logged after it
  # in_flight_bytes where the binary knows it (schema 12 on; an older one exits 2 on the key).
  for window in '  in_flight_bytes: 262144\n' ''; do
    printf "relay:\n  batch_size: 500\n${window}http:\n  enabled: false\nlog:\n  level: warn\nsinks:\n  - name: bench\n    type: file\n    path: \"%s\"\n" \
      "$w/$name.jsonl" > "$w/$name.yaml"
    DATABASE_URL=${url%/postgres}/$name "$bin" run --config "$w/$name.yaml" > "$w/$name.log" 2>&1 &
    relay=$!
    sleep 2
    if kill -0 "$relay" 2> /dev/null; then break; fi
  done
  for i in $(seq 10); do
    psql -X -q -d "$name" -c "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', 'k$i', $small)"
  done
  sleep 1  # their outcomes written: the next claim is a poll, not the claim function carrying them
  psql -X -q -d "$name" -c "INSERT INTO outbox_events (topic, aggregate_id, payload)
                            SELECT 'order.paid', 'k' || g, jsonb_build_object('pad', string_agg(md5(g || '.' || h), ''))
                              FROM generate_series(1, 4) AS g, generate_series(1, 9400) AS h GROUP BY g"
  sleep 2
  kill "$relay"
  wait "$relay" || true
  relay=
  psql -X -q -d "$name" -c "ALTER DATABASE $name RESET log_min_duration_statement"
  psql -X -q -d "$name" -c "INSERT INTO outbox_events (topic, aggregate_id, payload)
                            SELECT 'order.paid', 'k' || g, $small FROM generate_series(1, 8) AS g" \
    -c "VACUUM ANALYZE outbox_events"
  # Each poll form's text and parameters (its first execution in the log); resolved ($4) set to
  # just below the 8 pending events, so that every call chooses and locks them.
  python3 - "$w/pg/server.log" "$from" "$w" "$name" "$(psql -X -At -d "$name" -c "SELECT min(id) - 1 FROM outbox_events WHERE processed_at IS NULL")" <<'PY'
import re, sys
log, start, out, name, resolved = sys.argv[1:]
with open(log, "rb") as f:
    f.seek(int(start))
    entries = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:)", f.read().decode(errors="replace"))
seen = {}
for i, e in enumerate(entries):
    m = re.search(r"\[(\d+)\] LOG:  duration: [\d.]+ ms  execute (poll_lanes\w*): (.*)", e, re.S)
    if not m or m.group(2) in seen or i + 1 >= len(entries):
        continue
    p = next((p for p in (re.search(r"\[" + m.group(1) + r"\] DETAIL:  parameters: (.*)", e2, re.S)
                          for e2 in entries[i + 1:i + 40]) if p), None)
    if not p:
        continue
    params = dict(re.findall(r"\$(\d+) = ('(?:[^']|'')*'|NULL)", p.group(1)))
    params["4"] = resolved
    if params.get("5", "NULL") != "NULL":
        params["5"] = "67108864"  # the default window (relay.in_flight_bytes), which 8 small events fit
    args = ", ".join(params[k] for k in sorted(params, key=int))
    seen[m.group(2)] = True
    print(f"{name}: {m.group(2)} found in the log")
    open(f"{out}/{name}.{m.group(2)}.sql", "w").write(
        "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET jit = off;\n"
        f"PREPARE p AS {m.group(3)};\n" + f"EXECUTE p({args});\n" * 5 + "\\set args '" + args.replace("'", "\\'") + "'\n")
PY
done
# One round of one statement: "cpu/wall" microseconds a call.
time_form() {
  local f=$1 t=$w/ticks
  { cat "$f"
    echo "SELECT pg_backend_pid() AS pid, clock_timestamp() AS t0 \\gset"
    echo "\\setenv PID :pid"
    echo "\\! awk '{ print \$14 + \$15 }' /proc/\$PID/stat > $t.0"
    for _ in $(seq "$calls"); do echo "EXECUTE p(:args);"; done
    echo "\\! awk '{ print \$14 + \$15 }' /proc/\$PID/stat > $t.1"
    echo "SELECT round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) * 1e6 / $calls, 1) AS wall \\gset"
    echo "\\echo :wall"
  } > "$w/run.sql"
  local db
  db=$(basename "$f")
  db=${db%%.*}
  local wall
  wall=$(psql -X -q -At -d "$db" -f "$w/run.sql" | tail -1)
  awk -v a="$(cat "$t.0")" -v b="$(cat "$t.1")" -v n="$calls" -v hz="$(getconf CLK_TCK)" -v wall="$wall" \
    'BEGIN { printf "%.1f/%s", (b - a) * 1e6 / hz / n, wall }'
}
declare -A cpu
forms=$(cd "$w" && ls ./*.sql | sed 's|^\./||' | sort)
for f in $forms; do  # each call chooses the 8 events: 9 rows with the summary
  db=${f%%.*}
  got=$({ cat "$w/$f"; echo "\\o $w/rows"; echo "EXECUTE p(:args);"; } | psql -X -q -At -d "$db" -o /dev/null > /dev/null; grep -c . "$w/rows")
  [ "$got" = 9 ] || { echo "${f%.sql}: $got rows a call, not 9" >&2; exit 1; }
done
for _ in $(seq "$rounds"); do
  for f in $forms; do
    cpu[$f]="${cpu[$f]:-} $(time_form "$w/$f")"
  done
done
echo "Postgres CPU / wall, us a call, $calls calls a round, $rounds rounds (8 small events chosen and locked a call):"
for f in $forms; do
  echo "${f%.sql} ${cpu[$f]}" | python3 -c '
import statistics, sys
name, *runs = sys.stdin.read().split()
cpu = [float(r.split("/")[0]) for r in runs]
wall = [float(r.split("/")[1]) for r in runs]
print(f"  {name:32s} CPU min {min(cpu):6.1f} median {statistics.median(cpu):6.1f}   wall median {statistics.median(wall):6.1f}")'
done
