"""The head-of-line look keeps to the retry index after a start on an empty table (schema 14).

While an event waits for its retry, every event a claim chooses looks for an earlier failed event
of its key. Its plan is made once per session, generic, often while the table is empty (a relay
started on a new table). Schema 13 wrote that look so that such a plan could take the pending
index instead of the retry index: every chosen event then walked the pending index from its start,
through the entries of every row delivered since the last vacuum, and a drain of 100,000 events
beside one waiting retry took 23 s instead of 1.3 s (bench/RESULTS.md, "The head-of-line look
after a start on an empty table").

What the test asserts is the plan's choice, counted by Postgres, not a time: the retry index is
read once per chosen event (with schema 13's plan: once per claim, for "does any retry wait")."""
from __future__ import annotations

import time

from conftest import base_config, file_sink, wait_until

EVENTS = 5000
KEYS = 50


def test_a_relay_started_on_an_empty_table_looks_up_a_waiting_retry_through_the_retry_index(db, relays, workdir):
    with db.connect() as conn:
        conn.execute("VACUUM ANALYZE outbox_events")  # empty, as autovacuum leaves a new table
    relay = relays(base_config(db, file_sink(workdir / "events.jsonl")))
    relay.wait_log("ordering lanes rebalanced")
    time.sleep(2)  # its start-up claim, on the empty table, made the plans
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                         "SELECT 'order.paid', 'k' || (g %% %s), jsonb_build_object('n', g) "
                         "FROM generate_series(1, %s) AS g", (KEYS, EVENTS))
            # key k0's first event failed and waits an hour: its later events wait behind it, and
            # every claim meanwhile looks for such an event under each event it chooses.
            conn.execute("UPDATE outbox_events SET attempts = 1, next_attempt_at = now() + interval '1 hour', "
                          "last_error = 'test: a failed attempt' WHERE id = %s", (KEYS,))
    held = EVENTS // KEYS
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == held,
               timeout=60, message="every event but the waiting key's delivered")
    assert relay.stop() == 0  # its backends flush their statistics as they exit
    with db.connect() as conn:
        scans = conn.execute("SELECT idx_scan FROM pg_stat_user_indexes "
                             "WHERE indexrelname = 'outbox_events_retry_hash_idx'").fetchone()[0]
        kept = conn.execute("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL "
                            "AND aggregate_id = 'k0'").fetchone()[0]
    assert kept == held, "the waiting key's later events were delivered before it"
    delivered = EVENTS - held
    assert scans >= delivered, (
        f"the retry index was read {scans} times for {delivered} events chosen while a retry waited: "
        "the head-of-line look took another index")
