"""What a database, a role or a writer may change under the relay (issue 43): settings on the
relay's role, table features an operator can switch on, row contents Postgres accepts but the relay
cannot carry. For each, the relay pins the setting, or says what is wrong (an error log, /readyz
503), or dead-letters the one row with the reason while the rest flows on; never silent."""
from __future__ import annotations

import uuid

import psycopg
import pytest

from conftest import base_config, file_sink, free_port, http_get, pending, read_jsonl, wait_until

FAST_RECONNECT = {"initial": "100ms", "max": "500ms"}  # a refused table is looked at again soon
PAYLOAD = '{"text": "grüße ✓ €", "f": 0.1, "n": 12345678901234567890}'


@pytest.fixture
def relay_role(db):
    """A login role in outbox_relay, unique per test (roles are the cluster's); its URL."""
    role = f"relay_{uuid.uuid4().hex[:6]}"
    password = db.url.split(":")[2].split("@")[0]
    with db.connect() as c:
        c.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'r' IN ROLE outbox_relay")
    yield role, db.url.replace("postgres:" + password, f"{role}:r")
    with db.connect() as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        c.execute(f"DROP OWNED BY {role} CASCADE")
        c.execute(f"DROP ROLE {role}")


def start(relays, db, out, url, port=None):
    config = base_config(db, file_sink(out))
    config["database"]["url"] = url
    if port:
        config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    return relay


def test_settings_on_the_relays_role_change_nothing_it_delivers(db, relays, workdir, relay_role):
    role, url = relay_role
    with db.connect() as c:
        for setting in ("client_encoding = 'LATIN1'", "default_transaction_isolation = 'serializable'",
                        "default_transaction_read_only = on", "transform_null_equals = on",
                        "DateStyle = 'SQL, DMY'", "TimeZone = 'Pacific/Chatham'", "IntervalStyle = 'sql_standard'",
                        "extra_float_digits = -15", "row_security = off"):
            c.execute(f"ALTER ROLE {role} IN DATABASE {db.name} SET {setting}")
    out = workdir / "events.jsonl"
    relay = start(relays, db, out, url)
    ids = []
    with db.connect() as c:
        for i in range(20):
            ids.append(c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', %s, %s) "
                                 "RETURNING id", (f"k{i % 3}", PAYLOAD)).fetchone()[0])
    wait_until(lambda: pending(db) == 0, timeout=20, message="every event delivered and marked")
    stored = dict(db.query("SELECT id, payload::text FROM outbox_events"))
    created = dict(db.query("SELECT id, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') "
                            "FROM outbox_events"))
    lines = read_jsonl(out)
    assert sorted(l["id"] for l in lines) == ids
    raw = {l["id"]: l for l in lines}
    for i in ids:
        assert raw[i]["created_at"] == created[i]
    text = out.read_text(encoding="utf-8")
    assert "grüße ✓ €" in text and all(stored[i] == stored[ids[0]] for i in ids)
    assert relay.stop() == 0


def test_a_created_at_the_relay_cannot_carry_dead_letters_that_row_and_the_rest_flows(db, relays, workdir):
    out = workdir / "events.jsonl"
    relay = start(relays, db, out, db.url)
    bad_times = ["infinity", "-infinity", "12000-01-01 00:00:00+00", "0044-03-15 12:00:00+00 BC"]
    with db.connect() as c:
        before = [c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', 'k', '{}') "
                            "RETURNING id").fetchone()[0]]
        bad = [c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload, created_at) "
                         "VALUES ('t', 'k', '{}', %s) RETURNING id", (t,)).fetchone()[0] for t in bad_times]
        after = [c.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('t', %s, '{}') "
                           "RETURNING id", (key,)).fetchone()[0] for key in ("k", "other")]
    wait_until(lambda: pending(db) == 0, timeout=20, message="nothing pending")
    assert sorted(l["id"] for l in read_jsonl(out)) == before + after
    dead = dict(db.query("SELECT id, last_error FROM outbox_events WHERE dead_lettered_at IS NOT NULL"))
    assert sorted(dead) == bad
    assert all("created_at" in e for e in dead.values()), dead
    assert relay.stop() == 0


def test_row_level_security_that_hides_rows_from_the_relay_is_reported_not_obeyed(db, relays, workdir, relay_role):
    role, url = relay_role
    with db.connect() as c:
        c.execute("ALTER TABLE outbox_events ENABLE ROW LEVEL SECURITY")
        c.execute(f"CREATE POLICY hide_some ON outbox_events TO {role} USING (aggregate_id <> 'hidden')")
    try:
        port = free_port()
        out = workdir / "events.jsonl"
        config = base_config(db, file_sink(out))
        config["database"].update(url=url, reconnect=FAST_RECONNECT)
        config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
        relay = relays(config)
        db.insert([("t", "hidden", {"i": 1}), ("t", "seen", {"i": 2})])
        wait_until(lambda: http_get(port, "/readyz")[0] == 503 and "row-level security" in relay.raw_logs(),
                   timeout=15, message="/readyz 503 and an error naming row-level security")
        assert not out.exists() or read_jsonl(out) == [], "no event of the table while some are hidden"
    finally:
        with db.connect() as c:
            c.execute("DROP POLICY IF EXISTS hide_some ON outbox_events")
            c.execute("ALTER TABLE outbox_events DISABLE ROW LEVEL SECURITY")
    wait_until(lambda: pending(db) == 0, timeout=20, message="both delivered once the policy is gone")
    assert sorted(l["key"] for l in read_jsonl(out)) == ["hidden", "seen"]
    assert relay.stop() == 0


def test_a_rule_that_swallows_the_relays_marks_is_reported(db, relays, workdir):
    with db.connect() as c:
        c.execute("CREATE RULE keep_pending AS ON UPDATE TO outbox_events DO INSTEAD NOTHING")
    try:
        port = free_port()
        out = workdir / "events.jsonl"
        config = base_config(db, file_sink(out))
        config["database"]["reconnect"] = FAST_RECONNECT
        config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
        relay = relays(config)
        wait_until(lambda: http_get(port, "/readyz")[0] == 503 and "keep_pending" in relay.raw_logs(),
                   timeout=15, message="/readyz 503 and an error naming the rule")
    finally:
        with db.connect() as c:
            c.execute("DROP RULE IF EXISTS keep_pending ON outbox_events")
    db.insert([("t", "k", {"i": 1})])
    wait_until(lambda: pending(db) == 0, timeout=20, message="delivered once the rule is gone")
    assert [l["key"] for l in read_jsonl(out)] == ["k"]
    assert relay.stop() == 0


def test_an_unlogged_outbox_is_reported(db, relays, workdir):
    with db.connect() as c:
        c.execute("ALTER TABLE outbox_events SET UNLOGGED")
    try:
        port = free_port()
        config = base_config(db, file_sink(workdir / "events.jsonl"))
        config["database"]["reconnect"] = FAST_RECONNECT
        config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
        relay = relays(config)
        wait_until(lambda: http_get(port, "/readyz")[0] == 503 and "UNLOGGED" in relay.raw_logs(),
                   timeout=15, message="/readyz 503 and an error naming UNLOGGED")
    finally:
        with db.connect() as c:
            c.execute("ALTER TABLE outbox_events SET LOGGED")
    wait_until(lambda: http_get(port, "/readyz")[0] == 200, timeout=15, message="ready once the table is logged")
    assert relay.stop() == 0


def test_a_row_trigger_before_the_relays_marks_is_named_in_a_warning(db, relays, workdir):
    """A BEFORE UPDATE row trigger that returns NULL swallows every mark (each event goes out again
    at every claim) where nothing said why. It may also be an operator's benign one, so the relay
    names it in a warning at connect and goes on; an AFTER trigger is no concern and is not named."""
    with db.connect() as c:
        c.execute("CREATE FUNCTION public.keep_pending() RETURNS trigger LANGUAGE plpgsql "
                  "AS $f$ BEGIN RETURN NULL; END $f$")
        c.execute("CREATE TRIGGER swallow_marks BEFORE UPDATE ON outbox_events FOR EACH ROW "
                  "EXECUTE FUNCTION public.keep_pending()")
        c.execute("CREATE FUNCTION public.audit_after() RETURNS trigger LANGUAGE plpgsql "
                  "AS $f$ BEGIN RETURN NULL; END $f$")
        c.execute("CREATE TRIGGER audit_after AFTER UPDATE ON outbox_events FOR EACH ROW "
                  "EXECUTE FUNCTION public.audit_after()")
    relay = relays(base_config(db, file_sink(workdir / "events.jsonl")))
    warning = relay.wait_log("row triggers that run before the relay's marks")
    assert warning["triggers"] == "swallow_marks", warning
    assert warning["level"] == "warn"
    assert relay.stop() == 0
