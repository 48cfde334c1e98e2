"""Issue 9, acceptance 4, and issue 42 (one claim protocol): upgrading an installation in place. A
relay of this release refuses an outbox at an older schema version (exit non-zero, with the migrate
hint); `outbox-relay migrate` runs while writers commit; the writers never stop committing, and
every committed event reaches the sink exactly once, in id order per key, through relays started
after it, across a rolling handover."""
from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import time
import uuid

import psycopg
import pytest

from conftest import ROOT, Database, base_config, read_jsonl, wait_until
from test_core import assert_per_key_order, file_sink, lanes_owned

TABLE = "outbox_events"
# The schema versions this checkout ships: schema/NNN_name.sql, numbered 1..NEWEST without a gap.
MIGRATIONS = {int(p.stem.split("_", 1)[0]): p.stem for p in (ROOT / "schema").glob("[0-9]*.sql")}
NEWEST = max(MIGRATIONS)
assert sorted(MIGRATIONS) == list(range(1, NEWEST + 1)), f"schema/ versions must be 1..N: {sorted(MIGRATIONS)}"
# Upgrade from the first version and from the one before the newest (the same while NEWEST <= 2).
FROM_VERSIONS = sorted({1, max(1, NEWEST - 1)})


def schema_versions(db: Database):
    return [r[0] for r in db.query(
        "SELECT version FROM outbox_schema_migrations WHERE table_name = %s ORDER BY version", (TABLE,))]


@contextlib.contextmanager
def database_at(cluster, version: int):
    """A fresh database migrated only up to `version` (`migrate --to-version`), as an installation
    made by an earlier release would be; dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        d = Database(cluster, name)
        d.migrate("--to-version", str(version))
        yield d
    finally:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            conn.execute(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture
def old_db(cluster, request):
    with database_at(cluster, request.param) as d:
        yield d


class ContinuousWriters:
    """Application writers that run until stopped: each transaction (autocommit off) writes 1-3
    events of random keys, by INSERT or by outbox_publish(), some with a pause inside the
    transaction (business work), and about one in ten rolls back on purpose. The slow writers hold
    every transaction open for 50-250 ms, so a migrate always meets open writer transactions.
    Records the committed ids (with their keys and commit times) and the rolled-back ids; any
    error ends that writer and is reported by stop()."""

    def __init__(self, db: Database, fast=5, slow=1, keys=50, topic="order.paid"):
        self.db, self.keys, self.topic = db, keys, topic
        self.committed = {}     # id -> key
        self.commit_times = []  # time.monotonic() after each COMMIT returned
        self.rolled_back = set()
        self.errors = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w, w >= fast), daemon=True)
                        for w in range(fast + slow)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads), "a writer is stuck"
        assert not self.errors, self.errors[:3]
        return self

    def commits_between(self, start, end):
        with self._lock:
            return sum(1 for t in self.commit_times if start <= t <= end)

    def check(self):
        """True while no writer failed; raises with the first errors otherwise."""
        with self._lock:
            assert not self.errors, self.errors[:3]
        return True

    def last_committed_id(self):
        with self._lock:
            return max(self.committed)

    def longest_gap(self, start, end):
        """The longest time in [start, end] in which no writer committed."""
        with self._lock:
            times = sorted(t for t in self.commit_times if start <= t <= end)
        points = [start] + times + [end]
        return max(b - a for a, b in zip(points, points[1:]))

    def _run(self, w, slow):
        rnd = random.Random(9000 + w)
        seq = 0
        try:
            with psycopg.connect(self.db.url, autocommit=False) as conn:
                while not self._stop.is_set():
                    written = []
                    for _ in range(rnd.randint(1, 3)):
                        seq += 1
                        key = f"key-{rnd.randrange(self.keys)}"
                        payload = json.dumps({"w": w, "seq": seq})
                        if rnd.random() < 0.3:
                            row = conn.execute("SELECT outbox_publish(%s, %s, %s::jsonb)",
                                               (self.topic, key, payload)).fetchone()
                        else:
                            row = conn.execute(
                                f"INSERT INTO {TABLE} (topic, aggregate_id, payload) VALUES (%s, %s, %s) RETURNING id",
                                (self.topic, key, payload)).fetchone()
                        written.append((row[0], key))
                        if slow:
                            time.sleep(rnd.uniform(0.05, 0.25) / 2)
                        elif rnd.random() < 0.2:
                            time.sleep(rnd.uniform(0, 0.003))
                    if rnd.random() < 0.1:
                        conn.rollback()
                        with self._lock:
                            self.rolled_back.update(i for i, _ in written)
                    else:
                        conn.commit()
                        done = time.monotonic()
                        with self._lock:
                            self.committed.update(written)
                            self.commit_times.append(done)
                    time.sleep(rnd.uniform(0, 0.001))
        except Exception as e:  # noqa: BLE001: any error fails the test, with its text
            with self._lock:
                self.errors.append(f"writer {w}: {e!r}")


@pytest.mark.parametrize("old_db", FROM_VERSIONS, indirect=True, ids=lambda v: f"from_v{v}")
def test_migrate_under_load_keeps_writers_committing_and_delivers_every_event_once_in_key_order(
        old_db, relays, workdir, request):
    db = old_db
    from_version = request.node.callspec.params["old_db"]
    assert schema_versions(db) == list(range(1, from_version + 1))
    out_a, out_b, out_c = workdir / "a.jsonl", workdir / "b.jsonl", workdir / "c.jsonl"

    # Relay a, the binary of the new release, refuses the old schema: it exits non-zero at once and
    # says to run migrate (one claim protocol; relays of the old release keep working through the
    # migrate, which runs online).
    relay_a = relays(base_config(db, file_sink(out_a), sweep_interval="1h"), name="a")
    wait_until(lambda: not relay_a.alive(), timeout=15, message="relay a refusing the old schema")
    assert relay_a.proc.returncode != 0
    assert f"schema version {from_version}" in relay_a.raw_logs(), relay_a.raw_logs()[-2000:]
    assert "run `outbox-relay migrate`" in relay_a.raw_logs(), relay_a.raw_logs()[-2000:]
    assert not out_a.exists() or not read_jsonl(out_a)

    writers = ContinuousWriters(db).start()
    try:
        # Writers at work on the old schema, with nothing draining: a backlog builds up.
        wait_until(lambda: writers.check() and len(writers.committed) >= 300, timeout=20,
                   message="writers committing on the old schema")
        time.sleep(1.0)

        # The upgrade, with writers committing.
        migrate_started = time.monotonic()
        migrated = db.migrate()
        migrate_ended = time.monotonic()
        last_id_at_upgrade = writers.last_committed_id()
        assert migrated.returncode == 0
        newer = [MIGRATIONS[v] for v in range(from_version + 1, NEWEST + 1)]
        if newer:
            for name in newer:
                assert f"applied {name} to {TABLE}" in migrated.stdout, migrated.stdout
        else:  # nothing newer in this checkout: the upgrade is a no-op (not the case this test is for)
            assert "up to date" in migrated.stdout, migrated.stdout
        assert schema_versions(db) == list(range(1, NEWEST + 1))
        # Schema 4: the queue table's vacuum settings, on the table and its TOAST table.
        table_options, toast_options = db.query(
            "SELECT c.reloptions, t.reloptions FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid "
            "WHERE c.oid = %s::regclass", (TABLE,))[0]
        assert {"vacuum_truncate=false", "autovacuum_vacuum_scale_factor=0",
                "autovacuum_vacuum_threshold=10000"} <= set(table_options), table_options
        assert "vacuum_truncate=false" in toast_options, toast_options
        again = db.migrate()
        assert again.returncode == 0 and f"schema is up to date (version {NEWEST})" in again.stdout, again.stdout
        assert schema_versions(db) == list(range(1, NEWEST + 1))
        time.sleep(1.0)
        after_end = time.monotonic()

        # Writers kept committing through the migrate. The migrate may make them wait for its
        # table lock (DROP/CREATE TRIGGER), but only for a moment: it gives up after 100 ms and
        # tries again rather than queueing writers behind it for long.
        during = writers.commits_between(migrate_started, migrate_ended)
        before = writers.commits_between(migrate_started - 1.0, migrate_started)
        after = writers.commits_between(migrate_ended, migrate_ended + 1.0)
        stall = writers.longest_gap(migrate_started - 1.0, after_end)
        print(f"migrate took {migrate_ended - migrate_started:.3f}s; commits: {before} in the second before, "
              f"{during} during, {after} in the second after; longest gap without a commit {stall * 1000:.0f} ms")
        assert during > 0, "no writer committed while migrate ran"
        assert stall < 1.5, f"writers stalled for {stall:.3f}s around the migrate"
        assert after >= 0.5 * before, (before, after)
        writers.check()

        # The new release deployed after the migrate, as a rolling deploy: b drains the backlog and
        # the stream, then c starts and takes half of the lanes, then b stops (SIGTERM: finishes its
        # batch, writes its outcomes, exit 0) and c takes the rest. Lanes only move from b to c, so
        # b's lines then c's are in key order too.
        relay_b = relays(base_config(db, file_sink(out_b), sweep_interval="1h"), name="b")
        wait_until(lambda: writers.check() and any(l["id"] > last_id_at_upgrade for l in read_jsonl(out_b)),
                   timeout=20, message="relay b delivering events committed after the upgrade")
        relay_c = relays(base_config(db, file_sink(out_c), sweep_interval="1h"), name="c")
        wait_until(lambda: lanes_owned(relay_c) > 0, timeout=15, message="relay c owning lanes")
        assert relay_b.stop() == 0
        wait_until(lambda: lanes_owned(relay_c) == 64, timeout=15, message="relay c owning every lane")
        time.sleep(1.5)
    finally:
        writers.stop()

    committed = writers.committed
    assert len(committed) > 1000, len(committed)
    assert writers.rolled_back, "no transaction rolled back"
    assert not (writers.rolled_back & committed.keys())
    assert {i for i in committed if i > last_id_at_upgrade}, "no event committed after the upgrade"

    def delivered():
        return {l["id"] for l in read_jsonl(out_b)} | {l["id"] for l in read_jsonl(out_c)}

    try:
        wait_until(lambda: delivered() >= committed.keys(), timeout=30, message="every committed event delivered")
    except AssertionError as e:
        missing = sorted(committed.keys() - delivered())
        rows = db.query(f"SELECT id, aggregate_id, lane, processed_at IS NOT NULL, lease_owner, lease_until, attempts, "
                        f"next_attempt_at, last_error, dead_lettered_at FROM {TABLE} WHERE id = ANY(%s) ORDER BY id",
                        (missing[:20],))
        raise AssertionError(f"{e}; {len(missing)} committed events never delivered (last id committed at the "
                             f"upgrade: {last_id_at_upgrade}), first rows: {rows}") from None
    time.sleep(0.5)  # anything sent twice or not committed would show up now
    assert relay_c.stop() == 0

    lines_b, lines_c = read_jsonl(out_b), read_jsonl(out_c)
    lines = lines_b + lines_c
    ids = [l["id"] for l in lines]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} events delivered twice"
    assert set(ids) == committed.keys(), (
        f"missing {sorted(committed.keys() - set(ids))[:10]}, not committed {sorted(set(ids) - committed.keys())[:10]}")
    assert not writers.rolled_back & set(ids)
    assert all(l["key"] == committed[l["id"]] and l["topic"] == "order.paid" for l in lines)
    assert lines_c, "relay c took part"
    assert_per_key_order(lines_b)
    assert_per_key_order(lines_c)
    assert_per_key_order(lines)  # across the handover too
    # The table agrees: the committed rows, all delivered, no lease left behind.
    assert db.scalar(f"SELECT count(*) FROM {TABLE}") == len(committed)
    assert db.scalar(f"SELECT count(*) FROM {TABLE} WHERE processed_at IS NULL OR lease_owner IS NOT NULL") == 0
    for relay in (relay_b, relay_c):
        errors = [l for l in relay.logs() if l.get("level") == "error"]
        assert not errors, errors[:3]


def lane_marks_taken(db: Database, key: str) -> list[int]:
    """The lane marks an INSERT of `key` takes, read in its own transaction (rolled back): the
    advisory locks of the namespace in the lane mark's definition (schema 9's domain, or the CHECK
    that schemas 5-8 use and schema 9 keeps when it cannot change the lane's type)."""
    definition = db.scalar(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint AS c WHERE c.conname = 'outbox_events_lane_mark'")
    namespace = int(re.search(r"pg_try_advisory_xact_lock_shared\((\d+),", definition).group(1))
    with db.connect() as conn, conn.transaction(force_rollback=True):
        conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', %s, '{}')", (key,))
        return [r[0] for r in conn.execute(
            "SELECT objid::int FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND classid = %s",
            (namespace,))]


def lane_type_and_check(db: Database):
    return db.query(
        "SELECT format_type(a.atttypid, NULL), EXISTS (SELECT 1 FROM pg_constraint AS c WHERE c.conrelid = a.attrelid "
        "AND c.conname = 'outbox_events_lane_mark') FROM pg_attribute AS a "
        "WHERE a.attrelid = 'outbox_events'::regclass AND a.attname = 'lane'")[0]


@pytest.mark.parametrize("old_db", [8], indirect=True, ids=lambda v: f"from_v{v}")
def test_schema_9_moves_the_lane_mark_into_the_lane_type_unless_a_view_uses_the_lane(old_db):
    """Schema 9 makes the lane column a domain whose check takes the lane mark, and drops schema
    5's CHECK. A view on the column forbids that change: migrate then keeps the CHECK (the mark is
    still taken), exits 0, and prints a warning with the SQL to make the change by hand."""
    db = old_db
    key = "K"
    lane = db.scalar("SELECT hashtext(%s) & 63", (key,))
    assert lane_type_and_check(db) == ("smallint", True)
    assert lane_marks_taken(db, key) == [lane]
    with db.connect() as conn:
        conn.execute("CREATE VIEW lane_counts AS SELECT lane, count(*) FROM outbox_events GROUP BY lane")
    kept = db.migrate()
    assert kept.returncode == 0 and "applied 009_" in kept.stdout, kept.stdout
    assert "the lane mark stays a CHECK constraint on public.outbox_events" in kept.stderr, kept.stderr
    assert "ALTER TABLE public.outbox_events ALTER COLUMN lane TYPE public.outbox_events_lane" in kept.stderr, kept.stderr
    assert lane_type_and_check(db) == ("smallint", True)
    assert lane_marks_taken(db, key) == [lane]

    # The same upgrade without the view, in a fresh database at schema 8: the lane's type marks it.
    with database_at(db.cluster, 8) as other:
        moved = other.migrate()
        assert moved.returncode == 0 and "applied 009_" in moved.stdout and not moved.stderr, moved.stderr
        assert lane_type_and_check(other) == ("outbox_events_lane", False)
        assert lane_marks_taken(other, key) == [lane]
        # The relay's own UPDATEs (a mark, a lease) leave aggregate_id alone: no lane mark.
        with other.connect() as conn:
            conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', %s, '{}')",
                         (key,))
            with conn.transaction(force_rollback=True):
                conn.execute("UPDATE outbox_events SET lease_owner = 'x', processed_at = now()")
                assert conn.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                                    "AND locktype = 'advisory'").fetchone()[0] == 0


def retry_indexes(db: Database):
    """{index name: (valid, definition)} of the table's indexes whose name holds "retry"."""
    return {name: (valid, definition) for name, valid, definition in db.query(
        "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index AS i "
        "JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = 'outbox_events'::regclass "
        "AND c.relname LIKE '%retry%'")}


@pytest.mark.parametrize("old_db", [12], indirect=True, ids=lambda v: f"from_v{v}")
def test_schema_13_builds_its_index_concurrently_while_a_writer_stays_open(old_db):
    """Schema 13 moves the retry index from the key to a hash of the key. migrate builds the new
    index with CREATE INDEX CONCURRENTLY before its transaction: with a writer open on the table
    (which a plain CREATE INDEX would wait for, and every later writer behind it), the index shows
    in the catalog, not valid yet, while other writers keep committing; a second migrate waits for
    that build; an invalid index left by an interrupted build is dropped and built again."""
    db = old_db
    key = "K"
    assert set(retry_indexes(db)) == {"outbox_events_retry_idx"}
    insert = "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', %s, '{}') RETURNING id"

    # The upgrade while a writer stays open after its INSERT.
    with db.connect() as open_writer:
        open_writer.execute("BEGIN")
        open_writer.execute(insert, (key,))
        runs = []

        def run_migrate():
            runs.append(db.migrate())

        first = threading.Thread(target=run_migrate)
        first.start()
        wait_until(lambda: db.scalar("SELECT count(*) FROM pg_stat_progress_create_index "
                                     "WHERE command = 'CREATE INDEX CONCURRENTLY' "
                                     "AND index_relid = to_regclass('outbox_events_retry_hash_idx')") == 1,
                   timeout=10, message="migrate building the index concurrently")
        assert retry_indexes(db)["outbox_events_retry_hash_idx"][0] is False
        second = threading.Thread(target=run_migrate)
        second.start()
        # Other writers commit meanwhile, each at once.
        with db.connect() as other:
            for _ in range(20):
                started = time.monotonic()
                other.execute(insert, ("other",))
                assert time.monotonic() - started < 0.5, "a writer waited for the index build"
                time.sleep(0.1)
        assert first.is_alive() and second.is_alive(), [r.stdout + r.stderr for r in runs]
        open_writer.execute("COMMIT")
        first.join(timeout=60)
        second.join(timeout=60)
    assert [r.returncode for r in runs] == [0, 0], [r.stdout + r.stderr for r in runs]
    assert sum("applied 013_" in r.stdout for r in runs) == 1, [r.stdout for r in runs]
    assert sum("building the index outbox_events_retry_hash_idx concurrently" in r.stdout for r in runs) == 1, runs
    assert not any(r.stderr for r in runs), [r.stderr for r in runs]
    indexes = retry_indexes(db)
    assert set(indexes) == {"outbox_events_retry_hash_idx"}, indexes
    valid, definition = indexes["outbox_events_retry_hash_idx"]
    assert valid and "hashtextextended(aggregate_id, (0)::bigint), id)" in definition, definition
    assert "attempts > 0" in definition and "processed_at IS NULL" in definition, definition
    assert schema_versions(db) == list(range(1, NEWEST + 1))
    # Both claim functions read the key's failed events by the hash, as a range of (hash, id) pairs
    # (schema 14: only the retry index reads it in order, whatever the statistics).
    for args in ("13", "14"):
        text = db.scalar("SELECT pg_get_functiondef(p.oid) FROM pg_proc AS p WHERE p.proname = 'outbox_claim' "
                         "AND p.pronargs = %s", (int(args),))
        assert text.count("(pg_catalog.hashtextextended(b.aggregate_id, 0), b.id) < "
                          "(pg_catalog.hashtextextended(c.aggregate_id, 0), c.id)") == 1, text
        assert "hashtextextended(b.aggregate_id, 0) = pg_catalog.hashtextextended(c.aggregate_id, 0)" not in text
        assert "(b.aggregate_id, b.id) >=" not in text

    # An interrupted build (the index left invalid), in a fresh database at schema 12: migrate drops
    # it and builds it again.
    with database_at(db.cluster, 12) as other:
        with other.connect() as open_writer, other.connect() as builder:
            open_writer.execute("BEGIN")
            open_writer.execute(insert, (key,))
            pid = builder.execute("SELECT pg_backend_pid()").fetchone()[0]
            canceller = threading.Timer(1.0, lambda: other.query("SELECT pg_cancel_backend(%s)", (pid,)))
            canceller.start()
            with pytest.raises(psycopg.errors.QueryCanceled):
                builder.execute("CREATE INDEX CONCURRENTLY outbox_events_retry_hash_idx ON outbox_events "
                                "(pg_catalog.hashtextextended(aggregate_id, 0), id) WHERE attempts > 0")
            canceller.join()
            open_writer.execute("COMMIT")
        assert retry_indexes(other)["outbox_events_retry_hash_idx"][0] is False
        again = other.migrate()
        assert again.returncode == 0 and "applied 013_" in again.stdout and not again.stderr, again.stderr
        indexes = retry_indexes(other)
        assert set(indexes) == {"outbox_events_retry_hash_idx"}, indexes
        assert indexes["outbox_events_retry_hash_idx"][0] is True
        assert "attempts > 0" in indexes["outbox_events_retry_hash_idx"][1]
        assert "processed_at IS NULL" in indexes["outbox_events_retry_hash_idx"][1], indexes
