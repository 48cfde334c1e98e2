"""Issue 10, defect 5: --table is a table name taken literally, checked by the rule of
database.table; it is never pasted into YAML, so ${...} is not expanded and no key rides along."""
from __future__ import annotations

import json
import uuid

import pytest

from conftest import base_config, file_sink, run_cli, run_config

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


def test_a_second_outbox_table_of_the_same_name_cannot_take_the_firsts_functions(db, workdir):
    """Issue 43: `s1.outbox_events` and `s2.outbox_events` both name their functions outbox_*, in the
    schema migrate runs in; the second migrate replaced the first's, and a relay of one marked the
    other's events processed without delivering them. migrate refuses the second table, and a relay
    whose functions serve another table (an installation made before) exits 1 naming both."""
    with db.connect() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS s2")
    env = {"DATABASE_URL": db.url}
    proc = run_cli("--table", "s2.outbox_events", "migrate", env=env, check=False)
    assert proc.returncode != 0
    assert "the function outbox_claim(" in proc.stderr and "serves table public.outbox_events, not " \
        "s2.outbox_events" in proc.stderr, proc.stderr
    assert db.scalar("SELECT to_regclass('s2.outbox_events')") is None, "nothing of the refused migrate is left"
    [first] = db.insert([("order.paid", "k", {"i": 1})])

    # An installation made before this check: s2's table beside the shared functions, recorded as
    # migrated. Its relay refuses to start; s2's event stays pending, not marked.
    with db.connect() as conn:
        conn.execute("CREATE TABLE s2.outbox_events (LIKE public.outbox_events INCLUDING ALL)")
        conn.execute("CREATE SEQUENCE s2.outbox_events_id_seq OWNED BY s2.outbox_events.id")
        conn.execute("ALTER TABLE s2.outbox_events ALTER id SET DEFAULT nextval('s2.outbox_events_id_seq')")
        conn.execute("INSERT INTO outbox_schema_migrations (table_name, version, name) "
                     "SELECT 's2.outbox_events', version, name FROM outbox_schema_migrations "
                     "WHERE table_name = 'outbox_events'")
        conn.execute("INSERT INTO s2.outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', 'k', '{}')")
    s2 = base_config(db, file_sink(workdir / "s2.jsonl"))
    s2["database"]["table"] = "s2.outbox_events"
    refused = run_config(workdir, s2, timeout=20)
    assert refused.returncode == 1, refused.stderr
    assert "serves table public.outbox_events, not s2.outbox_events" in refused.stderr, refused.stderr
    assert db.scalar("SELECT count(*) FROM s2.outbox_events WHERE processed_at IS NULL") == 1
    assert db.scalar("SELECT processed_at FROM public.outbox_events WHERE id = %s", (first,)) is None
