"""Issue 10, defect 4: database errors that a reconnect cannot cure (a role without grants, a table
not migrated, a wrong password). Each must keep the relay alive, give the operator's hint within one
reconnect backoff cap (an error log line, a /readyz reason, a metric), and recover by itself once
the operator fixed it, without a restart. Real Postgres, real binary."""
from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Database, free_port, http_get, read_jsonl, run_cli, wait_until

CAP_S = 2.0  # database.reconnect.max in these tests
# How long a step may take beyond the cap on a loaded 2-core machine (process start, a poll).
SLACK_S = 8.0
N_EVENTS = 7
ERROR_MSG = "database refuses the relay, an operator has to act"


# --- helpers -------------------------------------------------------------------------------------


def db_errors(port: int) -> dict:
    """{class: value} of outbox_relay_db_errors_total."""
    _, text = http_get(port, "/metrics")
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "outbox_relay_db_errors_total":
                out[s.labels["class"]] = s.value
    return out


def readyz(port: int):
    status, body = http_get(port, "/readyz")
    return status, (json.loads(body) if body else None)


def config_for(url: str, out, port: int) -> dict:
    return {"database": {"url": url, "reconnect": {"initial": "100ms", "max": f"{int(CAP_S * 1000)}ms"}},
            "relay": {"rebalance_interval": "500ms", "sweep_interval": "30s"},
            "http": {"enabled": True, "listen": f"127.0.0.1:{port}", "refresh_interval": "200ms"},
            "sinks": [{"name": "out", "type": "file", "path": str(out)}]}


def insert_events(db_url: str, n: int) -> list[int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return [conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES (%s, %s, %s) RETURNING id",
                             ("order.paid", f"k{i % 3}", json.dumps({"n": i}))).fetchone()[0] for i in range(n)]


def error_lines(relay, klass: str):
    return [l for l in relay.logs() if l.get("msg") == ERROR_MSG and l.get("class") == klass]


def assert_operator_told(relay, port: int, klass: str, hint_part: str, started: float, reasons: set[str]):
    """The error line with the hint, the /readyz reason and the metric, all within one cap."""
    line = wait_until(lambda: (error_lines(relay, klass) or [None])[0], timeout=CAP_S + SLACK_S,
                      message=f"an error line of class {klass}")
    assert time.monotonic() - started < CAP_S + SLACK_S
    assert line["level"] == "error"
    assert hint_part in line["hint"], line
    # Backs off to the cap at once (equal jitter: between half the cap and the cap).
    assert CAP_S * 1000 / 2 <= line["retry_in_ms"] <= CAP_S * 1000, line
    status, body = wait_until(lambda: (lambda r: r if r[1] and reasons <= set(r[1].get("reasons", [])) else None)(
        readyz(port)), timeout=CAP_S + SLACK_S, message=f"/readyz reasons {reasons}")
    assert status == 503
    assert body["ready"] is False
    counts = wait_until(lambda: (lambda c: c if c.get(klass, 0) >= 1 else None)(db_errors(port)),
                        timeout=CAP_S + SLACK_S, message=f"outbox_relay_db_errors_total{{class={klass!r}}}")
    assert set(counts) == {"transient", "other", "privilege", "undefined_object", "authentication", "configuration"}
    assert relay.alive()


def assert_recovers(relay, port: int, out, ids: list[int], db: Database, pid: int):
    """After the fix: every event delivered exactly once, marked, ready again, same process."""
    fixed = time.monotonic()
    wait_until(lambda: len(read_jsonl(out)) >= len(ids), timeout=CAP_S + SLACK_S, message="events after the fix")
    assert time.monotonic() - fixed < CAP_S + SLACK_S
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL") == len(ids),
               timeout=10, message="rows marked")
    time.sleep(0.3)  # nothing more arrives
    delivered = [e["id"] for e in read_jsonl(out)]
    assert sorted(delivered) == sorted(ids)
    assert len(delivered) == len(ids)
    wait_until(lambda: readyz(port)[0] == 200, timeout=10, message="/readyz 200 after the fix")
    assert relay.alive() and relay.proc.pid == pid
    assert any(l.get("msg") == "database session restored" for l in relay.logs())
    assert relay.stop() == 0


@pytest.fixture
def login_role(cluster):
    """A login role with a password, dropped afterwards: (name, password)."""
    name = "relay_" + uuid.uuid4().hex[:8]
    password = "pw-" + uuid.uuid4().hex[:12]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    yield name, password
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        # Its only privileges come through membership in outbox_relay: nothing to drop but the role.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(f"DROP ROLE IF EXISTS {name}")


def role_url(db: Database, name: str, password: str) -> str:
    host_port_db = db.url.split("@", 1)[1]
    return f"postgresql://{name}:{password}@{host_port_db}"


# --- the three cases ---------------------------------------------------------------------------

def test_role_without_grants_gets_the_grant_hint_and_recovers_after_grant(db, relays, workdir, login_role):
    name, password = login_role
    out = workdir / "events.jsonl"
    port = free_port()
    ids = insert_events(db.url, N_EVENTS)
    started = time.monotonic()
    relay = relays(config_for(role_url(db, name, password), out, port))
    pid = relay.proc.pid
    assert_operator_told(relay, port, "privilege", f"GRANT outbox_relay TO {name}", started,
                         {"database session down: privilege"})
    # The LISTEN session needs no grant: only the work session stays down. It connects on its own
    # thread, in parallel with the work session, so it may come up a little after the first error.
    wait_until(lambda: "LISTEN session down" not in " ".join(readyz(port)[1]["reasons"]), timeout=10,
               message="the LISTEN session up without any grant")
    assert "database session down: privilege" in readyz(port)[1]["reasons"]
    assert db_errors(port)["transient"] == 0
    assert read_jsonl(out) == []
    # The operator CLI says the same.
    status = run_cli("status", "--database-url", role_url(db, name, password), check=False)
    assert status.returncode == 1
    assert f"GRANT outbox_relay TO {name}" in status.stderr
    assert password not in status.stderr and password not in relay.raw_logs()
    # migrate needs more than the relay's grants, and says so.
    migrate = run_cli("migrate", "--database-url", role_url(db, name, password), check=False)
    assert migrate.returncode == 1
    assert "SQLSTATE 42501" in migrate.stderr and "hint: migrate creates the table" in migrate.stderr

    with db.connect() as conn:
        conn.execute(f"GRANT outbox_relay TO {name}")
    assert_recovers(relay, port, out, ids, db, pid)


def test_table_not_migrated_gets_the_migrate_hint_and_recovers_after_migrate(cluster, relays, workdir):
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    db = Database(cluster, name)
    try:
        out = workdir / "events.jsonl"
        port = free_port()
        started = time.monotonic()
        relay = relays(config_for(db.url, out, port))
        pid = relay.proc.pid
        assert_operator_told(relay, port, "undefined_object", "outbox-relay migrate", started,
                             {"database session down: undefined_object"})
        status = run_cli("status", "--database-url", db.url, check=False)
        assert status.returncode == 1
        assert "hint:" in status.stderr and "outbox-relay migrate" in status.stderr

        db.migrate()
        ids = insert_events(db.url, N_EVENTS)
        assert_recovers(relay, port, out, ids, db, pid)
    finally:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            conn.execute(f"DROP DATABASE IF EXISTS {name}")


def test_wrong_password_gets_the_password_hint_and_recovers_after_the_password_is_fixed(db, relays, workdir,
                                                                                       login_role):
    name, password = login_role
    with db.connect() as conn:
        conn.execute(f"GRANT outbox_relay TO {name}")
    configured = "pw-configured-" + uuid.uuid4().hex[:8]  # what the relay was given; the role has another
    out = workdir / "events.jsonl"
    port = free_port()
    ids = insert_events(db.url, N_EVENTS)
    started = time.monotonic()
    relay = relays(config_for(role_url(db, name, configured), out, port))
    pid = relay.proc.pid
    assert_operator_told(relay, port, "authentication", "check the password", started,
                         {"database session down: authentication", "LISTEN session down: authentication"})
    listener_lines = [l for l in error_lines(relay, "authentication") if l.get("session") == "listener"]
    assert listener_lines, "the LISTEN session reports the class too"
    assert read_jsonl(out) == []
    assert configured not in relay.raw_logs()

    with db.connect() as conn:
        conn.execute(f"ALTER ROLE {name} PASSWORD '{configured}'")
    assert_recovers(relay, port, out, ids, db, pid)
