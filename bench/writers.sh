#!/usr/bin/env bash
# Writer cost of the outbox (issue 9, acceptance 1; DESIGN section 9), in one command:
#   bench/writers.sh [writers.py options]      e.g. --rounds 3 --seconds 8 (the defaults),
#                                              --relay-bin DIR/outbox-relay, --no-relay;
#                                              bench/writers.sh --help lists them all
# What: commits/s of pgbench writers (-n -M prepared, unpaced) into three tables of one database,
# side by side in one run: plain_events (LIKE outbox_events INCLUDING ALL, fillfactor 50, no
# triggers), outbox_events as migrated by the binary under test, prev_events migrated to schema
# version 1 (the previous release). Four workloads: 32 and 4 clients, single-row INSERT txn or
# UPDATE orders + INSERT event txn. Rounds rotate the order of the tables; TRUNCATE + VACUUM
# orders + CHECKPOINT before every point; median commits/s per (workload, table), ratio to the
# no-trigger table, target >= 0.90 for outbox_events. Then 32 single-row writers into
# outbox_events with `outbox-relay run` draining: their commits/s and whether the relay keeps up.
# How: a throwaway PostgreSQL 15 cluster with fsync on (scripts/pg-cluster.sh without PG_FAST),
# bench/writers.py; it uses build-bench/bin/outbox-relay (Release; not built here: build it
# with cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-bench
# outbox-relay, or pass --relay-bin), copied at the start so a rebuild cannot mix versions.
# Prints a markdown table and writes bench/out/writers-<time>.json and bench/out/writers-latest.json.
# Cleans up (cluster stopped, scratch directory removed) also on failure or Ctrl-C.
exec "$(dirname "$0")/cost-run.sh" writers "$@"
