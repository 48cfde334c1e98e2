"""Issue 10, defect 5: --table is a table name taken literally, checked by the rule of
database.table; it is never pasted into YAML, so ${...} is not expanded and no key rides along."""
from __future__ import annotations

import json
import uuid

import pytest

from conftest import run_cli

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
