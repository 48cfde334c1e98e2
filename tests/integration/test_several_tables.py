"""Issue 43: several outbox tables in one database are independent. Each table's functions live in
its schema, its relays' members and lanes and its writers' fences and marks have namespaces of their
own, and `migrate` for one leaves the others alone. Before, `s1.outbox_events` and `s2.outbox_events`
shared `outbox_claim` (one relay marked the other's events processed: lost), and two tables of one
unqualified name on two roles' paths shared every lock namespace (their relays split one set of lanes
between them, and one table's open writer held the other's lanes)."""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.parse
import uuid

import psycopg

from conftest import base_config, file_sink, read_jsonl, run_cli, wait_until, yaml_config

WRITERS, PER_WRITER, KEYS = 4, 150, 20
HOLD_SECONDS = 10.0


def _on_path(url: str, schema: str) -> str:
    """The database URL with the role's search_path set to schema only (libpq's options)."""
    return url + "?" + urllib.parse.urlencode({"options": f"-c search_path={schema}"}, quote_via=urllib.parse.quote)


def _function_defs(db, schemas) -> dict:
    return dict(db.query(
        "SELECT p.oid::regprocedure::text, md5(pg_get_functiondef(p.oid)) FROM pg_proc AS p "
        "JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = ANY(%s) AND p.prokind = 'f'",
        (list(schemas),)))


class _Writer(threading.Thread):
    """Inserts PER_WRITER events into one table, one per transaction with a short pause, and keeps
    each event's commit time."""

    def __init__(self, db, schema, seed, committed, lock):
        super().__init__(daemon=True)
        self.db, self.schema, self.rnd = db, schema, random.Random(seed)
        self.committed, self.lock, self.error = committed, lock, None

    def run(self):
        try:
            with self.db.connect() as conn:
                for n in range(PER_WRITER):
                    key = f"key-{self.rnd.randrange(KEYS)}"
                    event_id = conn.execute(
                        f"INSERT INTO {self.schema}.outbox_events (topic, aggregate_id, payload) "
                        "VALUES ('order.paid', %s, %s) RETURNING id",
                        (key, json.dumps({"table": self.schema, "n": n}))).fetchone()[0]
                    with self.lock:
                        self.committed[(self.schema, event_id)] = time.time()
                    time.sleep(self.rnd.uniform(0.0, 0.16))
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)


def test_three_tables_in_three_schemas_are_independent(db, workdir, relays):
    """3 tables named outbox_events in s1, s2, s3 (s1 configured qualified, s2 and s3 unqualified on
    roles' paths of their own), a relay and 4 writers each, and an open writer in s2 for 10 s: every
    table's events reach its own sink, each exactly once and in id order per key, nothing is lost,
    and s1's and s3's events are not held by s2's open writer."""
    schemas = ["s1", "s2", "s3"]
    with db.connect() as conn:
        for s in schemas:
            conn.execute(f"CREATE SCHEMA {s}")
    configured = {"s1": ("s1.outbox_events", db.url), "s2": ("outbox_events", _on_path(db.url, "s2")),
                  "s3": ("outbox_events", _on_path(db.url, "s3"))}
    before = None
    for s in schemas:
        table, url = configured[s]
        run_cli("--table", table, "migrate", env={"DATABASE_URL": url})
        assert db.scalar(f"SELECT to_regprocedure('{s}.outbox_publish(text, text, jsonb, jsonb)') IS NOT NULL"), s
        before = before or _function_defs(db, ["public", "s1"])
    # migrate for s2 and s3 left public's and s1's functions as they were.
    assert _function_defs(db, ["public", "s1"]) == before

    for s in schemas:
        table, url = configured[s]
        config = base_config(db, file_sink(workdir / f"{s}.jsonl"), poll_interval="50ms")
        config["database"] = {"url": url, "table": table}
        relays(config, name=f"relay-{s}")

    committed, lock = {}, threading.Lock()
    writers = [_Writer(db, s, seed=10 * i + w, committed=committed, lock=lock)
               for i, s in enumerate(schemas) for w in range(WRITERS)]
    seen = {}

    def watch(stop):
        while not stop.is_set():
            for s in schemas:
                for event in read_jsonl(workdir / f"{s}.jsonl") if (workdir / f"{s}.jsonl").exists() else []:
                    seen.setdefault((s, int(event["id"])), time.time())
            time.sleep(0.05)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
    watcher.start()
    for w in writers:
        w.start()
    time.sleep(1.0)
    # The open writer: a row of s2 inserted, its transaction left open for HOLD_SECONDS.
    hold = psycopg.connect(db.url)
    held_id = hold.execute("INSERT INTO s2.outbox_events (topic, aggregate_id, payload) "
                           "VALUES ('order.paid', 'held', '{\"table\": \"s2\"}') RETURNING id").fetchone()[0]
    hold_began = time.time()
    time.sleep(HOLD_SECONDS)
    hold.commit()
    hold.close()
    with lock:
        committed[("s2", held_id)] = time.time()
    for w in writers:
        w.join(120)
        assert w.error is None, w.error

    total = WRITERS * PER_WRITER * len(schemas) + 1
    wait_until(lambda: len(seen) >= total, timeout=60, message=f"{total} events delivered")
    stop.set()
    watcher.join(5)

    for s in schemas:
        events = read_jsonl(workdir / f"{s}.jsonl")
        ids = [int(e["id"]) for e in events]
        assert len(ids) == len(set(ids)), f"{s}: duplicates"
        assert all(e["payload"]["table"] == s for e in events), f"{s}: another table's event in its sink"
        rows = {r[0]: r[1] for r in db.query(f"SELECT id, aggregate_id FROM {s}.outbox_events")}
        assert sorted(ids) == sorted(rows), f"{s}: delivered ids are not the table's ids"
        assert db.scalar(f"SELECT count(*) FROM {s}.outbox_events WHERE processed_at IS NULL") == 0
        last = {}
        for e in events:
            key = rows[int(e["id"])]
            assert key == e["key"]
            assert last.get(key, 0) < int(e["id"]), f"{s}: key {key} out of order at {e['id']}"
            last[key] = int(e["id"])

    # s1's and s3's events committed while s2's writer was open arrived promptly: not held by it.
    for s in ("s1", "s3"):
        during = [(seen[k] - t) for k, t in committed.items()
                  if k[0] == s and hold_began + 0.5 < t < hold_began + HOLD_SECONDS - 2.0]
        assert len(during) > 50, f"{s}: too few events during the hold ({len(during)})"
        assert max(during) < 2.0, f"{s}: an event waited {max(during):.1f} s behind s2's open writer"


def test_tables_with_roles_of_their_own_cannot_reach_each_other(db, workdir, relays):
    """database.roles: migrate makes <roles>_writer and <roles>_relay for the table. A writer of s1
    cannot insert into s2, a relay of s1 can neither read s2's rows nor call s2's functions, the
    shared default roles get nothing on either, and s1's relay logged in through its own role works."""
    tag = uuid.uuid4().hex[:6]
    password = db.url.split(":")[2].split("@")[0]
    logins = {}
    with db.connect() as conn:
        for s in ("s1", "s2"):
            conn.execute(f"CREATE SCHEMA {s}")
    for s in ("s1", "s2"):
        config = base_config(db, file_sink(workdir / f"{s}.jsonl"))
        config["database"].update({"table": f"{s}.outbox_events", "roles": f"{s}_{tag}"})
        path = workdir / f"{s}.yaml"
        path.write_text(yaml_config(config))
        run_cli("--config", str(path), "migrate")
        with db.connect() as conn:
            for kind in ("writer", "relay"):
                login = f"{s}_{kind}_{tag}"
                conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD 'p' IN ROLE {s}_{tag}_{kind}")
                logins[(s, kind)] = db.url.replace("postgres:" + password, f"{login}:p")

    def refused(url, sql):
        with psycopg.connect(url, autocommit=True) as conn:
            try:
                conn.execute(sql)
            except psycopg.errors.InsufficientPrivilege:
                return True
        return False

    insert = "INSERT INTO {}.outbox_events (topic, aggregate_id, payload) VALUES ('t', 'k', '{{}}')"
    with psycopg.connect(logins[("s1", "writer")], autocommit=True) as conn:
        conn.execute(insert.format("s1"))
    assert refused(logins[("s1", "writer")], insert.format("s2"))
    assert refused(logins[("s1", "writer")], "SELECT payload FROM s1.outbox_events")
    assert refused(logins[("s1", "relay")], "SELECT payload FROM s2.outbox_events")
    assert refused(logins[("s1", "relay")], "SELECT * FROM s2.outbox_writers()")
    assert refused(logins[("s2", "writer")], insert.format("s1"))
    for s in ("s1", "s2"):
        for role, privilege in (("outbox_writer", "INSERT"), ("outbox_relay", "SELECT")):
            assert not db.scalar("SELECT has_table_privilege(%s, %s, %s)", (role, f"{s}.outbox_events", privilege))

    config = base_config(db, file_sink(workdir / "s1.jsonl"))
    config["database"].update({"url": logins[("s1", "relay")], "table": "s1.outbox_events"})
    relays(config)
    wait_until(lambda: len(read_jsonl(workdir / "s1.jsonl")) == 1, message="s1's event")
    assert db.scalar("SELECT count(*) FROM s2.outbox_events") == 0
