"""Three ways a writer could break per-key order behind the relay's reading of open writers
(schema/005 point 3), each forced here against the real binary and a real Postgres:

- Hole 1, a sequence that caches ids (CACHE > 1). pg_sequence_last_value() is then the top of the
  last block handed out, and a pooled session draws ids below it later, from its cache, while it
  holds no lock on the table: a relay that trusts the reading publishes id 21 of a key before id 2
  of the same key. The relay must keep order anyway, say so (an error log, /readyz, a metric) until
  the sequence is back at CACHE 1, and `migrate` (schema 10) sets CACHE 1.
- Hole 2, an INSERT inside a fastpath function call (protocol message 'F', libpq's PQfn, driven here
  through ctypes). Postgres sets statement_timestamp() for the call, which the statement mark
  takes, but not pg_stat_activity.query_start, so a reading that matches the two took the writer as
  complete while an id it drew had no lane mark yet. Such a writer must hold every lane.
- Hole 6, the id sequence set back under a running relay (TRUNCATE ... RESTART IDENTITY, or DELETE
  then ALTER SEQUENCE ... RESTART). The new ids 1, 2, ... are below everything the relay resolved
  before: they must go out without waiting for the sweep, and an open writer's id 1 must still go
  out before its key's id 2.

Every test uses the file sink and reads it as it grows (FileTail), so that order and latency are
those of the first delivery."""
from __future__ import annotations

import contextlib
import ctypes
import json
import random
import threading
import time

import psycopg
import pytest

from sink_tail import SinkTail
from conftest import base_config, free_port, http_get, metric, wait_until

SEQ = "outbox_events_id_seq"


FileTail = SinkTail  # tests/integration/sink_tail.py


def out_of_order_pairs(records):
    """(key, earlier id, later id) for each record that follows a higher id of its key in the file."""
    bad, last = [], {}
    for r in records:
        if r["key"] in last and r["id"] <= last[r["key"]]:
            bad.append((r["key"], last[r["key"]], r["id"]))
        last[r["key"]] = max(r["id"], last.get(r["key"], 0))
    return bad




def seqcache(db):
    return db.scalar(f"SELECT seqcache FROM pg_sequence WHERE seqrelid = '{SEQ}'::regclass")


def lane_of(db, key):
    return db.scalar("SELECT hashtext(%s) & 63", (key,))


def file_relay(relays, db, out, sweep_interval, http_port=None):
    config = base_config(db, [{"name": "audit", "type": "file", "path": str(out)}], sweep_interval=sweep_interval)
    if http_port:
        config["http"] = {"enabled": True, "listen": f"127.0.0.1:{http_port}"}
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    return relay


# ---------------------------------------------------------------------------------------------
# Hole 1: a sequence that caches ids.

def test_sequence_cache_20_keeps_key_order_is_reported_and_clears_after_cache_1(db, relays, workdir):
    port = free_port()
    out = workdir / "events.jsonl"
    relay = file_relay(relays, db, out, "2s", http_port=port)
    tail = FileTail(out)
    # A pool of 4 sessions, kept open: each caches its own block of 20 ids once the sequence is tuned.
    pool = [db.connect(application_name=f"pool-{w}") for w in range(4)]
    with db.connect() as conn:
        conn.execute(f"ALTER SEQUENCE {SEQ} CACHE 20")  # the tuning, while the relay runs
    committed = {}  # id -> key (autocommit: the id is committed when outbox_publish returns)
    commit_order = []
    lock = threading.Lock()
    errors = []

    def writer(w):
        rnd = random.Random(4200 + w)  # seeded: the same interleaving of pauses each run
        end = time.monotonic() + 8
        n = 0
        try:
            while time.monotonic() < end:
                key = f"key-{rnd.randrange(10)}"
                [(event_id,)] = pool[w].execute(
                    "SELECT outbox_publish('order.paid', %s, %s::jsonb, '{}'::jsonb)",
                    (key, json.dumps({"w": w, "n": n}))).fetchall()
                with lock:
                    committed[event_id] = key
                    commit_order.append(event_id)
                n += 1
                time.sleep(rnd.uniform(0, 0.3))
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(repr(e))

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    # The blocks really interleaved: some id was committed after a higher one (else no hole to test).
    assert commit_order != sorted(commit_order), "ids were committed in id order: no block was cached"

    # (b), (c), (d): the relay names the problem while the pool (and its cached blocks) lives.
    # One bounded wait for all three, then each is reported, so a failure lists every one missing.
    def flags():
        status, body = http_get(port, "/readyz")
        reasons = json.loads(body).get("reasons", []) if body.startswith("{") else []
        cache = metric(http_get(port, "/metrics")[1], "outbox_relay_sequence_cache")
        logged = [l for l in relay.logs() if l.get("level") == "error"
                  and "ALTER SEQUENCE" in l.get("msg", "") and "CACHE 1" in l.get("msg", "")]
        return {"log": bool(logged), "readyz": (status, reasons), "metric": cache}

    def flags_ok(f):
        status, reasons = f["readyz"]
        return (f["log"] and status == 503 and any("sequence" in r for r in reasons) and f["metric"] == 20)

    last = {}

    def check():
        last["f"] = flags()
        return flags_ok(last["f"])
    with contextlib.suppress(AssertionError):
        wait_until(check, timeout=10, interval=0.2, message="the error log, /readyz 503 and the cache metric")
    f = last["f"]
    # (a) order, as delivered while the blocks interleaved.
    during = tail.snapshot()
    problems = []
    bad = out_of_order_pairs(r for r, _ in during)
    if bad:
        problems.append(f"{len(bad)} out-of-order pairs (key, delivered before, delivered after): {bad[:5]}")
    if not f["log"]:
        problems.append("no log line at level error whose msg names ALTER SEQUENCE and CACHE 1")
    if not (f["readyz"][0] == 503 and any("sequence" in r for r in f["readyz"][1])):
        problems.append(f"/readyz answered {f['readyz']} (want 503 with a reason naming the sequence)")
    if f["metric"] != 20:
        problems.append(f"outbox_relay_sequence_cache is {f['metric']} (want 20)")
    assert not problems, "with CACHE 20: " + "; ".join(problems)

    # Back to one id at a time; the pool goes away and the ids left in its blocks with it.
    with db.connect() as conn:
        conn.execute(f"ALTER SEQUENCE {SEQ} CACHE 1")
    for conn in pool:
        conn.close()
    with db.connect() as conn:
        for n in range(5):
            key = f"key-{n}"
            [(event_id,)] = conn.execute("SELECT outbox_publish('order.paid', %s, %s::jsonb, '{}'::jsonb)",
                                         (key, json.dumps({"after": n}))).fetchall()
            committed[event_id] = key
    wait_until(lambda: set(committed) <= set(tail.ids()), timeout=10,
               message="every committed id in the file within 10 s of CACHE 1")
    time.sleep(0.5)  # a duplicate would come right behind
    tail.stop()
    records = [r for r, _ in tail.snapshot()]
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)), "an id was delivered twice"
    assert sorted(ids) == sorted(committed), "exactly the committed ids"
    assert sorted(ids) == [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert not out_of_order_pairs(records), out_of_order_pairs(records)[:5]
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, timeout=10, message="/readyz 200 after CACHE 1")
    assert metric(http_get(port, "/metrics")[1], "outbox_relay_sequence_cache") == 1
    assert relay.stop() == 0


def test_migrate_sets_the_id_sequence_to_cache_1(db):
    # The fixture migrated a fresh database to the newest schema.
    assert seqcache(db) == 1
    with db.connect() as conn:
        conn.execute(f"ALTER SEQUENCE {SEQ} CACHE 20")
        conn.execute("DELETE FROM outbox_schema_migrations WHERE version >= 10")
    assert seqcache(db) == 20
    db.migrate()  # schema 10 (and those after it) run again: 10 sets CACHE 1
    versions = [r[0] for r in db.query("SELECT version FROM outbox_schema_migrations ORDER BY version")]
    assert seqcache(db) == 1, f"seqcache {seqcache(db)} after migrate (versions recorded: {versions})"


# ---------------------------------------------------------------------------------------------
# Hole 2: an INSERT inside a fastpath function call.

class _PQ:
    """The few libpq calls a fastpath call needs, through ctypes on the system libpq."""

    def __init__(self):
        lib = ctypes.CDLL("libpq.so.5")  # CDLL: the GIL is released during each call
        lib.PQconnectdb.restype = ctypes.c_void_p
        lib.PQconnectdb.argtypes = [ctypes.c_char_p]
        lib.PQstatus.restype = ctypes.c_int
        lib.PQstatus.argtypes = [ctypes.c_void_p]
        lib.PQerrorMessage.restype = ctypes.c_char_p
        lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
        lib.PQexec.restype = ctypes.c_void_p
        lib.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.PQresultStatus.restype = ctypes.c_int
        lib.PQresultStatus.argtypes = [ctypes.c_void_p]
        lib.PQfn.restype = ctypes.c_void_p
        lib.PQfn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.PQclear.argtypes = [ctypes.c_void_p]
        lib.PQfinish.argtypes = [ctypes.c_void_p]
        self.lib = lib

    PGRES_COMMAND_OK, PGRES_TUPLES_OK = 1, 2

    def call_int_function(self, url, fnid, application_name):
        """Connects, runs one simple query (so query_start is that query's), then calls function
        fnid (no arguments, an integer result) through PQfn, autocommit. Returns the integer."""
        lib = self.lib
        conn = lib.PQconnectdb(url.encode())
        try:
            assert conn and lib.PQstatus(conn) == 0, lib.PQerrorMessage(conn)
            res = lib.PQexec(conn, f"SET application_name = '{application_name}'".encode())
            ok = lib.PQresultStatus(res) == self.PGRES_COMMAND_OK
            lib.PQclear(res)
            assert ok, lib.PQerrorMessage(conn)
            value, length = ctypes.c_int(0), ctypes.c_int(0)
            res = lib.PQfn(conn, fnid, ctypes.byref(value), ctypes.byref(length), 1, None, 0)
            ok = res and lib.PQresultStatus(res) == self.PGRES_COMMAND_OK
            lib.PQclear(res)
            assert ok, f"PQfn failed: {lib.PQerrorMessage(conn)}"
            assert length.value == 4, f"PQfn result length {length.value}"
            return value.value
        finally:
            lib.PQfinish(conn)


def test_fastpath_function_call_insert_holds_its_key_until_the_call_ends(db, relays, workdir):
    """A writer's INSERT inside a function called through PQfn draws its id, then sleeps 3 s before
    its lane mark (the payload's subquery, as test_writer_isolation's race()). Meanwhile a later
    event of its key commits: the early id must reach the file first."""
    with db.connect() as conn:
        conn.execute("CREATE FUNCTION slow_publish() RETURNS integer LANGUAGE sql AS $$ "
                     "INSERT INTO outbox_events (topic, aggregate_id, payload) "
                     "VALUES ('order.paid', 'K', (SELECT '{\"n\": 1}'::jsonb FROM pg_sleep(3))) "
                     "RETURNING id::integer $$")
    fnid = db.scalar("SELECT 'slow_publish()'::regprocedure::oid")
    pq = _PQ()
    out = workdir / "events.jsonl"
    # A sweep every 2 s, as race(): the sweep must not publish K's later event early either.
    relay = file_relay(relays, db, out, "2s")
    tail = FileTail(out)
    result = {}

    def fastpath():
        try:
            result["early"] = pq.call_int_function(db.url, fnid, "fastpath-writer")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            result["error"] = repr(e)

    started = time.monotonic()
    t = threading.Thread(target=fastpath, daemon=True)
    t.start()
    # The early id is drawn (the sequence moved) while the call sleeps before the lane mark.
    wait_until(lambda: db.scalar(f"SELECT pg_sequence_last_value('{SEQ}')"), timeout=2,
               message="the fastpath call's id drawn")
    # The scenario is the one meant: the writer is in a fastpath call, and query_start is the SET's.
    state, query = db.query("SELECT state, query FROM pg_stat_activity WHERE application_name = 'fastpath-writer'")[0]
    assert state == "fastpath function call", state
    assert query.startswith("SET application_name"), query
    [late] = db.insert([("order.paid", "K", {"n": 2})])
    [other] = db.insert([("order.paid", "other-key", {"n": 3})])
    t.join(15)
    assert "error" not in result, result["error"]
    assert time.monotonic() - started >= 3
    # The ctypes PQfn call worked: it returned the id of the row it committed.
    early = result["early"]
    assert db.query("SELECT aggregate_id, payload->>'n' FROM outbox_events WHERE id = %s", (early,)) == [("K", "1")]
    assert early < late < other
    wait_until(lambda: len(tail.ids()) >= 3, timeout=10, message="the three events in the file")
    time.sleep(0.3)
    tail.stop()
    ids = tail.ids()
    assert sorted(ids) == sorted([early, late, other]), ids
    assert ids.index(early) < ids.index(late), f"K's {late} reached the file before K's {early}: {ids}"
    assert relay.stop() == 0


# ---------------------------------------------------------------------------------------------
# Hole 6: the sequence set back under a running relay.

RESTARTS = {
    "truncate_restart_identity": ["TRUNCATE outbox_events RESTART IDENTITY"],
    "delete_then_alter_sequence_restart": ["DELETE FROM outbox_events", f"ALTER SEQUENCE {SEQ} RESTART"],
}


def deliver_50_then_restart(db, tail, restart):
    """50 events ("phase": "before") delivered, then the sequence set back: the next id is 1."""
    before = db.insert([("order.paid", f"pre-{n % 7}", {"phase": "before", "n": n}) for n in range(50)])
    wait_until(lambda: sorted(tail.ids()) == sorted(before), timeout=10, message="the 50 events before the restart")
    with db.connect() as conn:
        for sql in RESTARTS[restart]:
            conn.execute(sql)


def after(r):
    return r["payload"].get("phase") == "after"


@pytest.mark.parametrize("restart", list(RESTARTS))
def test_events_after_a_sequence_restart_go_out_without_waiting_for_the_sweep(db, relays, workdir, restart):
    out = workdir / "events.jsonl"
    # No sweep within the test: only the polls can deliver what comes after the restart.
    relay = file_relay(relays, db, out, "1h")
    tail = FileTail(out)
    deliver_50_then_restart(db, tail, restart)
    committed = {}  # id -> monotonic time its COMMIT returned
    with db.connect() as conn:
        for n in range(10):
            [(event_id,)] = conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES "
                                         "('order.paid', %s, %s) RETURNING id",
                                         (f"post-{n % 3}", json.dumps({"phase": "after", "n": n}))).fetchall()
            committed[event_id] = time.monotonic()
            time.sleep(0.1)
    assert sorted(committed) == list(range(1, 11)), f"ids after the restart: {sorted(committed)}"
    with contextlib.suppress(AssertionError):  # what is missing is reported below
        wait_until(lambda: set(committed) <= set(tail.ids(after)), timeout=3,
                   message="every event after the restart")
    time.sleep(0.3)
    tail.stop()
    seen = {}
    for r, t in tail.snapshot(after):
        seen.setdefault(r["id"], t)
    missing = sorted(set(committed) - set(seen))
    assert not missing, f"ids {missing} of the 10 committed after the restart not delivered within 3 s"
    latency = {i: round(seen[i] - committed[i], 3) for i in committed}
    assert all(v <= 2.0 for v in latency.values()), f"commit-to-file seconds by id: {latency}"
    ids = tail.ids(after)
    assert sorted(ids) == sorted(committed), f"each id after the restart exactly once: {ids}"
    assert not out_of_order_pairs(r for r, _ in tail.snapshot(after))
    assert relay.stop() == 0


@pytest.mark.parametrize("restart", list(RESTARTS))
def test_after_a_sequence_restart_an_open_writer_holds_its_key_and_only_its_key(db, relays, workdir, restart):
    out = workdir / "events.jsonl"
    # A sweep every 2 s: it must not publish K's id 2 while K's id 1 is open either.
    relay = file_relay(relays, db, out, "2s")
    tail = FileTail(out)
    others = [k for k in (f"other-{n}" for n in range(40)) if lane_of(db, k) != lane_of(db, "K")][:4]
    deliver_50_then_restart(db, tail, restart)
    writer = psycopg.connect(db.url, application_name="open-writer")  # a transaction, not autocommit
    k1 = writer.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES "
                        "('order.paid', 'K', '{\"phase\": \"after\", \"n\": 1}') RETURNING id").fetchone()[0]
    opened = time.monotonic()
    [k2] = db.insert([("order.paid", "K", {"phase": "after", "n": 2})])
    assert (k1, k2) == (1, 2), "the restart set the sequence back"
    committed = {}  # other-key id -> monotonic time its COMMIT returned
    for n, key in enumerate(others):
        [event_id] = db.insert([("order.paid", key, {"phase": "after", "n": 10 + n})])
        committed[event_id] = time.monotonic()
        time.sleep(0.5)
    time.sleep(max(0.0, opened + 4 - time.monotonic()))  # the writer stays open 4 s
    writer.commit()
    writer.close()
    wait_until(lambda: {k1, k2, *committed} <= set(tail.ids(after)), timeout=10,
               message="every event after the restart")
    time.sleep(0.3)
    tail.stop()
    records = tail.snapshot(after)
    ids = [r["id"] for r, _ in records]
    assert sorted(ids) == sorted([k1, k2, *committed]), f"each id after the restart exactly once: {ids}"
    assert ids.index(k1) < ids.index(k2), f"K's {k2} reached the file before K's {k1}: {ids}"
    seen = {r["id"]: t for r, t in reversed(records)}
    latency = {i: round(seen[i] - committed[i], 3) for i in committed}
    assert all(v <= 2.0 for v in latency.values()), f"other keys' commit-to-file seconds by id: {latency}"
    assert relay.stop() == 0
