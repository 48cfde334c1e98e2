"""What may hold back a key's events, and what must not: per-key order and isolation beyond the
open writers of schema 5.

- A pending row locked by someone else (a foreign key's FOR KEY SHARE, an explicit FOR SHARE): the
  claim's SKIP LOCKED must not let the key's later event overtake it, and the row must go out as
  soon as the lock goes, not at the next sweep (sweep_interval 1h here); other keys flow meanwhile.
- A transaction in another database of the cluster (a copy of this one: same table OID) that
  inserts into its own outbox_events: it holds none of this database's lanes. (A writer of this
  database stays open in one lane meanwhile, so that the relay has to read the writers at all.)
- A prepared transaction (PREPARE TRANSACTION) that inserted an event: it holds its own lane only,
  is named (gid, owner, database) in the warning log and in `status --json`, and its key's later
  event waits for COMMIT PREPARED / ROLLBACK PREPARED.
- A key too long for a B-tree entry (5,000 incompressible characters): its failed attempt is
  recorded and retried as any other (schema 13; before it the retry outcome's index entry was too
  large, SQLSTATE 54000). A row whose outcome cannot be written (an operator's constraint) is
  dead-lettered with the reason, and every other key flows on.

Each scenario checks exact things: every committed id delivered exactly once, per-key order of the
first deliveries, no rolled-back id, and latency bounds measured from the COMMIT.
"""
from __future__ import annotations

import json
import random
import string
import threading
import time

import psycopg

from sink_tail import SinkTail
from conftest import base_config, free_port, run_cli, wait_until
from webhook_receiver import Reply, receivers, webhook_sink  # noqa: F401  (receivers: the fixture)

LATENCY = 2.0  # s from COMMIT (or from the lock going) to the sink, where no sweep may help


# ---------------------------------------------------------------------------------------------
# Helpers


Tail = SinkTail  # tests/integration/sink_tail.py


def lane_of(conn, key) -> int:
    return conn.execute("SELECT hashtext(%s) & 63", (key,)).fetchone()[0]


def keys_outside(conn, lanes, n, prefix) -> list:
    """n keys (prefix-0, prefix-1, ...) whose lanes are none of `lanes`: events a lane-level hold of
    those lanes may rightly keep back must not be in the "other keys flow" checks."""
    out, i = [], 0
    while len(out) < n:
        k = f"{prefix}-{i}"
        if lane_of(conn, k) not in lanes:
            out.append(k)
        i += 1
    return out


def insert_sql(key, payload) -> tuple:
    return ("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', %s, %s) RETURNING id",
            (key, json.dumps(payload)))


def commit_one(conn, key, payload):
    """One event in its own transaction on an autocommit connection: (id, when the COMMIT returned)."""
    event_id = conn.execute(*insert_sql(key, payload)).fetchone()[0]
    return event_id, time.monotonic()


def commit_and_check_latency(db, tail, keys, what, spacing=0.05):
    """Commits one event per key (each its own transaction), then checks each reached the file sink
    within LATENCY of its COMMIT. Returns {id: key}."""
    committed = {}
    with db.connect() as conn:
        for n, key in enumerate(keys):
            event_id, t = commit_one(conn, key, {"n": n, "what": what})
            committed[event_id] = (key, t)
            time.sleep(spacing)
    deadline = max(t for _, t in committed.values()) + LATENCY
    while time.monotonic() < deadline and not all(tail.has(i) for i in committed):
        time.sleep(0.01)
    late = {i: (k, None if tail.seen_at(i) is None else round(tail.seen_at(i) - t, 3))
            for i, (k, t) in committed.items() if tail.seen_at(i) is None or tail.seen_at(i) - t > LATENCY}
    arrived = sum(1 for i in committed if tail.has(i))
    assert not late, (f"{what}: {len(late)} of {len(committed)} events not in the sink within {LATENCY} s of "
                      f"their COMMIT ({arrived} arrived at all); id -> (key, latency s or None): "
                      f"{dict(list(late.items())[:8])}")
    return {i: k for i, (k, _) in committed.items()}


def wait_for_id(tail, event_id, since, bound):
    """Waits until event_id is in the sink or `bound` s after `since`; returns its latency or None."""
    while time.monotonic() < since + bound and not tail.has(event_id):
        time.sleep(0.01)
    seen = tail.seen_at(event_id)
    return None if seen is None else seen - since


def assert_per_key_order(records):
    """Per key, the first deliveries come in id order."""
    last, seen = {}, set()
    for r in records:
        if r["id"] in seen:
            continue
        seen.add(r["id"])
        assert r["id"] > last.get(r["key"], 0), f"key {r['key']}: id {r['id']} delivered after {last[r['key']]}"
        last[r["key"]] = r["id"]


def assert_every_id_once(db, ids):
    """Every id in the table delivered exactly once (ids: what the file sinks got, in order)."""
    assert len(ids) == len(set(ids)), f"delivered twice: {sorted(i for i in set(ids) if ids.count(i) > 1)}"
    in_table = [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert sorted(ids) == in_table, f"delivered {sorted(ids)}, in the table {in_table}"


def file_config(db, path, **relay):
    return base_config(db, [{"name": "audit", "type": "file", "path": str(path)}], **relay)


def start_relay(relays, config):
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced", timeout=20)
    return relay


# ---------------------------------------------------------------------------------------------
# Hole 3: a pending row locked by someone else.


def locked_row_scenario(db, relays, workdir, lock):
    """K:1 committed and delivered; relay stopped; K:2 committed; `lock(conn, k2)` takes a row lock
    on K:2 in an open transaction; K:3 committed; relay started again (sweep 1h: no sweep can rescue
    K:2). During a 3 s hold other keys must flow; K:3 must not overtake K:2; once the lock goes, K:2
    must reach the sink within LATENCY, then K:3."""
    key = "K-locked"
    first = workdir / "events-1.jsonl"
    relay = start_relay(relays, file_config(db, first, sweep_interval="1h"))
    [k1] = db.insert([("order.paid", key, {"n": 1})])
    wait_until(lambda: first.exists() and str(k1) in first.read_text(), timeout=10, message="K:1 delivered")
    assert relay.stop() == 0

    [k2] = db.insert([("order.paid", key, {"n": 2})])
    locker = psycopg.connect(db.url)  # not autocommit: the lock lives until commit()
    try:
        lock(locker, k2)
        [k3] = db.insert([("order.paid", key, {"n": 3})])
        with db.connect() as c:
            others = keys_outside(c, {lane_of(c, key)}, 5, "other")
        second = workdir / "events-2.jsonl"
        tail = Tail(second)
        relay = start_relay(relays, file_config(db, second, sweep_interval="1h"))
        hold_from = time.monotonic()
        # The relay has claimed around the locked row by now; other keys must not wait for it.
        other_ids = commit_and_check_latency(db, tail, others, "other keys while K:2 is locked")
        # The hold itself (a lock held for a while is the scenario, not a synchronisation).
        time.sleep(max(0.0, hold_from + 3.0 - time.monotonic()))
        # K:2 may go out while locked (a FOR KEY SHARE does not conflict with every row lock), but
        # K:3 never before it.
        early = [i for i in tail.ids() if i in (k2, k3)]
        overtaken = k3 in early and (k2 not in early or early.index(k3) < early.index(k2))
        assert not overtaken, (
            f"K:3 (id {k3}) went out before K:2 (id {k2}) while K:2 was locked: the claim skipped the locked "
            f"row (SKIP LOCKED) and let the key's later event overtake it; K's deliveries so far: {early}")
        locker.commit()
        released = time.monotonic()
    finally:
        locker.close()
    latency = wait_for_id(tail, k2, released, LATENCY)
    assert latency is not None, (f"K:2 (id {k2}) not in the sink within {LATENCY} s of the lock going "
                                 f"(sweep_interval 1h); K's deliveries: {[i for i in tail.ids() if i in (k2, k3)]}")
    wait_until(lambda: tail.has(k3), timeout=LATENCY, message="K:3 after K:2")
    time.sleep(0.3)  # a duplicate, if any, would be written right behind
    tail.stop()
    assert relay.stop() == 0
    records = [json.loads(l) for l in first.read_text().splitlines()] + tail.records()
    assert [r["id"] for r in records if r["key"] == key] == [k1, k2, k3]
    assert_per_key_order(records)
    assert_every_id_once(db, [r["id"] for r in records])
    assert set(other_ids) <= set(tail.ids())
    print(f"K:2 delivered {latency * 1000:.0f} ms after the lock went")


def test_a_row_locked_by_a_foreign_key_check_keeps_its_key_order_and_goes_out_when_the_lock_goes(
        db, relays, workdir):
    with db.connect() as conn:
        conn.execute("CREATE TABLE receipts (event_id bigint REFERENCES outbox_events (id))")

    def lock(conn, event_id):
        # The foreign key's check takes FOR KEY SHARE on the referenced outbox row until commit.
        conn.execute("INSERT INTO receipts (event_id) VALUES (%s)", (event_id,))

    locked_row_scenario(db, relays, workdir, lock)


def test_a_row_locked_for_share_keeps_its_key_order_and_goes_out_when_the_lock_goes(db, relays, workdir):
    def lock(conn, event_id):
        assert conn.execute("SELECT id FROM outbox_events WHERE id = %s FOR SHARE", (event_id,)).fetchall()

    locked_row_scenario(db, relays, workdir, lock)


# ---------------------------------------------------------------------------------------------
# Hole 4: a writer in another database of the same cluster.


def test_a_writer_in_another_database_holds_back_none_of_this_databases_events(db, relays, workdir):
    copy = f"{db.name}_copy"
    admin = psycopg.connect(db.cluster.url, autocommit=True)
    try:
        # A copy of this database: its outbox_events has the same OID, so a lock on it looks like a
        # lock on ours unless the database is compared too. Nobody may be connected to db now.
        admin.execute(f"CREATE DATABASE {copy} TEMPLATE {db.name}")
        out = workdir / "events.jsonl"
        tail = Tail(out)
        relay = start_relay(relays, file_config(db, out, sweep_interval="1h"))
        foreign = psycopg.connect(db.cluster.url_for(copy))  # not autocommit: stays open
        try:
            foreign.execute(*insert_sql("foreign-1", {"db": "copy"}))
            opened = time.monotonic()
            ours = db.query("SELECT 'outbox_events'::regclass::oid")[0][0]
            theirs = foreign.execute("SELECT 'outbox_events'::regclass::oid").fetchone()[0]
            assert ours == theirs, "the copy's table should share the OID (what makes the hole)"
            # A writer of this database, open meanwhile, in one lane: the relay must read its
            # writers to publish the other lanes (without one, every id is committed and no reading
            # is needed), and that reading must not count the copy's transaction.
            local = psycopg.connect(db.url)
            try:
                local_id = local.execute(*insert_sql("local-open", {"db": "ours"})).fetchone()[0]
                with db.connect() as c:
                    keys = keys_outside(c, {lane_of(c, "local-open")}, 20, "key")
                assert len(set(keys)) == 20
                committed = commit_and_check_latency(db, tail, keys, "this database's events while a "
                                                                    "transaction in its copy inserts")
                assert time.monotonic() - opened < 10, "checked while the copy's transaction was open"
                local.commit()
                local_done = time.monotonic()
            finally:
                local.close()
            assert wait_for_id(tail, local_id, local_done, LATENCY) is not None, "the local writer's event"
            foreign.rollback()
        finally:
            foreign.close()
        time.sleep(0.3)
        tail.stop()
        assert relay.stop() == 0
        records = tail.records()
        assert_per_key_order(records)
        assert_every_id_once(db, [r["id"] for r in records])
        assert set(committed) | {local_id} == {r["id"] for r in records}
    finally:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (copy,))
        admin.execute(f"DROP DATABASE IF EXISTS {copy} WITH (FORCE)")
        admin.close()


# ---------------------------------------------------------------------------------------------
# Hole 5: a prepared transaction.


def prepared_scenario(db, relays, workdir, gid, finish, while_prepared=None):
    """P:1 inserted by a transaction that is then prepared; 20 events of other lanes must flow;
    P:2 committed meanwhile waits. Then while_prepared(relay, p_lane), if given; then finish:
    'commit' or 'rollback' (COMMIT / ROLLBACK PREPARED), after which P's events must follow."""
    key = "P-prepared"
    out = workdir / "events.jsonl"
    port = free_port()
    config = file_config(db, out, sweep_interval="1h", writer_hold_warning="1s")
    config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
    tail = Tail(out)
    relay = start_relay(relays, config)
    with db.connect() as c:
        p_lane = lane_of(c, key)
        others = keys_outside(c, {p_lane}, 20, "key")
    try:
        with db.connect() as conn:  # autocommit: BEGIN and PREPARE TRANSACTION by hand
            conn.execute("BEGIN")
            p1 = conn.execute(*insert_sql(key, {"n": 1})).fetchone()[0]
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        assert db.scalar("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)) == 1
        commit_and_check_latency(db, tail, others, "other lanes' events while a transaction is prepared")
        with db.connect() as conn:
            p2, _ = commit_one(conn, key, {"n": 2})
        if while_prepared:
            while_prepared(relay, p_lane)
        assert not tail.has(p2), (f"P:2 (id {p2}) went out while P:1 (id {p1}, prepared as '{gid}') may still "
                                  f"commit")
        with db.connect() as conn:
            conn.execute(f"{'COMMIT' if finish == 'commit' else 'ROLLBACK'} PREPARED '{gid}'")
        ended = time.monotonic()
        if finish == "commit":
            for name, i in (("P:1", p1), ("P:2", p2)):
                assert wait_for_id(tail, i, ended, LATENCY) is not None, (
                    f"{name} (id {i}) not in the sink within {LATENCY} s of COMMIT PREPARED")
        else:
            assert wait_for_id(tail, p2, ended, LATENCY) is not None, (
                f"P:2 (id {p2}) not in the sink within {LATENCY} s of ROLLBACK PREPARED")
        time.sleep(0.5)  # a rolled-back id or a duplicate, if any, would come right behind
        tail.stop()
        assert relay.stop() == 0
        records = tail.records()
        assert_per_key_order(records)
        assert_every_id_once(db, [r["id"] for r in records])
        p_ids = [r["id"] for r in records if r["key"] == key]
        if finish == "commit":
            assert p_ids == [p1, p2]
        else:
            assert p_ids == [p2], f"the rolled-back id {p1} was delivered: {p_ids}"
    finally:
        # A prepared transaction outlives its session and would keep the database from being dropped.
        if db.scalar("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)):
            with db.connect() as conn:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")


def test_a_prepared_transaction_holds_only_its_lane_is_named_and_its_key_follows_commit_prepared(
        db, relays, workdir):
    gid = "outbox-test-gid-1"

    def named(relay, p_lane):
        owner = db.scalar("SELECT owner FROM pg_prepared_xacts WHERE gid = %s", (gid,))
        # The warning names the prepared transaction: it has no backend (no pid), so its gid,
        # owner and database are what an operator needs (writer_hold_warning 1s).
        def holds_back():
            return [l for l in relay.logs() if "holds back events" in l.get("msg", "")]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not [l for l in holds_back() if l.get("gid") == gid]:
            time.sleep(0.1)
        warnings = [l for l in holds_back() if l.get("gid") == gid]
        assert warnings, f"no 'holds back events' warning with gid {gid!r} in 10 s; such warnings: {holds_back()[:2]}"
        w = warnings[0]
        assert w["owner"] == owner and w["database"] == db.name, w
        status = json.loads(run_cli("status", "--json", env={"DATABASE_URL": db.url}).stdout)
        named = [x for x in status["open_writers"] if x.get("gid") == gid]
        assert named, f"no open writer with gid {gid!r} in status --json: {status['open_writers']}"
        assert named[0]["owner"] == owner and named[0]["database"] == db.name, named[0]
        assert named[0]["lanes"] == [p_lane], named[0]

    prepared_scenario(db, relays, workdir, gid, "commit", while_prepared=named)


def test_a_rolled_back_prepared_transaction_is_never_delivered_and_its_key_follows(db, relays, workdir):
    prepared_scenario(db, relays, workdir, "outbox-test-gid-2", "rollback")


# ---------------------------------------------------------------------------------------------
# Hole 7: one row whose outcome cannot be written (a key once too long for the retry index).


def first_attempt_fails_then_others_flow(db, relays, receivers, key: str, setup=()):  # noqa: F811
    """The event of `key` fails its first attempt (503); 11 events of other keys are committed after
    that failure, then one more of `key`. Every other key's event must be acknowledged within 5 s of
    its COMMIT, once. Returns the row of `key`'s first event when it is delivered or dead-lettered
    (processed, dead-lettered, attempts, last_error), and the id of its second event."""
    with db.connect() as conn:
        for statement in setup:
            conn.execute(statement)
    marker = b'"first-attempt-fails"'
    state = {"refused": 0}
    lock = threading.Lock()

    def behaviour(req):
        with lock:
            if marker in req.body and state["refused"] == 0:
                state["refused"] += 1
                return Reply(503, b"busy")
        return Reply(200)

    rx = receivers(behaviour)
    relay = relays(base_config(db, [webhook_sink(rx.url, timeout="2s")], backoff={"initial": "100ms", "max": "1s"},
                               max_attempts=5))
    relay.wait_log("ordering lanes rebalanced", timeout=20)
    with db.connect() as conn:
        key_id = conn.execute(*insert_sql(key, {"kind": "first-attempt-fails"})).fetchone()[0]
    # The others come after its first attempt failed: that failure's outcome is what must be written.
    wait_until(lambda: any(r.status == 503 for r in rx.requests_for(key_id)), timeout=10,
               message="the first attempt answered 503")
    committed = {}
    with db.connect() as conn:
        for n in range(11):
            event_id, t = commit_one(conn, f"short-{n}", {"n": n})
            committed[event_id] = t
            time.sleep(0.05)
        second_id, _ = commit_one(conn, key, {"second": True})
    bound = 5.0
    deadline = max(committed.values()) + bound
    while time.monotonic() < deadline and not set(committed) <= rx.acked_ids():
        time.sleep(0.02)

    def first_ack(i):
        acks = [r.answered for r in rx.requests_for(i) if r.status == 200]
        return min(acks) if acks else None

    late = {i: None if first_ack(i) is None else round(first_ack(i) - t, 3) for i, t in committed.items()
            if first_ack(i) is None or first_ack(i) - t > bound}
    errors = [f"{l.get('msg')}: {str(l.get('error', ''))[:160]}" for l in relay.logs()
              if l.get("level") in ("warn", "error")][-2:]
    assert not late, (f"{len(late)} of 11 other keys' events not acknowledged within {bound} s of their COMMIT "
                      f"(id -> latency s or None): {late}; the relay's last warnings: {errors}")
    assert relay.alive(), "the relay exited"
    final = wait_until(lambda: (lambda r: r if r[0] or r[1] else None)(db.query(
        "SELECT processed_at IS NOT NULL, dead_lettered_at IS NOT NULL, attempts, last_error FROM outbox_events "
        "WHERE id = %s", (key_id,))[0]), timeout=10, message="the row delivered or dead-lettered")
    # The key's second event follows it (after its delivery, or its dead letter).
    wait_until(lambda: second_id in rx.acked_ids(), timeout=10, message="the key's second event acknowledged")
    if final[0]:
        assert first_ack(key_id) < first_ack(second_id), "the key's second event went before its first"
    with db.connect() as conn:
        after, t_after = commit_one(conn, "short-after", {"after": True})
    while time.monotonic() < t_after + bound and after not in rx.acked_ids():
        time.sleep(0.02)
    assert after in rx.acked_ids(), "an event committed afterwards was not acknowledged within 5 s"
    time.sleep(0.3)
    for i in [*committed, after, second_id]:
        assert [r.status for r in rx.requests_for(i)] == [200], f"id {i}: {[r.status for r in rx.requests_for(i)]}"
    assert relay.alive()
    print(f"the row: processed={final[0]} dead_lettered={final[1]} attempts={final[2]} last_error={final[3]!r:.160}")
    assert relay.stop() == 0
    return final, key_id


def test_a_key_too_long_for_a_btree_entry_is_retried_as_any_other(db, relays, receivers):  # noqa: F811
    # Incompressible (random letters and digits): an (aggregate_id, id) entry of the retry index of
    # schemas 1-12 could not fit a B-tree page (2,704 bytes), so its failed attempt could not be
    # recorded, and the event was dead-lettered at once. Schema 13 indexes a hash of the key.
    rnd = random.Random(7)
    long_key = "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(5000))
    (processed, dead, attempts, last_error), key_id = first_attempt_fails_then_others_flow(db, relays, receivers,
                                                                                            long_key)
    assert db.query("SELECT pg_column_size(aggregate_id) FROM outbox_events WHERE id = %s", (key_id,))[0][0] > 2704
    assert processed and not dead, f"the long key's event was dead-lettered: {last_error}"
    assert attempts == 1 and "503" in (last_error or ""), (attempts, last_error)


def test_an_outcome_one_row_cannot_take_dead_letters_that_row_and_the_others_flow(db, relays, receivers):  # noqa: F811
    # An operator's constraint (NOT VALID: the rows stored are not checked) that a retry of the key
    # "poison" breaks: its failed attempt cannot be recorded (SQLSTATE 23514). The relay writes the
    # batch's outcomes one by one, dead-letters that row with the reason, and every other key flows.
    (processed, dead, attempts, last_error), _ = first_attempt_fails_then_others_flow(
        db, relays, receivers, "poison",
        setup=["ALTER TABLE outbox_events ADD CONSTRAINT no_retry_of_poison "
               "CHECK (attempts = 0 OR dead_lettered_at IS NOT NULL OR aggregate_id <> 'poison') NOT VALID"])
    assert dead and not processed
    assert "no_retry_of_poison" in last_error and "23514" in last_error, last_error
