"""Issue 2: the relay core against a real Postgres, with real signals and kills."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import psycopg
import pytest

from conftest import (ROOT, Database, Writers, base_config, file_sink, pending, read_jsonl, run_cli, run_config, throwaway_cluster,
                      wait_until)


def ids_in(path):
    return [line["id"] for line in read_jsonl(path)]


def lanes_owned(relay):
    """lanes_owned of the relay's last "ordering lanes rebalanced" line (0 before the first)."""
    owned = [l["lanes_owned"] for l in relay.logs() if "lanes_owned" in l]
    return owned[-1] if owned else 0


def worker_pids(db: Database):
    """The backends of the relays' worker sessions (claims, lanes, membership)."""
    return {r[0] for r in db.query("SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-relay worker' "
                                     "AND datname = current_database()")}


def assert_per_key_order(lines):
    """Per key, the first occurrence of each id comes in increasing id order."""
    seen = set()
    last = {}
    for line in lines:
        if line["id"] in seen:
            continue
        seen.add(line["id"])
        key = line["key"]
        assert last.get(key, 0) < line["id"], f"key {key}: id {line['id']} after {last[key]}"
        last[key] = line["id"]


def all_ids(db):
    return [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]


def password_of(db):
    return db.url.split(":")[2].split("@")[0]


def test_migrate_is_idempotent_and_roles_are_least_privilege(db):
    again = db.migrate()
    assert "up to date" in again.stdout
    versions = len(list((ROOT / "schema").glob("[0-9]*.sql")))
    assert db.scalar("SELECT count(*) FROM outbox_schema_migrations WHERE table_name = 'outbox_events'") == versions
    with db.connect() as conn:
        conn.execute("CREATE ROLE app_writer LOGIN PASSWORD 'w' IN ROLE outbox_writer")
    try:
        writer_url = db.url.replace("postgres:" + password_of(db), "app_writer:w")
        with psycopg.connect(writer_url, autocommit=True) as w:
            w.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', 'k', '{}')")
            new_id = w.execute("SELECT outbox_publish('t', 'k', '{\"a\": 1}')").fetchone()[0]
            assert new_id == 2
            for forbidden in ("SELECT payload FROM outbox_events",
                              "UPDATE outbox_events SET processed_at = now()",
                              "DELETE FROM outbox_events",
                              "SELECT * FROM outbox_claim('w', 1, '{}', 1, -1, false, '{}', '[]', false, -1, '{}')",
                              "SELECT * FROM outbox_claim('w', 1, '{}', 1, -1, false, '{}', '[]', false, -1, NULL, NULL, "
                              "'infinity')",
                              "SELECT * FROM outbox_writers()"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    w.execute(forbidden)
    finally:
        with db.connect() as conn:
            conn.execute("DROP OWNED BY app_writer")
            conn.execute("DROP ROLE app_writer")


def test_1_concurrent_writers_every_id_once_in_key_order(db, relays, workdir):
    out = workdir / "events.jsonl"
    relay = relays(base_config(db, file_sink(out)))
    relay.wait_log("ordering lanes rebalanced")
    writers = Writers(db, count=8, per_writer=2500, keys=500).start()
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows")
    wait_until(lambda: len(ids_in(out)) >= 20_000, timeout=10, message="20,000 lines")
    lines = read_jsonl(out)
    ids = [l["id"] for l in lines]
    assert len(ids) == 20_000
    assert sorted(ids) == all_ids(db)  # each id exactly once
    assert_per_key_order(lines)
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0
    assert relay.stop() == 0
    # The JSON Lines record carries the writer's payload and the row's columns.
    row = db.query("SELECT id, topic, aggregate_id, payload FROM outbox_events ORDER BY id LIMIT 1")[0]
    first = lines[ids.index(row[0])]
    assert (first["topic"], first["key"], first["payload"], first["headers"]) == (row[1], row[2], row[3], {})


def test_2_an_idle_relay_finds_a_new_event_by_polling_without_the_sweep(db, relays, workdir):
    out = workdir / "events.jsonl"
    relay = relays(base_config(db, file_sink(out), sweep_interval="1h"))
    relay.wait_log("ordering lanes rebalanced")
    relay.wait_log("listening")
    time.sleep(0.5)  # let the start-up catch-up finish: the system is idle
    started = time.monotonic()
    [new_id] = db.insert([("order.paid", "k1", {"x": 1})])
    wait_until(lambda: ids_in(out) == [new_id], timeout=5, message="the event in the file")
    assert time.monotonic() - started < 2.0
    assert relay.stop() == 0


def test_3_catch_up_at_start_and_after_the_listen_session_is_killed(db, relays, workdir):
    out = workdir / "events.jsonl"
    before = db.insert([("order.paid", f"k{i % 7}", {"i": i}) for i in range(1000)])
    relay = relays(base_config(db, file_sink(out), sweep_interval="1h"))
    wait_until(lambda: len(ids_in(out)) == 1000, timeout=30, message="the backlog caught up")
    assert ids_in(out) == before
    relay.wait_log("listening")

    killed = db.scalar("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE application_name = 'outbox-relay listener' AND datname = current_database()")
    assert killed == 1
    # Rows committed while nobody listens: their notifications are lost, the sweep is an hour away.
    during = db.insert([("order.paid", f"k{i % 7}", {"i": i}) for i in range(500)])
    relay.wait_log("LISTEN session restored", timeout=15)
    wait_until(lambda: len(ids_in(out)) == 1500, timeout=15, message="rows from the outage")
    after = db.insert([("order.paid", "k1", {"late": True})])
    wait_until(lambda: len(ids_in(out)) == 1501, timeout=5, message="a row after the reconnect")
    lines = read_jsonl(out)
    assert [l["id"] for l in lines] == before + during + after
    assert_per_key_order(lines)
    assert password_of(db) not in relay.raw_logs()
    assert relay.stop() == 0


def test_4_kill_9_mid_backlog_then_restart_loses_nothing(db, relays, workdir):
    out = workdir / "events.jsonl"
    ids = db.insert([("order.paid", f"k{i % 50}", {"i": i}) for i in range(30_000)])
    config = base_config(db, file_sink(out), lease="3s")
    first = relays(config)
    wait_until(lambda: len(ids_in(out)) >= 3000, timeout=60, message="the relay working through the backlog")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    leased = [r[0] for r in db.query(
        "SELECT id FROM outbox_events WHERE lease_owner IS NOT NULL AND processed_at IS NULL")]
    delivered_before = set(ids_in(out))
    assert len(delivered_before) < 30_000, "the relay finished before the kill; the test proves nothing"

    second = relays(config)
    wait_until(lambda: pending(db) == 0, timeout=120, message="the backlog drained after restart")
    lines = read_jsonl(out)
    got = [l["id"] for l in lines]
    assert set(got) == set(ids), "every id delivered at least once"
    assert set(leased) <= set(got), "the killed batch came back"
    duplicates = len(got) - len(set(got))
    # Only the batches in flight may be sent twice (docs/design.md, "Failure model"): the one in
    # the sink and the one before it, delivered but its completion not yet committed (batch_size
    # 500 each).
    assert duplicates <= 2 * 500, duplicates
    assert_per_key_order(lines)
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE lease_owner IS NOT NULL") == 0
    assert second.stop() == 0


def test_5_postgres_restart_while_writers_and_relay_run(db, cluster, relays, workdir):
    out = workdir / "events.jsonl"
    relay = relays(base_config(db, file_sink(out)))
    relay.wait_log("ordering lanes rebalanced")
    writers = Writers(db, count=4, per_writer=2500, keys=200, batch=10, pause=0.005, retry_on_error=True).start()
    wait_until(lambda: writers.inserted >= 2000, timeout=60, message="writers under way")
    cluster.restart()
    writers.join()
    assert writers.inserted == 10_000
    relay.wait_log("database session restored", timeout=30)
    relay.wait_log("LISTEN session restored", timeout=30)
    wait_until(lambda: pending(db) == 0, timeout=60, message="every row delivered")
    lines = read_jsonl(out)
    got = [l["id"] for l in lines]
    assert set(got) == set(all_ids(db)), "no committed row lost"
    assert len(set(got)) >= 10_000
    assert_per_key_order(lines)
    assert password_of(db) not in relay.raw_logs()
    assert relay.stop() == 0


def test_6_two_relays_deliver_every_id_exactly_once(db, relays, workdir):
    out_a, out_b = workdir / "a.jsonl", workdir / "b.jsonl"
    a = relays(base_config(db, file_sink(out_a)), name="a")
    a.wait_log("ordering lanes rebalanced")
    # A backlog that a is still draining when b arrives: a hands lanes over between batches.
    db.insert([("order.paid", f"key-{i % 100}", {"i": i}) for i in range(20_000)])
    b = relays(base_config(db, file_sink(out_b)), name="b")
    wait_until(lambda: any(l.get("lanes_owned") == 32 for l in b.logs()), timeout=30, message="b owns 32 lanes")
    writers = Writers(db, count=4, per_writer=3000, keys=300).start()
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows")
    lines_a, lines_b = read_jsonl(out_a), read_jsonl(out_b)
    got = [l["id"] for l in lines_a] + [l["id"] for l in lines_b]
    assert len(got) == 32_000
    assert sorted(got) == all_ids(db), "every id exactly once across both relays"
    assert lines_b, "the second relay took part"
    assert_per_key_order(lines_a)
    assert_per_key_order(lines_b)
    assert a.alive() and b.alive()
    assert a.stop() == 0 and b.stop() == 0


def test_6_a_failed_statement_writes_its_outcomes_before_its_lanes_go(db, relays, workdir):
    """A relay whose worker statement fails while its session stays open (here: cancelled, as a
    migration's type change fails a prepared statement) writes the outcomes it holds, on its other
    session, before it closes the failed one and frees its lanes for a peer. A poll's events carry
    no lease: freed first, a peer takes the lanes and sends again the events delivered whose
    outcomes were not written yet (test_upgrade's migrate under load from schema 8 once saw 4)."""
    out_a, out_b = workdir / "a.jsonl", workdir / "b.jsonl"
    config_a = base_config(db, file_sink(out_a))
    config_a["database"]["reconnect"] = {"initial": "6s", "max": "6s"}  # waits 3-6 s (equal jitter)
    a = relays(config_a, name="a")
    wait_until(lambda: lanes_owned(a) == 64, timeout=15, message="a owns every lane")
    (pid_a,) = worker_pids(db)
    b = relays(base_config(db, file_sink(out_b)), name="b")
    wait_until(lambda: lanes_owned(a) == 32 and lanes_owned(b) == 32, timeout=15, message="32 lanes each")

    # A steady stream, so that a always holds the outcomes of its last polls (written up to ~50 ms
    # later); a's worker statements are cancelled until one fails (a cancel while idle is ignored).
    writers = Writers(db, count=2, per_writer=3000, keys=100, batch=5, pause=0.01).start()
    wait_until(lambda: len(ids_in(out_a)) > 300, timeout=15, message="a delivering the stream")
    failed = lambda: any(l.get("msg") == "database unavailable, will retry" for l in a.logs())  # noqa: E731
    deadline = time.monotonic() + 10
    while not failed() and time.monotonic() < deadline:
        db.scalar("SELECT pg_cancel_backend(%s)", (pid_a,))
        time.sleep(0.003)
    assert failed(), "no worker statement of a was cancelled"
    # The lanes go at once (b takes them during a's backoff), the events' outcomes before them.
    wait_until(lambda: lanes_owned(b) == 64, timeout=10, message="b owning a's lanes during a's backoff")
    a.wait_log("database session restored", timeout=20)
    writers.join()
    wait_until(lambda: pending(db) == 0, timeout=60, message="no pending rows")
    lines_a, lines_b = read_jsonl(out_a), read_jsonl(out_b)
    got = [l["id"] for l in lines_a] + [l["id"] for l in lines_b]
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} events delivered twice"
    assert sorted(got) == all_ids(db), "every id exactly once across both relays"
    assert_per_key_order(lines_a)
    assert_per_key_order(lines_b)
    assert a.stop() == 0 and b.stop() == 0


def test_7_retry_backs_off_and_poison_is_dead_lettered(db, relays, workdir):
    # The sink's path leads to /dev/full (it opens, every write fails) until the "disk" is back: a
    # missing directory is refused at start, not retried.
    sink_path, out = workdir / "sink.jsonl", workdir / "events.jsonl"
    sink_path.symlink_to("/dev/full")
    relay = relays(base_config(db, file_sink(sink_path), backoff={"initial": "200ms", "max": "1s"}))
    relay.wait_log("ordering lanes rebalanced")
    good = db.insert([("order.paid", f"k{i}", {"i": i}) for i in range(5)])
    [poison] = db.insert([("order.paid", "bad", {"x": 1}, {"n": 1})])
    # The poison row is dead-lettered at once with its reason; it is never retried.
    wait_until(lambda: db.scalar("SELECT dead_lettered_at IS NOT NULL FROM outbox_events WHERE id = %s", (poison,)),
               timeout=10, message="poison dead-lettered")
    assert db.query("SELECT attempts, last_error FROM outbox_events WHERE id = %s", (poison,))[0] == \
        (1, "invalid event: header 'n' must be a string, got number")
    # The good rows retry with backoff while the disk is full.
    started = time.monotonic()
    wait_until(lambda: db.scalar("SELECT min(attempts) FROM outbox_events WHERE id = ANY(%s)", (good,)) >= 3,
               timeout=15, message="three failed attempts")
    elapsed = time.monotonic() - started
    rows = db.query("SELECT attempts, last_error, next_attempt_at > now() FROM outbox_events WHERE id = ANY(%s)",
                    (good,))
    for attempts, last_error, _ in rows:
        assert last_error == "audit: write: No space left on device"
        assert attempts < 12, "backoff must slow the retries down"
    assert elapsed >= 0.2  # attempts 2 and 3 wait >= 100ms + 200ms (equal jitter) after the first
    sink_path.unlink()
    sink_path.symlink_to(out)
    wait_until(lambda: sorted(ids_in(out)) == good, timeout=10, message="good rows delivered after the fix")
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") == 5,
               timeout=10, message="the good rows marked")
    status = json.loads(run_cli("status", "--json", env={"DATABASE_URL": db.url}).stdout)
    assert status["dead_lettered"] == 1 and status["pending"] == 0
    assert status["topics"] == [{"topic": "order.paid", "pending": 0, "oldest_pending_age_seconds": 0.0,
                                 "dead_lettered": 1}]
    assert poison not in ids_in(out)
    assert relay.stop() == 0


def test_on_success_delete_removes_delivered_rows_and_keeps_dead_letters(db, relays, workdir):
    out = workdir / "events.jsonl"
    # A backlog in small batches, so the pipeline runs full: one batch in the sink while the one
    # before is deleted and the one after is claimed. A poison row sits in the middle.
    first = db.insert([("order.paid", f"k{i % 50}", {"i": i}) for i in range(1000)])
    [poison] = db.insert([("order.paid", "k7", {"x": 1}, {"n": 1})])
    rest = db.insert([("order.paid", f"k{i % 50}", {"i": i}) for i in range(1000, 2000)])
    relay = relays(base_config(db, file_sink(out), batch_size=50, on_success="delete"))
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events") == 1, timeout=30,
               message="delivered rows deleted")
    lines = read_jsonl(out)
    assert sorted(line["id"] for line in lines) == first + rest  # each id exactly once
    assert_per_key_order(lines)
    assert db.query("SELECT id, attempts, last_error, dead_lettered_at IS NOT NULL FROM outbox_events") == \
        [(poison, 1, "invalid event: header 'n' must be a string, got number", True)]
    status = json.loads(run_cli("status", "--json", env={"DATABASE_URL": db.url}).stdout)
    assert status["dead_lettered"] == 1 and status["pending"] == 0
    assert relay.stop() == 0


BAD_CONFIGS = [
    ({"relay": {"batch_sise": 10}}, "relay.batch_sise: unknown key"),
    ({"relay": {"lease": "60"}}, "relay.lease: expected a duration"),
    ({"routes": [{"topics": ["x.*"], "sinks": ["nope"]}]}, "routes[0].sinks[0]: unknown sink 'nope'"),
    ({"database": {"url": ""}}, "database.url: required"),
    ({"sinks": [{"name": "a", "type": "smoke-signal"}]}, "sinks[0].type: unsupported value 'smoke-signal'"),
]


@pytest.mark.parametrize("override,expected", BAD_CONFIGS)
def test_8_bad_config_exits_2_naming_the_key(workdir, override, expected):
    config = {"database": {"url": "postgresql://relay:hunter22@127.0.0.1:1/app"},
              "sinks": [{"name": "a", "type": "stdout"}]}
    config.update(override)
    proc = run_config(workdir, config)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "hunter22" not in proc.stderr + proc.stdout


def test_8_sigterm_exits_0_and_leaves_no_live_lease(db, relays, workdir):
    out = workdir / "events.jsonl"
    db.insert([("order.paid", f"k{i % 20}", {"i": i}) for i in range(40_000)])
    relay = relays(base_config(db, file_sink(out)))
    wait_until(lambda: len(ids_in(out)) >= 2000, timeout=60, message="draining")
    started = time.monotonic()
    code = relay.stop(signal.SIGTERM, timeout=10)
    assert code == 0
    assert time.monotonic() - started < 10
    assert pending(db) > 0, "the relay finished before SIGTERM; the test proves nothing"
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE lease_owner IS NOT NULL OR lease_until IS NOT NULL") == 0
    # Every line in the file is marked done: the batch in flight was finished, not dropped.
    delivered = set(ids_in(out))
    marked = {r[0] for r in db.query("SELECT id FROM outbox_events WHERE processed_at IS NOT NULL")}
    assert delivered == marked


def test_no_statement_of_the_relay_waits_for_the_wal_flush(relays, workdir):
    """A synchronous standby that never connects: every commit that waits for the WAL flush waits
    for it forever. The relay's leases, outcomes and cleared leases are all written again if a
    crash loses them, so none of its commits may wait: not in a drain (full batches, whose outcomes
    the drain waits for before it claims again), not in a steady stream's polls, not at a lane
    hand-over, not at shutdown. (Before: the outcomes' statement waited, and delivery stopped after
    the first batch; on a busy VM a flush stalled by other I/O held every event behind it.)"""
    with throwaway_cluster("outbox-flush-") as c:
        with psycopg.connect(c.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE flush")
        db = Database(c, "flush")
        db.migrate()
        with db.connect() as conn:
            conn.execute("CREATE TABLE durable_probe (x int)")
            # The test clusters run with synchronous_commit off (PG_FAST): this database's
            # sessions, the relay's among them, get the default back.
            conn.execute("ALTER DATABASE flush SET synchronous_commit = on")
        with psycopg.connect(c.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
            conn.execute("SELECT pg_reload_conf()")

        def durable_commit_waits():
            with psycopg.connect(db.url, autocommit=True) as conn:
                cancel = threading.Timer(0.3, conn.cancel)  # ends the wait with a warning
                cancel.start()
                started = time.monotonic()
                conn.execute("INSERT INTO durable_probe VALUES (1)")
                cancel.cancel()
                return time.monotonic() - started >= 0.3

        wait_until(durable_commit_waits, timeout=10, message="a durable commit waits for the ghost standby")
        # The writers' own commits wait for the local flush only (they would wait for the ghost).
        writer = psycopg.connect(db.url, autocommit=True, options="-c synchronous_commit=local")
        total = 0

        def write(n, keys=50):
            nonlocal total
            with writer.transaction():
                for i in range(n):
                    writer.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES (%s, %s, %s)",
                                   ("order.paid", f"k{(total + i) % keys}", json.dumps({"i": total + i})))
            total += n

        def unmarked():
            return db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")

        try:
            write(3000)  # a backlog: full batches, pipelined
            out_a, out_b = workdir / "a.jsonl", workdir / "b.jsonl"
            a = relays(base_config(db, file_sink(out_a)), name="a")
            wait_until(lambda: unmarked() == 0, timeout=30, message="the backlog delivered and marked")
            for _ in range(20):  # a light stream: polls, their outcomes written tens at a time
                write(5)
                time.sleep(0.05)
            wait_until(lambda: unmarked() == 0, timeout=30, message="the stream delivered and marked")
            b = relays(base_config(db, file_sink(out_b)), name="b")  # a lane hand-over
            wait_until(lambda: any(l.get("lanes_owned") == 32 for l in b.logs()), timeout=30, message="b owns 32 lanes")
            write(2000)
            wait_until(lambda: unmarked() == 0, timeout=30, message="both relays' events marked")
            started = time.monotonic()
            assert a.stop(signal.SIGTERM, timeout=15) == 0
            assert time.monotonic() - started < 10
            write(500)
            wait_until(lambda: unmarked() == 0, timeout=30, message="b alone")
            assert b.stop(signal.SIGTERM, timeout=15) == 0
            got = ids_in(out_a) + ids_in(out_b)
            assert sorted(got) == list(range(1, total + 1)), "every id exactly once"
            assert ids_in(out_b), "the second relay took part"
            waiting = db.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            assert waiting == 0
        finally:
            writer.close()
            with psycopg.connect(c.url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
                conn.execute("SELECT pg_reload_conf()")


def test_unreachable_database_is_retried_with_backoff_not_crash_looped(relays, workdir):
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"database": {"url": f"postgresql://relay:topsecret99@127.0.0.1:{port}/app"},
              "relay": {"rebalance_interval": "500ms"}, "http": {"enabled": False},
              "sinks": [{"name": "a", "type": "stdout"}]}
    relay = relays(config)
    wait_until(lambda: sum(1 for l in relay.logs() if l["msg"] == "database unavailable, will retry") >= 3,
               timeout=20, message="three logged retries")
    assert relay.alive()
    delays = [l["retry_in_ms"] for l in relay.logs() if l["msg"] == "database unavailable, will retry"]
    assert delays[2] > delays[0], "the delay grows"
    assert "topsecret99" not in relay.raw_logs()
    assert relay.stop() == 0


def test_an_open_writer_holds_back_later_ids_until_it_commits_or_rolls_back(db, relays, workdir):
    """The fence: a transaction holding an earlier id of a key commits after a later one."""
    out = workdir / "events.jsonl"
    relay = relays(base_config(db, file_sink(out), sweep_interval="1h"))
    relay.wait_log("ordering lanes rebalanced")
    slow = db.connect()
    slow.autocommit = False
    early = slow.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                         "VALUES ('order.paid', 'K', '{\"n\": 1}') RETURNING id").fetchone()[0]
    [late] = db.insert([("order.paid", "K", {"n": 2})])
    assert early < late
    time.sleep(1.0)
    assert ids_in(out) == [], "the later id must wait for the open writer"
    slow.commit()
    wait_until(lambda: ids_in(out) == [early, late], timeout=5, message="both, in id order")

    # A writer that rolls back rings no bell: the relay looks again on its own.
    slow.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', 'K', '{}')")
    [after] = db.insert([("order.paid", "K", {"n": 3})])
    time.sleep(0.5)
    assert ids_in(out) == [early, late]
    started = time.monotonic()
    slow.rollback()
    wait_until(lambda: ids_in(out) == [early, late, after], timeout=5, message="the id after the rollback")
    assert time.monotonic() - started < 1.0
    slow.close()
    assert relay.stop() == 0
