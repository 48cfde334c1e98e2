"""Issue 10, defect 5: --table is a table name taken literally, checked by the rule of
database.table; it is never pasted into YAML, so ${...} is not expanded and no key rides along."""
from __future__ import annotations

import json
import uuid

import pytest

from conftest import base_config, file_sink, read_jsonl, run_cli, run_config, wait_until

CLAIM_ARGS = ("(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], "
              "bigint[], timestamptz)")

RULE = "--table: expected a lower-case table name (optionally schema.table), got"


def test_env_reference_in_table_is_not_expanded(db):
    marker = f"/home/marker-{uuid.uuid4().hex[:8]}"
    proc = run_cli("--table", '"${HOME}"', "status", env={"DATABASE_URL": db.url, "HOME": marker}, check=False)
    assert proc.returncode == 2
    assert proc.stderr == f"outbox-relay: config error: {RULE} '${{HOME}}'\n"
    assert marker not in proc.stderr + proc.stdout


@pytest.mark.parametrize("source", ["temp file", "/etc/hostname"])
def test_file_reference_in_table_is_not_read_nor_printed(db, workdir, source):
    if source == "temp file":
        path = workdir / "secret"
        content = f"s3cret-{uuid.uuid4().hex}"
        path.write_text(content + "\n")
    else:
        path = "/etc/hostname"
        content = None  # may be a word too short to look for: the exact message below suffices
    proc = run_cli("--table", f'"${{file:{path}}}"', "status", env={"DATABASE_URL": db.url}, check=False)
    assert proc.returncode == 2
    assert proc.stderr == f"outbox-relay: config error: {RULE} '${{file:{path}}}'\n"
    if content:
        assert content not in proc.stderr + proc.stdout


@pytest.mark.parametrize("command", [["status"], ["migrate"], ["failed", "list"]])
def test_a_second_yaml_key_in_table_is_rejected(db, command):
    proc = run_cli("--table", "outbox_events, table: x", *command, env={"DATABASE_URL": db.url}, check=False)
    assert proc.returncode == 2
    assert proc.stderr == f"outbox-relay: config error: {RULE} 'outbox_events, table: x'\n"
    assert proc.stdout == ""
    assert db.scalar("SELECT to_regclass('x')") is None


@pytest.mark.parametrize("spelling", ["app.events", '"app.events"', "'app.events'"])
def test_schema_qualified_and_quoted_names_keep_working(db, spelling):
    with db.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS app")
    env = {"DATABASE_URL": db.url}
    assert run_cli("--table", spelling, "migrate", env=env).stdout.startswith("applied ")
    with db.connect() as conn:
        conn.execute("INSERT INTO app.events (topic, aggregate_id, payload) VALUES ('order.paid', 'k', '{}')")
    status = json.loads(run_cli("--table", spelling, "status", "--json", env=env).stdout)
    assert status["pending"] == 1
    assert [t["topic"] for t in status["topics"]] == ["order.paid"]
    # The default table is untouched.
    assert db.scalar("SELECT count(*) FROM outbox_events") == 0


def test_a_second_outbox_table_of_the_same_name_gets_functions_of_its_own(db, workdir, relays):
    """Issue 43: `s1.outbox_events` and `s2.outbox_events` both named their functions outbox_*, in the
    schema migrate ran in; the second migrate replaced the first's, and a relay of one marked the
    other's events processed without delivering them. Now each table's functions are made in its own
    schema. An installation made before (a table whose functions are another table's) is refused by
    migrate and by the relay, naming both (test_several_tables.py runs three tables side by side)."""
    with db.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS s2")
        conn.execute("CREATE SCHEMA IF NOT EXISTS s3")
    public_claim = "SELECT md5(pg_get_functiondef('public.outbox_claim" + CLAIM_ARGS + "'::regprocedure))"
    before = db.scalar(public_claim)
    run_cli("--table", "s2.outbox_events", "migrate", env={"DATABASE_URL": db.url})
    assert db.scalar("SELECT to_regprocedure('s2.outbox_claim" + CLAIM_ARGS + "') IS NOT NULL")
    assert db.scalar(public_claim) == before, "migrate for s2 changed public's claim function"
    [first] = db.insert([("order.paid", "k", {"i": 1})])

    # An installation made before: s3's table beside public's functions, recorded as migrated. Its
    # relay refuses to start and migrate refuses it; s3's event stays pending, not marked.
    with db.connect() as conn:
        conn.execute("CREATE TABLE s3.outbox_events (LIKE public.outbox_events INCLUDING ALL)")
        conn.execute("CREATE SEQUENCE s3.outbox_events_id_seq OWNED BY s3.outbox_events.id")
        conn.execute("ALTER TABLE s3.outbox_events ALTER id SET DEFAULT nextval('s3.outbox_events_id_seq')")
        conn.execute("INSERT INTO outbox_schema_migrations (table_name, version, name) "
                     "SELECT 's3.outbox_events', version, name FROM outbox_schema_migrations "
                     "WHERE table_name = 'outbox_events'")
        conn.execute("INSERT INTO s3.outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', 'k', '{}')")
    proc = run_cli("--table", "s3.outbox_events", "migrate", env={"DATABASE_URL": db.url}, check=False)
    assert proc.returncode != 0
    assert "serves table public.outbox_events, not s3.outbox_events" in proc.stderr, proc.stderr
    s3 = base_config(db, file_sink(workdir / "s3.jsonl"))
    s3["database"]["table"] = "s3.outbox_events"
    refused = run_config(workdir, s3, timeout=20)
    assert refused.returncode == 1, refused.stderr
    assert "serves table public.outbox_events, not s3.outbox_events" in refused.stderr, refused.stderr
    assert db.scalar("SELECT count(*) FROM s3.outbox_events WHERE processed_at IS NULL") == 1
    assert db.scalar("SELECT processed_at FROM public.outbox_events WHERE id = %s", (first,)) is None

    # The way out that docs/operations.md gives ("Two tables sharing their functions"): s3's table
    # set aside, migrate makes s3's own, the pending rows and the id sequence moved over.
    with db.connect() as conn, conn.transaction():
        conn.execute("ALTER TABLE s3.outbox_events RENAME TO outbox_events_before")
        conn.execute("DELETE FROM outbox_schema_migrations WHERE table_name = 's3.outbox_events'")
    run_cli("--table", "s3.outbox_events", "migrate", env={"DATABASE_URL": db.url})
    with db.connect() as conn, conn.transaction():
        conn.execute("LOCK TABLE s3.outbox_events_before")
        conn.execute("SELECT setval(pg_get_serial_sequence('s3.outbox_events', 'id'), "
                     "(SELECT max(id) FROM s3.outbox_events_before))")
        conn.execute("INSERT INTO s3.outbox_events (id, topic, aggregate_id, payload, headers, created_at) "
                     "OVERRIDING SYSTEM VALUE SELECT id, topic, aggregate_id, payload, headers, created_at "
                     "FROM s3.outbox_events_before WHERE processed_at IS NULL ORDER BY id")
    [moved] = [r[0] for r in db.query("SELECT id FROM s3.outbox_events")]
    [later] = db.insert([("order.paid", "k", {"i": 2})], table="s3.outbox_events")
    assert later > moved
    relays(s3)
    wait_until(lambda: len(read_jsonl(workdir / "s3.jsonl")) >= 2, message="s3's two events")
    assert [e["id"] for e in read_jsonl(workdir / "s3.jsonl")] == [moved, later]
    assert db.scalar("SELECT processed_at FROM public.outbox_events WHERE id = %s", (first,)) is None
