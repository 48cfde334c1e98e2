"""The idle watch (docs/design.md "How wakeups work"): an idle relay's LISTEN session waits for
the next id inside Postgres, the relay polls once a second, and a new event still arrives within
about idle_poll_interval. Real Postgres, real relay, real signals."""
from __future__ import annotations

import signal
import time

from conftest import free_port, read_jsonl, wait_until
from test_ops import file_sink, ops_config, scrape

WATCH_SQL = "%pg_sequence_last_value%generate_series%pg_sleep%"


def watching(db) -> bool:
    return db.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-relay listener' "
                     "AND state = 'active' AND query LIKE %s", (WATCH_SQL,)) == 1


def commits(db) -> int:
    """Transactions committed in this database so far (every relay statement is one)."""
    db.scalar("SELECT pg_stat_force_next_flush()")
    return db.scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")


def idle_relay(db, relays, workdir, **relay):
    out = workdir / "events.jsonl"
    port = free_port()
    config = ops_config(db, file_sink(out), port, sweep_interval="1h", rebalance_interval="5s", **relay)
    config["http"]["refresh_interval"] = "10s"  # the backlog gauges' statements, out of the count below
    relay = relays(config)
    relay.wait_log("listening")
    return relay, port, out


def test_an_idle_relay_is_woken_by_the_watch_and_polls_once_a_second(db, relays, workdir):
    relay, port, out = idle_relay(db, relays, workdir)
    # Idle once no event came for 2 s and the polls slowed to idle_poll_interval.
    wait_until(lambda: watching(db), timeout=10, message="the watch statement on the LISTEN session")
    time.sleep(1.5)  # past the last poll of the slow-down
    before, started = commits(db), time.monotonic()
    time.sleep(6)
    per_second = (commits(db) - before) / (time.monotonic() - started)
    # A watch statement and a poll a second, a rebalance every 5 s, a gauge refresh every 10 s,
    # this test's own: about 2.5. Polling every 100 ms instead: 10 more.
    assert per_second < 6, per_second
    m0 = scrape(port)
    for n in range(3):
        started = time.monotonic()
        [new_id] = db.insert([("order.paid", f"k{n}", {"n": n})])
        wait_until(lambda: new_id in [e["id"] for e in read_jsonl(out)], timeout=5, message="the event")
        # A sequence read every idle_poll_interval (100 ms), then a claim.
        assert time.monotonic() - started < 0.5
        wait_until(lambda: watching(db), timeout=10, message="watching again")
        time.sleep(0.3)
    m1 = scrape(port)
    woken = {source: m1.value("outbox_relay_wakeups_total", source=source) -
             m0.value("outbox_relay_wakeups_total", source=source) for source in ("watch", "poll")}
    # The first event may meet the once-a-second safety poll before the next sequence read; the
    # others come 0.3 s after a drain, well before the next poll.
    assert woken["watch"] >= 2 and woken["watch"] + woken["poll"] == 3, woken
    assert [e["id"] for e in read_jsonl(out)] == [1, 2, 3]
    assert relay.stop() == 0


def test_a_writer_that_rolls_back_leaves_the_relay_idle_again(db, relays, workdir):
    relay, port, out = idle_relay(db, relays, workdir)
    wait_until(lambda: watching(db), timeout=10, message="the watch statement")
    with db.connect() as conn:
        conn.autocommit = False
        conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', 'k1', '{}')")
        # The watch sees the id drawn; the claim finds this writer open (a reading of open
        # writers, schema/002) ...
        time.sleep(1.0)
        conn.rollback()
    # ... then, the writer still open but nothing new, watches again for ids drawn after it; a
    # claim a second checks the open writer, finds it rolled back and resolves its id.
    wait_until(lambda: watching(db), timeout=8, message="watching again after the rollback")
    time.sleep(2.5)
    before, started = commits(db), time.monotonic()
    time.sleep(4)
    assert (commits(db) - before) / (time.monotonic() - started) < 6
    [new_id] = db.insert([("order.paid", "k1", {"after": "rollback"})])
    wait_until(lambda: [e["id"] for e in read_jsonl(out)] == [new_id], timeout=5, message="a later event")
    assert relay.stop() == 0


def test_sigterm_while_watching_exits_at_once(db, relays, workdir):
    relay, _, _ = idle_relay(db, relays, workdir)
    wait_until(lambda: watching(db), timeout=10, message="the watch statement")
    started = time.monotonic()
    assert relay.stop(signal.SIGTERM) == 0
    # A watch statement lasts a second; the relay cancels it instead of waiting for it.
    assert time.monotonic() - started < 0.5


def test_no_watch_with_a_notifying_trigger_or_idle_watch_off(db, relays, workdir):
    with db.connect() as conn:
        conn.execute("CREATE TRIGGER outbox_notify AFTER INSERT ON outbox_events "
                     "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()")
    relay, port, out = idle_relay(db, relays, workdir)
    time.sleep(4)
    assert not watching(db)
    started = time.monotonic()
    [new_id] = db.insert([("order.paid", "k1", {})])
    wait_until(lambda: [e["id"] for e in read_jsonl(out)] == [new_id], timeout=5, message="the event")
    assert time.monotonic() - started < 0.5
    m = scrape(port)
    assert m.value("outbox_relay_wakeups_total", source="notify") == 1  # the writer's NOTIFY, at once
    assert m.value("outbox_relay_wakeups_total", source="watch") == 0
    assert relay.stop() == 0

    with db.connect() as conn:
        conn.execute("DROP TRIGGER outbox_notify ON outbox_events")
    relay, port, out = idle_relay(db, relays, workdir, idle_watch=False)
    time.sleep(4)
    assert not watching(db)
    [new_id] = db.insert([("order.paid", "k2", {})])
    wait_until(lambda: new_id in [e["id"] for e in read_jsonl(out)], timeout=5, message="the event, by a poll")
    m = scrape(port)
    assert m.value("outbox_relay_wakeups_total", source="poll") >= 1
    assert m.value("outbox_relay_wakeups_total", source="watch") == 0
    assert relay.stop() == 0
