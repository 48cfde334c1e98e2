#!/usr/bin/env bash
# Steady-stream, bursty and idle cost of the relay (issue 9, acceptance 2 and 3; DESIGN section 9):
#   bench/steady.sh [steady.py options]   e.g. --rates 1000,5000 --seconds 20 --burst-seconds 60
#                                         --idle-seconds 60 (the defaults), --rounds 3,
#                                         --relay-bin DIR/outbox-relay,
#                                         --relay-config-extra 'poll_interval: 5ms';
#                                         bench/steady.sh --help lists them all
# What, on outbox_events as migrated by the binary under test, with `outbox-relay run` draining
# to a file sink (fsync, batch_size 500):
#  a) paced writers (pgbench -R RATE -c 8 -j 2, single-row INSERTs; 1,000 and 5,000/s for 20 s):
#     CPU per event of the relay process and of the Postgres work it causes (/proc; Postgres CPU
#     of the same writers without a relay, measured just before in the same run, subtracted);
#     events per claim from /metrics. Targets: <= 100 us at 1,000/s, <= 50 us at 5,000/s.
#  b) commit-to-sink latency of those events (sink line stamped when it appears, minus when the
#     writer's COMMIT returned, from pgbench's log): p50/p99/max; target p99 <= 10 ms. Also
#     INSERT-to-sink (minus the row's created_at, which adds the commit's WAL flush).
#  c) bursts of 1-50 events (separate or one multi-row txn) with 0-300 ms gaps for 60 s,
#     sweep_interval 1h: every event within 100 ms, every id exactly once.
#  d) idle, no writes for 60 s: relay + its Postgres CPU (minus a no-relay idle baseline) as % of
#     one core; target <= 1 %.
#  e) the wakeup latency bench of bench/run.sh (outbox-bench latency, 200 inserts/s; needs
#     build-bench/bin/outbox-bench, skipped without it): p99 <= 10 ms.
# How: a throwaway PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh without PG_FAST),
# bench/steady.py (method in its docstring); it uses build-bench/bin/outbox-relay (Release; not
# built here: cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C
# build-bench outbox-relay outbox-bench, or pass --relay-bin), copied at the start so a rebuild
# cannot mix versions. Prints a markdown table; writes bench/out/steady-<time>.json and
# bench/out/steady-latest.json. Cleans up (cluster stopped, scratch directory removed) also on
# failure or Ctrl-C. Run it on a quiet machine: foreign load is reported, not subtracted.
exec "$(dirname "$0")/cost-run.sh" steady "$@"
