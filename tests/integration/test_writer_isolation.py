"""An open writer holds back only the lanes it wrote to (schema/005), and the relay names it.

A steady stream of single-row commits (200/s over 200 keys) runs beside a writer transaction that
stays open for 20 s. Events of the other lanes must reach the file sink within 100 ms of their
COMMIT (p99) during the hold; the held lanes' events follow the slow writer's, in key order, after
it ends; every id arrives exactly once."""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

import psycopg
import pytest

from sink_tail import SinkTail
from conftest import base_config, free_port, run_cli, wait_until

HOLD_SECONDS = float(os.environ.get("OUTBOX_TEST_HOLD_SECONDS", "20"))
# The target is 100 ms (issue 28; p99 11-12 ms on a quiet machine, bench/RESULTS.md "Writer lanes").
# The gate allows a loaded CI machine, whose stalls of a few hundred ms hit every lane alike; before
# schema 5 this scenario's p99 was 19.8 s, so the gate still fails a relay that holds every lane.
P99_GATE = float(os.environ.get("OUTBOX_TEST_ISOLATION_P99", "0.5"))
RATE = 200
KEYS = 200


def lane_of(db, key):
    return db.scalar("SELECT hashtext(%s) & 63", (key,))


Tail = SinkTail  # tests/integration/sink_tail.py


class Stream:
    """One connection committing single-row transactions at RATE/s over KEYS keys (and, every 40th
    event, `extra_key`); notes when each COMMIT returned."""

    def __init__(self, db, extra_key=None):
        self.db, self.extra_key = db, extra_key
        self.committed = {}  # id -> (key, monotonic time the COMMIT returned)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        with self.db.connect() as conn:
            n = 0
            start = time.monotonic()
            while not self._stop.is_set():
                key = self.extra_key if self.extra_key and n % 40 == 39 else f"key-{n % KEYS}"
                event_id = conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                                        "VALUES ('order.paid', %s, %s) RETURNING id",
                                        (key, json.dumps({"n": n}))).fetchone()[0]
                self.committed[event_id] = (key, time.monotonic())  # autocommit: the COMMIT returned
                n += 1
                delay = start + n / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)

    def stop(self):
        self._stop.set()
        self._thread.join()


class StallProbe:
    """Appends a byte to a file beside the sink's and fdatasyncs it, every 20 ms on a thread of its
    own, and notes each round that took longer than `over`: the machine stalled (the disk, whose
    fdatasync the file sink waits for too, or the CPU), and every lane waited alike. CI saw one such
    stall of ~1 s in a 20 s hold (p99 790 ms, every other run 11 ms)."""

    def __init__(self, path, over=0.2, every=0.02):
        self.path, self.over, self.every = path, over, every
        self.stalls = []  # (start, end), monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        with open(self.path, "ab") as f:
            while not self._stop.is_set():
                start = time.monotonic()
                f.write(b".")
                f.flush()
                os.fdatasync(f.fileno())
                time.sleep(self.every)
                end = time.monotonic()
                if end - start > self.over + self.every:
                    self.stalls.append((start, end))

    def overlaps(self, start, end) -> bool:
        return any(s < end and start < e for s, e in self.stalls)

    def stop(self):
        self._stop.set()
        self._thread.join()


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def all_ids(db):
    return [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]


def assert_per_key_order(lines):
    last = {}
    for line in lines:
        assert line["id"] > last.get(line["key"], 0), f"key {line['key']}: {line['id']} after {last[line['key']]}"
        last[line["key"]] = line["id"]


def run_scenario(db, relays, workdir, hold, held_keys, config_extra=None, during=None):
    """Runs the stream, then `hold(db)` (which returns when the slow writer has ended, and the ids
    it committed), then checks the isolation target. Returns the latencies of the other lanes'
    events committed during the hold."""
    out = workdir / "events.jsonl"
    config = base_config(db, [{"name": "audit", "type": "file", "path": str(out)}])
    config["relay"] = {}  # the default relay settings
    config.update(config_extra or {})
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    held_lanes = {lane_of(db, k) for k in held_keys}
    tail = Tail(out)
    probe = StallProbe(workdir / "stall-probe")
    stream = Stream(db, extra_key=held_keys[0])
    time.sleep(2)
    started = time.monotonic()
    result = {}
    worker = threading.Thread(target=lambda: result.update(hold(db)), daemon=True)
    worker.start()
    if during:
        during(relay)
    worker.join(HOLD_SECONDS + 60)
    ended = time.monotonic()
    time.sleep(1.5)
    stream.stop()
    committed = {**stream.committed, **{i: (k, ended) for i, k in result.get("ids", {}).items()}}
    wait_until(lambda: set(committed) <= set(tail.seen), timeout=60, message="every committed id in the file")
    time.sleep(0.5)
    tail.stop()
    probe.stop()
    ids = [l["id"] for l in tail.lines]
    assert len(ids) == len(set(ids)), "an id was delivered twice"
    assert sorted(ids) == all_ids(db), "every id exactly once"
    assert_per_key_order(tail.lines)
    # The other lanes during the hold: p99 <= 100 ms from COMMIT to the file, leaving out the events
    # a stall of the machine caught on their way (at most a tenth of them).
    other = [(i, t) for i, (k, t) in stream.committed.items()
             if started + 0.2 < t < ended - 0.2 and lane_of_cached(db, k) not in held_lanes]
    assert len(other) > RATE * (HOLD_SECONDS - 1) * 0.8
    stalled = {i for i, t in other if probe.overlaps(t, tail.seen[i])}
    stall_seconds = sum(e - s for s, e in probe.stalls if s < ended and started < e)
    assert len(stalled) <= len(other) / 10, \
        f"the machine stalled for {stall_seconds:.1f} s of the hold ({probe.stalls}): too long to judge the lanes"
    during_hold = [tail.seen[i] - t for i, t in other if i not in stalled]
    p50, p99 = p(during_hold, 0.50), p(during_hold, 0.99)
    print(f"other lanes during the hold: {len(during_hold)} events, p50 {p50 * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms, max {max(during_hold) * 1000:.1f} ms; left out: {len(stalled)} events "
          f"caught by {len(probe.stalls)} stalls of the machine ({stall_seconds:.1f} s; p99 with them "
          f"{p([tail.seen[i] - t for i, t in other], 0.99) * 1000:.1f} ms)")
    late = sorted((round(tail.seen[i] - t, 3), round(t - started, 3), i) for i, t in other)[-5:]
    assert p99 <= P99_GATE, f"p99 {p99 * 1000:.1f} ms; the latest (latency s, committed s into the hold, id): {late}"
    # The held lanes: their events committed during the hold wait for the writer to end.
    held = [i for i, (k, t) in stream.committed.items() if started + 0.2 < t < ended - 0.2
            and lane_of_cached(db, k) in held_lanes]
    assert held, "the stream wrote to the held lanes during the hold"
    assert all(tail.seen[i] >= ended - 0.1 for i in held), "a held lane's event went out before its writer ended"
    assert relay.stop() == 0
    return relay, result, during_hold


_lanes = {}


def lane_of_cached(db, key):
    if key not in _lanes:
        _lanes[key] = lane_of(db, key)
    return _lanes[key]


def metrics_text(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_an_idle_in_transaction_writer_holds_only_its_lane_and_is_named(db, relays, workdir):
    port = free_port()
    slow_pid = {}

    def hold(db_):
        conn = psycopg.connect(db_.url, application_name="slow-request")
        slow_pid["pid"] = conn.info.backend_pid
        event_id = conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                                "VALUES ('order.paid', 'slow-1', '{\"slow\": true}') RETURNING id").fetchone()[0]
        time.sleep(HOLD_SECONDS)
        conn.commit()
        conn.close()
        return {"ids": {event_id: "slow-1"}}

    def during(relay):
        # Within 10 s of the hold, the metrics, the log and `status` name the writer.
        wait_until(lambda: "pid" in slow_pid, timeout=5)
        t0 = time.monotonic()
        relay.wait_log("an open writer transaction holds back events", timeout=10)
        warning = next(l for l in relay.logs() if "holds back events" in l.get("msg", ""))
        assert warning["pid"] == slow_pid["pid"]
        assert warning["application_name"] == "slow-request"
        assert warning["state"] == "idle in transaction"
        assert "slow-1" in warning["query"]
        assert warning["lanes"] == str(lane_of(db, "slow-1"))
        assert warning["transaction_age_seconds"] >= 4
        text = wait_until(lambda: (lambda t: t if (metric(t, "outbox_relay_held_events") or 0) > 0 else None)(
            metrics_text(port)), timeout=10 - (time.monotonic() - t0), message="held events in /metrics")
        assert metric(text, "outbox_relay_oldest_open_writer_seconds") >= 4
        status = json.loads(run_cli("status", "--json", env={"DATABASE_URL": db.url}).stdout)
        [w] = [w for w in status["open_writers"] if w["pid"] == slow_pid["pid"]]
        assert w["application_name"] == "slow-request"
        assert w["lanes"] == [lane_of(db, "slow-1")]
        assert w["events_held"] > 0
        assert time.monotonic() - t0 < 10
        human = run_cli("status", env={"DATABASE_URL": db.url}).stdout
        assert f"pid {slow_pid['pid']}" in human

    relay, _, _ = run_scenario(db, relays, workdir, hold, ["slow-1"],
                               config_extra={"http": {"enabled": True, "listen": f"127.0.0.1:{port}"}},
                               during=during)


def test_b_an_active_writer_in_a_later_statement_holds_only_its_lane(db, relays, workdir):
    def hold(db_):
        conn = psycopg.connect(db_.url)
        event_id = conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                                "VALUES ('order.paid', 'slow-1', '{}') RETURNING id").fetchone()[0]
        conn.execute("SELECT pg_sleep(%s)", (HOLD_SECONDS,))  # 'active', in a statement after its INSERT
        conn.commit()
        conn.close()
        return {"ids": {event_id: "slow-1"}}

    run_scenario(db, relays, workdir, hold, ["slow-1"])


def test_d_a_writer_in_three_lanes_that_rolls_back(db, relays, workdir):
    keys = []
    for n in range(100):
        k = f"rollback-{n}"
        if lane_of(db, k) not in {lane_of(db, x) for x in keys}:
            keys.append(k)
        if len(keys) == 3:
            break
    rolled_back = []

    def hold(db_):
        conn = psycopg.connect(db_.url)
        for k in keys:
            rolled_back.append(conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                                            "VALUES ('order.paid', %s, '{}') RETURNING id", (k,)).fetchone()[0])
        time.sleep(HOLD_SECONDS)
        conn.rollback()
        conn.close()
        return {}

    run_scenario(db, relays, workdir, hold, keys)
    assert not set(rolled_back) & set(all_ids(db))


def test_c_one_statement_inserting_200000_events_beside_the_stream(db, relays, workdir):
    """Reported, not a target: a statement still drawing ids may hold every lane while it runs."""
    out = workdir / "events.jsonl"
    config = base_config(db, [{"name": "audit", "type": "file", "path": str(out)}])
    config["relay"] = {}
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    tail = Tail(out)
    stream = Stream(db)
    time.sleep(1)
    with db.connect() as conn:
        t0 = time.monotonic()
        conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                     "SELECT 'import', 'bulk', jsonb_build_object('n', g) FROM generate_series(1, 200000) AS g")
        t1 = time.monotonic()
    time.sleep(1)
    stream.stop()
    wait_until(lambda: len(tail.seen) >= 200_000 + len(stream.committed), timeout=120, message="every event")
    time.sleep(0.5)
    tail.stop()
    ids = [l["id"] for l in tail.lines]
    assert sorted(ids) == all_ids(db) and len(ids) == len(set(ids))
    assert_per_key_order(tail.lines)
    during = [tail.seen[i] - t for i, (k, t) in stream.committed.items() if t0 < t < t1]
    after = [tail.seen[i] - t for i, (k, t) in stream.committed.items() if t > t1 + 0.5]
    print(f"200,000-row INSERT took {t1 - t0:.1f} s; stream events committed meanwhile: {len(during)}, "
          f"p50 {p(during, 0.5) * 1000:.0f} ms, p99 {p(during, 0.99) * 1000:.0f} ms; "
          f"after it: p99 {p(after, 0.99) * 1000:.1f} ms")
    assert relay.stop() == 0


# The slow writer's statement: the first of its transaction (autocommit), or a later one (BEGIN
# sent first). Both take the statement mark before they draw.
FIRST, LATER = "first statement", "later statement"


def race(db, relays, workdir, reading, statement=FIRST):
    """A writer stopped after its id is drawn and before its lane mark is taken: the id's default
    draws the id, then the payload's subquery sleeps 3 s, then the lane's type (schema 9; a CHECK
    before) marks the lane.
    Meanwhile a later event of the same key commits. `reading`: "exact" (the schema's), or "marks
    alone" (every writer complete)."""
    out = workdir / "events.jsonl"
    with db.connect() as conn:
        if reading == "marks alone":
            # What a relay that trusts the lane marks alone would see: every writer complete.
            # (Named schema-qualified: the relay's sessions run with search_path = pg_catalog,
            # pg_temp.)
            conn.execute("ALTER FUNCTION outbox_writers() RENAME TO outbox_writers_exact")
            conn.execute("CREATE FUNCTION outbox_writers() RETURNS TABLE (last_id bigint, vxid text, pid integer, "
                         "complete boolean, lanes bigint, state text, xact_age_seconds double precision, "
                         "application_name text, client_addr text, query text, wait_event text) LANGUAGE sql AS $$ "
                         "SELECT last_id, vxid, pid, CASE WHEN vxid IS NULL THEN NULL ELSE true END, lanes, state, "
                         "xact_age_seconds, application_name, client_addr, query, wait_event "
                         "FROM public.outbox_writers_exact() $$")
    # A sweep every 2 s: what the polls of a relay that trusts the marks alone would skip (an id
    # below what it covered), the sweep still finds.
    relay = relays(base_config(db, [{"name": "audit", "type": "file", "path": str(out)}], sweep_interval="2s"))
    relay.wait_log("ordering lanes rebalanced")
    before = time.monotonic()
    result = {}
    insert = ("INSERT INTO outbox_events (topic, aggregate_id, payload) "
              "VALUES ('order.paid', 'K', (SELECT '{\"n\": 1}'::jsonb FROM pg_sleep(3))) RETURNING id")

    def slow():
        with psycopg.connect(db.url, autocommit=True) as conn:
            if statement == LATER:
                conn.execute("BEGIN")
            result["early"] = conn.execute(insert).fetchone()[0]
            if statement == LATER:
                conn.execute("COMMIT")

    t = threading.Thread(target=slow)
    t.start()
    # The early id is drawn (the sequence moved) while its statement sleeps before its lane mark.
    wait_until(lambda: db.scalar("SELECT pg_sequence_last_value('outbox_events_id_seq')"), timeout=2)
    [late] = db.insert([("order.paid", "K", {"n": 2})])
    [other] = db.insert([("order.paid", "other-key", {"n": 3})])
    t.join()
    assert time.monotonic() - before >= 3
    wait_until(lambda: len(read_ids(out)) == 3, timeout=10, message="three events")
    relay.stop()
    return result["early"], late, read_ids(out)


def read_ids(path):
    if not path.exists():
        return []
    return [json.loads(l)["id"] for l in path.read_text().splitlines()]


@pytest.mark.parametrize("statement", [FIRST, LATER])
def test_race_an_id_drawn_before_its_lane_mark_holds_every_lane(db, relays, workdir, statement):
    early, late, ids = race(db, relays, workdir, "exact", statement)
    assert early < late
    assert ids.index(early) < ids.index(late)


@pytest.mark.parametrize("statement", [FIRST, LATER])
def test_race_fails_when_the_lane_marks_are_trusted_alone(db, relays, workdir, statement):
    """The same race with a reading that calls every writer complete: the later event of the key
    goes out first. This shows that the test above can fail."""
    early, late, ids = race(db, relays, workdir, "marks alone", statement)
    assert early < late
    assert ids.index(late) < ids.index(early)


def test_a_held_lane_catches_up_in_key_order_through_full_batches(db, relays, workdir):
    """A lane held back while other lanes drain in full batches: once its writer commits, its
    events go out first and in key order, without waiting for a sweep (schema 3's floor, applied
    per lane: a drain's next claim looks below the floor in a lane that was held)."""
    out = workdir / "events.jsonl"
    relay = relays(base_config(db, [{"name": "audit", "type": "file", "path": str(out)}], batch_size=10,
                               sweep_interval="1h"))
    relay.wait_log("ordering lanes rebalanced")
    slow = psycopg.connect(db.url)
    early = slow.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) "
                         "VALUES ('order.paid', 'K', '{}') RETURNING id").fetchone()[0]
    rows = [("order.paid", "K" if n % 50 == 0 else f"other-{n}", {"n": n}) for n in range(1, 400)]
    ids = [i for chunk in range(0, len(rows), 100) for i in db.insert(rows[chunk:chunk + 100])]
    wait_until(lambda: len(read_ids(out)) >= 300, timeout=10, message="the other lanes flowing")
    slow.commit()
    slow.close()
    more = db.insert([("order.paid", "K", {"n": 999})] + [("order.paid", f"late-{n}", {}) for n in range(200)])
    wait_until(lambda: len(read_ids(out)) == len(ids) + len(more) + 1, timeout=10,
               message="every event without a sweep")
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert_per_key_order(lines)
    assert sorted(l["id"] for l in lines) == sorted([early, *ids, *more])
    assert relay.stop() == 0
