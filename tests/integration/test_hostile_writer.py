"""A writer role that may CREATE in `public` and in a schema first on the relay role's search_path
(issue 43): nothing it defines runs as the relay, and it cannot make the relay take another table
for the outbox. Every object the writer makes records `current_user` into a table anyone may
insert into; the relay's role must never show up there."""
from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from conftest import (base_config, file_sink, free_port, http_get, metric, pending, read_jsonl, run_cli, run_config,
                      wait_until)



# An operator over the lane's type (smallint or integer on the right: no exact match in pg_catalog)
# that the writer defines in a schema. Like every object of the writer's here, it records who ran
# it, then does what the relay's own would, so that a relay that calls it still works (the record
# is the only trace).
OPERATOR = r"""
CREATE FUNCTION {s}.lane_eq_{t}(public.outbox_events_lane, {t}) RETURNS boolean LANGUAGE plpgsql AS $b$
BEGIN
  INSERT INTO public.pwned VALUES (current_user, '{s}.=(outbox_events_lane, {t})');
  RETURN $1::{t} = $2;
END $b$;
CREATE OPERATOR {s}.= (LEFTARG = public.outbox_events_lane, RIGHTARG = {t}, FUNCTION = {s}.lane_eq_{t});
"""

# The outbox's own functions, shadowed in the writer's schema with the same arguments and results.
SHADOW_FUNCTIONS = r"""
SET check_function_bodies = off;
DO $d$
DECLARE
  f record;
BEGIN
  FOR f IN SELECT p.oid, p.proname, p.pronargs FROM pg_proc AS p
            WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'outbox\_%'
              AND p.prorettype <> 'trigger'::regtype LOOP
    EXECUTE format(
      'CREATE FUNCTION {s}.%I(%s) RETURNS %s LANGUAGE plpgsql AS $f$ BEGIN '
      'INSERT INTO public.pwned VALUES (current_user, %L); %s END $f$',
      f.proname, pg_get_function_arguments(f.oid), pg_get_function_result(f.oid), '{s}.' || f.proname,
      CASE WHEN pg_get_function_result(f.oid) LIKE 'TABLE(%' OR pg_get_function_result(f.oid) LIKE 'SETOF %'
           THEN format('RETURN QUERY SELECT * FROM public.%I(%s);', f.proname,
                       (SELECT string_agg('$' || i, ', ') FROM generate_series(1, f.pronargs) AS i))
           ELSE format('RETURN public.%I(%s);', f.proname,
                       (SELECT string_agg('$' || i, ', ') FROM generate_series(1, f.pronargs) AS i)) END);
  END LOOP;
END $d$;
"""


class Hostile:
    """Roles (unique per test: roles are the cluster's), the writer's schema, the record table."""

    def __init__(self, db):
        self.db = db
        tag = uuid.uuid4().hex[:6]
        self.writer, self.relay, self.schema = f"hostile_{tag}", f"relay_{tag}", f"evil_{tag}"
        password = db.url.split(":")[2].split("@")[0]
        self.writer_url = db.url.replace("postgres:" + password, f"{self.writer}:w")
        self.relay_url = db.url.replace("postgres:" + password, f"{self.relay}:r")
        with db.connect() as c:
            c.execute(f"CREATE ROLE {self.writer} LOGIN PASSWORD 'w' IN ROLE outbox_writer")
            c.execute(f"CREATE ROLE {self.relay} LOGIN PASSWORD 'r' IN ROLE outbox_relay")
            c.execute(f"GRANT CREATE ON SCHEMA public TO {self.writer}")
            c.execute(f"CREATE SCHEMA {self.schema} AUTHORIZATION {self.writer}")
            # The relay role's path starts with the writer's schema (an operator's mistake, or a
            # database that set it for everyone).
            c.execute(f"ALTER ROLE {self.relay} IN DATABASE {db.name} SET search_path = {self.schema}, public")
            c.execute("CREATE TABLE public.pwned (who text, what text, at timestamptz DEFAULT clock_timestamp())")
            c.execute("GRANT INSERT ON public.pwned TO PUBLIC")
        with psycopg.connect(self.writer_url, autocommit=True) as w:
            w.execute(f"GRANT USAGE ON SCHEMA {self.schema} TO PUBLIC")
            for schema in (self.schema, "public"):
                for rtype in ("smallint", "integer"):
                    w.execute(OPERATOR.replace("{s}", schema).replace("{t}", rtype))
            w.execute(SHADOW_FUNCTIONS.replace("{s}", self.schema))

    def records(self):
        return self.db.query("SELECT who, what FROM public.pwned ORDER BY at")

    def drop(self):
        with self.db.connect() as c:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename IN (%s, %s)",
                      (self.writer, self.relay))
            for role in (self.writer, self.relay):
                c.execute(f"DROP OWNED BY {role} CASCADE")
                c.execute(f"DROP ROLE {role}")


@pytest.fixture
def hostile(db):
    h = Hostile(db)
    yield h
    h.drop()


def test_nothing_a_writer_defines_on_the_relays_path_runs_as_the_relay(db, hostile, relays, workdir):
    out = workdir / "events.jsonl"
    config = base_config(db, file_sink(out), sweep_interval="1h")
    config["database"]["url"] = hostile.relay_url
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    with psycopg.connect(hostile.writer_url, autocommit=True) as w:
        # An open writer of key K holds its lane: the relay reads the writers and calls the claim
        # function while other keys flow.
        held = psycopg.connect(hostile.writer_url)
        held.execute("INSERT INTO public.outbox_events (topic, aggregate_id, payload) VALUES ('t', 'K', '{}')")
        for i in range(20):
            w.execute("INSERT INTO public.outbox_events (topic, aggregate_id, payload) VALUES ('t', %s, %s)",
                      (f"k{i % 5}", f'{{"i": {i}}}'))
        time.sleep(1.5)
        w.execute("INSERT INTO public.outbox_events (topic, aggregate_id, payload) VALUES ('t', 'K', '{}')")
        held.commit()
        held.close()
    wait_until(lambda: pending(db) == 0 and len(read_jsonl(out)) >= 22, timeout=20, message="22 events delivered")
    lines = read_jsonl(out)
    assert sorted(l["id"] for l in lines) == [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert [l["id"] for l in lines if l["key"] == "K"] == sorted(l["id"] for l in lines if l["key"] == "K")
    assert hostile.records() == []
    # The operator's commands, as the relay's role.
    for args in (["status"], ["status", "--json"], ["failed", "list"], ["failed", "retry", "--all"]):
        run_cli(*args, env={"DATABASE_URL": hostile.relay_url})
    assert relay.stop() == 0
    assert hostile.records() == []


def test_migrate_makes_nothing_in_and_runs_nothing_of_a_writers_schema_first_on_its_path(db, hostile):
    """migrate resolves the table on its role's path, then runs pinned: a new table's functions are
    made in the table's schema, not in a schema of the writer's that the path names first (whose
    owner could then replace them, and they run as the relay), and nothing of the writer's runs."""
    with db.connect() as c:
        c.execute("CREATE SCHEMA ledger")
    on_path = db.url + f"?options=-c%20search_path%3D{hostile.schema}%2Cpublic"
    run_cli("--table", "ledger.ledger_events", "migrate", env={"DATABASE_URL": on_path})
    assert db.scalar("SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace "
                     "AND proowner <> %s::regrole", (hostile.schema, hostile.writer)) == 0
    assert db.scalar("SELECT count(*) FROM pg_proc WHERE pronamespace = 'ledger'::regnamespace "
                     "AND proname LIKE 'ledger\\_%%'") >= 4
    assert hostile.records() == []


def test_a_table_that_shadows_the_outbox_on_the_relays_path_is_refused_by_name(db, hostile, relays, workdir):
    with psycopg.connect(hostile.writer_url, autocommit=True) as w:
        w.execute(f"CREATE TABLE {hostile.schema}.outbox_events (id bigserial PRIMARY KEY, topic text NOT NULL, "
                  "aggregate_id text NOT NULL DEFAULT '', payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}')")
        w.execute(f"GRANT ALL ON {hostile.schema}.outbox_events TO PUBLIC")
        w.execute(f"INSERT INTO {hostile.schema}.outbox_events (topic, aggregate_id, payload) VALUES ('t', 'k', '{{}}')")
    [real] = db.insert([("t", "k", {"i": 1})])
    out = workdir / "events.jsonl"
    config = base_config(db, file_sink(out))
    config["database"]["url"] = hostile.relay_url
    proc = run_config(workdir, config, timeout=20)
    assert proc.returncode == 1, proc.stderr
    assert f"{hostile.schema}, public" in proc.stderr and "schema-qualified" in proc.stderr, proc.stderr
    assert not out.exists() or read_jsonl(out) == []
    # Qualified, the same relay runs on the real one.
    config["database"]["table"] = "public.outbox_events"
    relay = relays(config)
    wait_until(lambda: out.exists() and [l["id"] for l in read_jsonl(out)] == [real], timeout=10,
               message="the real outbox's event")
    assert relay.stop() == 0
    assert hostile.records() == []


def test_the_relays_role_reads_a_writers_query_text_only_where_pg_stat_activity_shows_it(db, hostile):
    """outbox_writers() runs as its owner (it must read every writer's locks and state); the query
    text it hands the relay's role follows pg_stat_activity's rule for that role (schema 11)."""
    secret = "card=4111111111111111 cvv=123"
    writer = psycopg.connect(hostile.writer_url)
    try:
        writer.execute("INSERT INTO public.outbox_events (topic, aggregate_id, payload) "
                       f"VALUES ('t', 'k', '{{}}') /* {secret} */")
        with psycopg.connect(hostile.relay_url, autocommit=True) as r:
            def reading():
                rows = r.execute("SELECT query, state, pid, application_name FROM public.outbox_writers() "
                                 "WHERE vxid IS NOT NULL").fetchall()
                assert len(rows) == 1, rows
                return rows[0]

            def activity():
                return r.execute("SELECT query FROM pg_stat_activity WHERE usename = %s",
                                 (hostile.writer,)).fetchone()[0]

            query, state, pid, _ = reading()
            assert query == activity() == "<insufficient privilege>"
            assert state == "idle in transaction" and pid is not None  # what the report needs stays
            with db.connect() as c:
                c.execute(f"GRANT pg_read_all_stats TO {hostile.relay}")  # the operator opts in
            query, *_ = reading()
            assert secret in query and activity() == query
    finally:
        writer.rollback()
        writer.close()


def test_a_writers_notify_flood_wakes_the_relay_at_most_once_per_idle_poll_and_an_operators_retry_still_goes_out(
        db, hostile, relays, workdir):
    """Any role may NOTIFY the relay's channel (Postgres has no privilege for it). A writer sending
    ~10,000 a second wakes the relay at most once per idle_poll_interval (each wake is a drain from
    the start); an operator's `failed retry` during the flood is delivered as promptly as ever.
    bench/notify_flood.sh measures the CPU."""
    out = workdir / "events.jsonl"
    port = free_port()
    config = base_config(db, file_sink(out), idle_poll_interval="100ms")
    config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    [poison] = db.insert([("t", "k", {"i": 0}, {"n": 1})])  # a header that is not a string: dead-lettered
    wait_until(lambda: db.scalar("SELECT dead_lettered_at IS NOT NULL FROM outbox_events WHERE id = %s", (poison,)),
               message="the poison row dead-lettered")
    db.query("UPDATE outbox_events SET headers = '{}' WHERE id = %s RETURNING id", (poison,))

    def notify_wakeups():
        return metric(http_get(port, "/metrics")[1], 'outbox_relay_wakeups_total{source="notify"}') or 0.0

    before = notify_wakeups()
    stop, sent = threading.Event(), [0]

    def flood():
        with psycopg.connect(hostile.writer_url) as w:
            while not stop.is_set():
                w.execute("SELECT pg_notify('outbox_wakeup', 'x' || g) FROM generate_series(1, 100) AS g")
                w.commit()
                sent[0] += 100
                time.sleep(0.01)

    flooder = threading.Thread(target=flood)
    started = time.monotonic()
    flooder.start()
    try:
        time.sleep(2.0)
        retried_at = time.monotonic()
        run_cli("failed", "retry", "--id", str(poison), env={"DATABASE_URL": db.url})
        wait_until(lambda: poison in [l["id"] for l in read_jsonl(out)], timeout=5, message="the retried event")
        retry_seconds = time.monotonic() - retried_at
        time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))
    finally:
        stop.set()
        flooder.join()
    seconds = time.monotonic() - started
    woken = notify_wakeups() - before
    assert sent[0] / seconds > 4000, f"the flood was too slow to tell anything: {sent[0] / seconds:.0f}/s"
    # One ring per 100 ms at most, a few more around the edges (and the retry's own NOTIFY).
    assert woken <= seconds / 0.1 + 3, f"{woken:.0f} notify wakeups in {seconds:.1f}s of {sent[0]} NOTIFYs"
    assert retry_seconds < 2.0, f"the retried event took {retry_seconds:.2f}s during the flood"
    assert relay.stop() == 0
