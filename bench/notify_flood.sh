#!/usr/bin/env bash
# What a NOTIFY flood from a writer costs (issue 43 item 5: any role may NOTIFY outbox_wakeup), in one command:
#   bench/notify_flood.sh [notify_flood.py options]   e.g. --relay-bin A --relay-bin B (each measured in
#                                                     turn, same cluster), --rate 10000 --seconds 20
#                                                     --rounds 1 (the defaults); --help lists them all
# What: per binary, `outbox-relay run` (file sink, default relay settings) started, its lanes
# rebalanced and idle for 3 s, then two windows: "quiet" (nothing happens) and "flood" (a session
# of a login role in outbox_writer sends --rate NOTIFYs/s on outbox_wakeup: every 10 ms one
# transaction of rate/100 pg_notify calls with distinct payloads, paced by a monotonic clock).
# Per window: NOTIFYs/s actually sent, relay CPU (/proc utime+stime), Postgres CPU of the relay's
# sessions (by application_name) and of the flooder's backend, machine CPU, and the relay's
# outbox_relay_wakeups_total by source; all as % of one core. Acceptance: a flood from a role that
# is not the operator's costs nothing (quiet and flood alike).
# How: a throwaway PostgreSQL 15 cluster with fsync on (bench/cost-run.sh), bench/notify_flood.py
# (needs psycopg: BENCH_PYTHON=~/.cache/outbox-relay/venv/bin/python, made by scripts/test.sh),
# migrated by the first binary; each binary is copied at the start so a rebuild cannot mix
# versions. Prints a markdown table per binary; writes bench/out/notify_flood-<time>.json and
# bench/out/notify_flood-latest.json. Cleans up also on failure or Ctrl-C.
exec "$(dirname "$0")/cost-run.sh" notify_flood "$@"
