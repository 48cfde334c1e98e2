"""Issue 5: metrics, health, the operator CLI, retention and packaging, against the real binary
and a real Postgres."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import (Database, RELAY_BIN, ROOT, base_config, free_port, read_jsonl, run_cli, throwaway_cluster, wait_until)

POISON_HEADERS = {"n": 1}  # a non-string header value: the loop dead-letters it as "invalid event"


# --- helpers and fixtures of this module -------------------------------------------------------

def http_get(port: int, path: str, timeout=5.0):
    """(status, content type, body text) of GET http://127.0.0.1:port/path; status 0 when refused."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        return 0, "", ""


class Scrape:
    """One /metrics exposition, parsed with prometheus_client's text parser."""

    def __init__(self, text: str):
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = {}
        for family in self.families.values():
            for s in family.samples:
                self.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def value(self, name, **labels):
        key = (name, tuple(sorted(labels.items())))
        assert key in self.samples, f"no sample {name}{labels} in /metrics"
        return self.samples[key]

    def series(self, name):
        """{labels-tuple: value} of every sample with this exact sample name."""
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def scrape(port) -> Scrape:
    status, ctype, body = http_get(port, "/metrics")
    assert status == 200, f"/metrics answered {status}"
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    return Scrape(body)


def ops_config(db, sinks, port, **relay):
    config = base_config(db, sinks, **relay)
    config["http"] = {"enabled": True, "listen": f"127.0.0.1:{port}", "refresh_interval": "200ms"}
    return config


def file_sink(path, name="out"):
    return [{"name": name, "type": "file", "path": str(path)}]


def ids_in(path):
    return [line["id"] for line in read_jsonl(path)]


def cli(db, *args, check=True):
    return run_cli(*args, env={"DATABASE_URL": db.url}, check=check)


def cli_json(db, *args):
    return json.loads(cli(db, *args, "--json").stdout)


def ranges_to_ids(ranges):
    return [i for first, last in ranges for i in range(first, last + 1)]


def counts(db):
    row = db.query("SELECT count(*) FILTER (WHERE processed_at IS NOT NULL), "
                   "count(*) FILTER (WHERE dead_lettered_at IS NOT NULL), "
                   "count(*) FILTER (WHERE processed_at IS NULL AND dead_lettered_at IS NULL) FROM outbox_events")[0]
    return {"processed": row[0], "dead": row[1], "pending": row[2]}


def wait_ready(port, timeout=30.0):
    return wait_until(lambda: http_get(port, "/readyz")[0] == 200, timeout=timeout, message="/readyz 200")


@pytest.fixture(scope="module")
def own_cluster():
    """A Postgres cluster of this module alone: the readiness test stops and starts it."""
    with throwaway_cluster("outbox-ops-") as c:
        yield c


@pytest.fixture
def own_db(own_cluster):
    name = "ops_" + os.urandom(5).hex()
    with psycopg.connect(own_cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    d = Database(own_cluster, name)
    d.migrate()
    return d


# --- 1. metrics after a known workload ---------------------------------------------------------

def test_1_metrics_after_known_workload(db, relays, workdir):
    n_good, k_poison = 240, 7
    rows = [("order.paid", f"key-{i % 12}", {"i": i}) for i in range(n_good)]
    for j in range(k_poison):  # spread among the good ones, sharing their keys
        rows.insert(j * 30 + 3, ("order.paid", f"key-{j % 12}", {"poison": j}, POISON_HEADERS))
    out = workdir / "out.jsonl"
    port = free_port()
    relay = relays(ops_config(db, file_sink(out), port))
    wait_ready(port)
    db.insert(rows)

    wait_until(lambda: counts(db) == {"processed": n_good, "dead": k_poison, "pending": 0},
               message="workload done")
    # The backlog gauges come from a timer (200ms here): wait for a refresh after the drain.
    m = wait_until(lambda: (s := scrape(port)).value("outbox_relay_pending_events") == 0 and s,
                   message="pending gauge at 0")

    assert m.value("outbox_relay_events_published_total", sink="out") == n_good
    assert m.value("outbox_relay_events_dead_lettered_total", sink="relay") == k_poison
    assert m.value("outbox_relay_events_dead_lettered_total", sink="out") == 0
    assert sum(m.series("outbox_relay_events_dead_lettered_total").values()) == k_poison
    assert m.value("outbox_relay_events_retried_total", sink="out") == 0
    assert m.value("outbox_relay_pending_events") == 0
    assert m.value("outbox_relay_oldest_pending_age_seconds") == 0
    assert m.value("outbox_relay_delivery_latency_seconds_count", sink="out") == n_good
    assert m.value("outbox_relay_delivery_latency_seconds_bucket", sink="out", le="+Inf") == n_good
    assert m.value("outbox_relay_delivery_latency_seconds_sum", sink="out") > 0
    assert m.families["outbox_relay_delivery_latency_seconds"].type == "histogram"
    assert m.families["outbox_relay_claim_duration_seconds"].type == "histogram"
    assert m.families["outbox_relay_publish_duration_seconds"].type == "histogram"
    assert m.value("outbox_relay_claim_duration_seconds_count") >= 1
    assert m.value("outbox_relay_publish_duration_seconds_count", sink="out") >= 1
    assert m.value("outbox_relay_db_reconnects_total") == 0
    # Every class of database error is exposed from the start, and none happened.
    assert {dict(labels)["class"]: v for labels, v in m.series("outbox_relay_db_errors_total").items()} == {
        "transient": 0, "other": 0, "privilege": 0, "undefined_object": 0, "authentication": 0, "configuration": 0}
    assert m.value("outbox_relay_ready") == 1
    assert m.value("outbox_relay_lanes_owned") == 64
    assert 0 <= m.value("outbox_relay_notification_queue_usage") < 0.01
    assert m.value("outbox_relay_retention_deleted_total") == 0
    version = run_cli("--version").stdout.split()[-1]
    assert m.value("outbox_relay_build_info", version=version) == 1
    wakeups = m.series("outbox_relay_wakeups_total")
    assert {dict(labels)["source"] for labels in wakeups} == {"notify", "poll", "sweep", "retry", "startup", "watch",
                                                                     "reload"}
    # Writers ring no bell (schema 2): the relay found the events by polling.
    assert m.value("outbox_relay_wakeups_total", source="poll") >= 1
    assert m.value("outbox_relay_wakeups_total", source="notify") == 0
    # Every metric has the prefix, and labels stay bounded: no key, no event id.
    assert all(name.startswith("outbox_relay_") for name in m.families)
    label_names = {k for (_, labels) in m.samples for k, _ in labels}
    assert label_names <= {"sink", "source", "version", "le", "class", "result", "reason"}
    # Tracing off: no span built, none dropped (the reasons are a fixed pair).
    assert m.value("outbox_relay_spans_exported_total") == 0
    assert {dict(labels)["reason"]: v for labels, v in m.series("outbox_relay_spans_dropped_total").items()} == {
        "queue_full": 0, "export_failed": 0}
    # Reloads of the config file (test_reload.py): both results exposed from the start.
    assert m.value("outbox_relay_config_reloads_total", result="ok") == 0
    assert m.value("outbox_relay_config_reloads_total", result="error") == 0
    assert not [labels for (_, labels) in m.samples if any("key-" in v for _, v in labels)]
    # And what the metrics claim is what the sink got.
    assert sorted(ids_in(out)) == [r[0] for r in db.query(
        "SELECT id FROM outbox_events WHERE processed_at IS NOT NULL ORDER BY id")]
    assert relay.stop() == 0


def test_backlog_gauges_count_what_waits(db, relays, workdir):
    """pending and oldest age track rows that are not due yet, then drop to 0 once delivered."""
    out = workdir / "out.jsonl"
    ids = db.insert([("t", f"k{i}", {"i": i}) for i in range(3)])
    db.query("UPDATE outbox_events SET next_attempt_at = now() + interval '1 hour', "
             "created_at = now() - interval '100 seconds' WHERE id = ANY(%s) RETURNING id", (ids,))
    port = free_port()
    relay = relays(ops_config(db, file_sink(out), port))
    wait_ready(port)
    m = wait_until(lambda: (s := scrape(port)).value("outbox_relay_pending_events") == 3 and s,
                   message="pending gauge at 3")
    assert 100 <= m.value("outbox_relay_oldest_pending_age_seconds") < 130
    db.query("UPDATE outbox_events SET next_attempt_at = '-infinity' RETURNING id")
    db.query("SELECT pg_notify('outbox_wakeup', '')")
    wait_until(lambda: sorted(ids_in(out)) == ids, message="the 3 rows delivered")
    m = wait_until(lambda: (s := scrape(port)).value("outbox_relay_pending_events") == 0 and s,
                   message="pending gauge back at 0")
    assert m.value("outbox_relay_oldest_pending_age_seconds") == 0
    assert relay.stop() == 0


# --- 2. readiness follows Postgres, liveness does not -----------------------------------------

def test_2_readyz_503_while_postgres_stopped_healthz_stays_200(own_cluster, own_db, relays, workdir):
    out = workdir / "out.jsonl"
    port = free_port()
    relay = relays(ops_config(own_db, file_sink(out), port))
    wait_ready(port)
    status, ctype, body = http_get(port, "/readyz")
    assert (status, ctype, json.loads(body)) == (200, "application/json", {"ready": True})
    assert http_get(port, "/healthz")[0] == 200

    health_codes = []
    stop_polling = threading.Event()

    def poll_health():
        while not stop_polling.is_set():
            health_codes.append(http_get(port, "/healthz")[0])
            time.sleep(0.1)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    try:
        own_cluster.stop_server()
        try:
            status, _, body = wait_until(lambda: (r := http_get(port, "/readyz"))[0] == 503 and r,
                                         timeout=30, message="/readyz 503")
            reasons = json.loads(body)["reasons"]
            assert json.loads(body)["ready"] is False
            assert set(reasons) <= {"database session down", "LISTEN session down"} and reasons
            # /metrics keeps answering without the database, and says not ready.
            assert wait_until(lambda: scrape(port).value("outbox_relay_ready") == 0, message="ready gauge 0")
            time.sleep(1.0)  # an outage of a while: still 503, still alive
            assert http_get(port, "/readyz")[0] == 503
            assert relay.alive()
        finally:
            own_cluster.start_server()
        wait_ready(port, timeout=90)
        assert json.loads(http_get(port, "/readyz")[2]) == {"ready": True}
    finally:
        stop_polling.set()
        poller.join()
    assert health_codes and set(health_codes) == {200}, sorted(set(health_codes))
    assert len(health_codes) >= 10

    # Recovered for real: an event written now is delivered, and the reconnects were counted.
    [new_id] = own_db.insert([("t", "k", {"after": "restart"})])
    wait_until(lambda: new_id in ids_in(out), timeout=60, message="event after restart delivered")
    assert scrape(port).value("outbox_relay_db_reconnects_total") >= 1
    assert scrape(port).value("outbox_relay_ready") == 1
    assert relay.stop() == 0


def test_readyz_names_an_unusable_sink(db, relays, workdir):
    # A file that opens at start (a missing directory is refused then) but whose writes fail
    # later, as on a full disk: the path leads to /dev/full until the "disk" is back.
    out, real = workdir / "out.jsonl", workdir / "real.jsonl"
    out.symlink_to("/dev/full")
    port = free_port()
    relay = relays(ops_config(db, file_sink(out), port))
    wait_ready(port)
    [event_id] = db.insert([("t", "k", {"a": 1})])
    status, _, body = wait_until(lambda: (r := http_get(port, "/readyz"))[0] == 503 and r, message="503")
    assert json.loads(body) == {"ready": False, "reasons": ["sink 'out' not usable"]}
    assert http_get(port, "/healthz")[0] == 200
    assert scrape(port).value("outbox_relay_events_retried_total", sink="out") >= 1
    out.unlink()
    out.symlink_to(real)
    wait_until(lambda: ids_in(real) == [event_id], message="delivered once the disk is back")
    wait_ready(port)
    assert relay.stop() == 0


def test_http_listen_in_use_exits_2_naming_the_key(db, relays, workdir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        relay = relays(ops_config(db, file_sink(workdir / "out.jsonl"), port))
        assert relay.proc.wait(timeout=30) == 2
    text = relay.raw_logs()
    assert re.search(rf"http\.listen: cannot listen on 127\.0\.0\.1:{port}: Address already in use", text), text


def test_http_disabled_serves_nothing(db, relays, workdir):
    port = free_port()
    config = ops_config(db, file_sink(workdir / "out.jsonl"), port)
    config["http"]["enabled"] = False
    relay = relays(config)
    relay.wait_log("ordering lanes rebalanced")
    assert http_get(port, "/healthz")[0] == 0
    assert relay.stop() == 0


@contextlib.contextmanager
def partitioned(port: int):
    """Packets to and from the TCP port dropped (iptables on lo), as when a failover moves the
    server's address or a network partition starts: no reset reaches either side. Undone after."""
    iptables = shutil.which("iptables")
    if iptables is None or os.getuid() != 0:
        pytest.skip("needs iptables and root (scripts/install-deps.sh installs iptables)")
    rules = [["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
             ["INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP"]]
    probe = subprocess.run([iptables, "-w", "-L", "INPUT", "-n"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"iptables cannot run here: {probe.stderr.strip()[:200]}")
    added = []
    try:
        for rule in rules:
            subprocess.run([iptables, "-w", "-I", *rule], check=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run([iptables, "-w", "-D", *rule], check=False)


def test_2_a_server_that_vanishes_without_a_reset_is_noticed(own_cluster, own_db, relays, workdir):
    """The relay's sessions are cut without a reset reaching it (their backends ended while
    packets to and from the port are dropped, as when a failover moves the server's address): each
    session must find out by itself. With libpq's defaults a statement sent then is retransmitted
    for ~15 min and an idle LISTEN session waits forever; with the relay's settings
    (tcp_user_timeout 30 s, keepalives after 10 s idle, every 5 s, 3 lost) both are given up within
    ~30 s, and once the path is back the relay reconnects and delivers."""
    out = workdir / "out.jsonl"
    port = free_port()
    relay = relays(ops_config(own_db, file_sink(out), port))
    wait_ready(port)
    relay.wait_log("^listening$")
    pg_port = int(own_db.url.rsplit(":", 1)[1].split("/")[0])
    local = f"host={own_cluster.dir} port={pg_port} dbname={own_db.name} user=postgres"  # the Unix socket
    with partitioned(pg_port):
        with psycopg.connect(local, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        cut = time.monotonic()
        relay.wait_log("database unavailable", timeout=45)
        relay.wait_log("LISTEN session lost", timeout=45)
        noticed = time.monotonic() - cut
    relay.wait_log("LISTEN session restored", timeout=30)
    assert noticed <= 40, f"the dead sessions were noticed after {noticed:.1f} s"
    ids = own_db.insert([("order.paid", "k", {"n": 1})])
    wait_until(lambda: ids_in(out) == ids, timeout=10, message="an event after the cut")


# --- 3. failed list / retry / purge and replay ------------------------------------------------

def test_3_failed_retry_replay_and_purge(db, relays, workdir):
    out = workdir / "out.jsonl"
    good = db.insert([("order.paid", f"k{i % 5}", {"i": i}) for i in range(10)])
    poison_paid = db.insert([("order.paid", f"p{i}", {"p": i}, POISON_HEADERS) for i in range(3)])
    poison_invoice = db.insert([("invoice.sent", f"q{i}", {"q": i}, POISON_HEADERS) for i in range(2)])
    poison = poison_paid + poison_invoice
    relay = relays(base_config(db, file_sink(out)))
    wait_until(lambda: counts(db) == {"processed": 10, "dead": 5, "pending": 0}, message="10 delivered, 5 dead")

    # failed list: id, topic, key, attempts, last_error; filters and limit.
    listing = cli_json(db, "failed", "list")
    assert listing["total"] == 5
    assert [e["id"] for e in listing["events"]] == poison
    assert [e["topic"] for e in listing["events"]] == ["order.paid"] * 3 + ["invoice.sent"] * 2
    assert [e["key"] for e in listing["events"]] == ["p0", "p1", "p2", "q0", "q1"]
    assert {e["attempts"] for e in listing["events"]} == {1}
    assert all(e["last_error"] == "invalid event: header 'n' must be a string, got number"
               for e in listing["events"])
    assert [e["id"] for e in cli_json(db, "failed", "list", "--topic", "invoice.sent")["events"]] == poison_invoice
    limited = cli_json(db, "failed", "list", "--limit", "2")
    assert (limited["total"], [e["id"] for e in limited["events"]]) == (5, poison[:2])
    text = cli(db, "failed", "list").stdout.splitlines()
    assert text[0].split()[:5] == ["ID", "TOPIC", "KEY", "ATTEMPTS", "DEAD_LETTERED_AT"]
    assert [int(line.split()[0]) for line in text[1:-1]] == poison
    assert text[-1] == "5 of 5 dead-lettered events shown"

    # The operator fixes the data, then retries: by id, by topic, then all.
    db.query("UPDATE outbox_events SET headers = '{}' WHERE id = ANY(%s) RETURNING id", (poison,))
    res = cli(db, "failed", "retry", "--id", str(poison[0]))
    assert res.stdout.splitlines()[0] == (f"retried 1 dead-lettered events; they are pending again, attempts reset "
                                          f"to 0 (ids: {poison[0]})")
    # The line reaches the sink before the mark is written (publish, then complete).
    wait_until(lambda: poison[0] in ids_in(out) and db.scalar(
        "SELECT processed_at IS NOT NULL FROM outbox_events WHERE id = %s", (poison[0],)),
        message="retried id delivered and marked")
    row = db.query("SELECT attempts, dead_lettered_at, processed_at IS NOT NULL, last_error FROM outbox_events "
                   "WHERE id = %s", (poison[0],))[0]
    assert row[:3] == (0, None, True)
    assert row[3].startswith("invalid event")  # kept: last_error is history, documented

    res = cli_json(db, "failed", "retry", "--topic", "invoice.sent")
    assert (res["action"], res["count"], ranges_to_ids(res["id_ranges"])) == ("retried", 2, poison_invoice)
    res = cli_json(db, "failed", "retry", "--all")
    assert (res["count"], ranges_to_ids(res["id_ranges"])) == (2, poison_paid[1:])
    wait_until(lambda: counts(db) == {"processed": 15, "dead": 0, "pending": 0}, message="all 15 delivered")
    wait_until(lambda: len(ids_in(out)) == 15, message="15 lines")
    assert sorted(ids_in(out)) == sorted(good + poison)
    assert cli_json(db, "failed", "retry", "--all")["count"] == 0
    res = cli(db, "failed", "retry", "--id", str(good[0]))
    assert f"unchanged: event {good[0]} is not dead-lettered" in res.stdout
    res = cli_json(db, "failed", "retry", "--id", str(good[0]), "--id", "999999")
    assert (res["count"], res["unchanged_ids"]) == (0, [good[0], 999999])

    # replay re-sends a range, only that range, each id once more.
    lo, hi = good[2], good[6]
    res = cli_json(db, "replay", "--from-id", str(lo), "--to-id", str(hi))
    assert (res["action"], res["count"], ranges_to_ids(res["id_ranges"])) == ("replayed", 5, list(range(lo, hi + 1)))
    wait_until(lambda: len(ids_in(out)) == 20, message="5 re-sent lines")
    lines = ids_in(out)
    assert sorted(lines[15:]) == list(range(lo, hi + 1))
    assert {i: lines.count(i) for i in set(lines)} == {i: (2 if lo <= i <= hi else 1) for i in good + poison}
    # ... and by topic, open-ended.
    res = cli(db, "replay", "--from-id", "1", "--topic", "invoice.sent")
    assert res.stdout.strip() == (f"replayed 2 processed events; they are pending again "
                                  f"(ids: {poison_invoice[0]}-{poison_invoice[1]})")
    wait_until(lambda: len(ids_in(out)) == 22, message="2 more re-sent lines")
    assert sorted(ids_in(out)[20:]) == poison_invoice
    wait_until(lambda: counts(db) == {"processed": 15, "dead": 0, "pending": 0}, message="replays done")

    # purge deletes only dead letters older than the bound.
    more = db.insert([("order.paid", f"z{i}", {"z": i}, POISON_HEADERS) for i in range(4)])
    wait_until(lambda: counts(db)["dead"] == 4, message="4 new dead letters")
    db.query("UPDATE outbox_events SET dead_lettered_at = now() - interval '8 days' WHERE id = ANY(%s) RETURNING id",
             (more[:2],))
    db.query("UPDATE outbox_events SET dead_lettered_at = now() - interval '6 days' WHERE id = %s RETURNING id",
             (more[2],))
    db.query("UPDATE outbox_events SET processed_at = now() - interval '30 days' WHERE id = ANY(%s) RETURNING id",
             (good,))  # old processed rows are not purge's business
    before = set(r[0] for r in db.query("SELECT id FROM outbox_events"))
    res = cli(db, "failed", "purge", "--older-than", "7d")
    assert res.stdout.strip() == f"purged 2 dead-lettered events older than 7d (ids: {more[0]}-{more[1]})"
    after = set(r[0] for r in db.query("SELECT id FROM outbox_events"))
    assert before - after == set(more[:2])
    assert [e["id"] for e in cli_json(db, "failed", "list")["events"]] == more[2:]
    assert cli_json(db, "failed", "purge", "--older-than", "7d")["count"] == 0
    res = cli_json(db, "failed", "purge", "--older-than", "1h", "--topic", "no.such.topic")
    assert res["count"] == 0
    assert relay.stop() == 0


def test_operator_cli_usage_errors_exit_2_naming_the_flag(db):
    cases = [
        (["failed", "retry"], r"--id|--topic|--all"),
        (["failed", "retry", "--all", "--topic", "t"], r"--id|--topic|--all"),
        (["failed", "purge"], r"--older-than"),
        (["failed", "purge", "--older-than", "7"], r"--older-than: expected a duration such as 7d, 12h or 30m, got '7'"),
        (["failed", "purge", "--older-than", "soon"], r"--older-than: expected a duration"),
        (["failed", "list", "--limit", "0"], r"--limit"),
        (["failed", "list", "--topic", ""], r"--topic"),
        (["failed"], r"subcommand"),
        (["replay"], r"--from-id"),
        (["replay", "--from-id", "10", "--to-id", "5"], r"--to-id: must not be less than --from-id \(10\), got 5"),
        (["replay", "--from-id", "x"], r"--from-id"),
    ]
    for args, pattern in cases:
        res = cli(db, *args, check=False)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        assert re.search(pattern, res.stderr + res.stdout), (args, res.stderr)
    # A database that cannot be reached is not a usage error: exit 1.
    res = run_cli("failed", "list", env={"DATABASE_URL": "postgresql://u:p@127.0.0.1:1/x"}, check=False)
    assert res.returncode == 1 and "failed list failed" in res.stderr


# --- 4. retention ------------------------------------------------------------------------------

def test_4_retention_deletes_only_old_processed_rows_in_batches(db, relays, workdir):
    with db.connect() as conn:
        # Every DELETE statement on the outbox records how many rows it removed: the batches.
        conn.execute("CREATE TABLE delete_statements (n bigint, at timestamptz DEFAULT clock_timestamp())")
        # The relay's sessions run with search_path = pg_catalog, pg_temp (a writer's objects on its
        # role's path never run as the relay): a trigger that fires for its statements names its
        # objects schema-qualified, or brings its own search_path (docs/operations.md, "Security model").
        conn.execute("""CREATE FUNCTION log_deletes() RETURNS trigger LANGUAGE plpgsql AS $$
                        BEGIN INSERT INTO public.delete_statements (n) SELECT count(*) FROM old_rows; RETURN NULL;
                        END $$""")
        conn.execute("CREATE TRIGGER log_deletes AFTER DELETE ON outbox_events REFERENCING OLD TABLE AS old_rows "
                     "FOR EACH STATEMENT EXECUTE FUNCTION log_deletes()")

        def add(n, topic, processed=None, dead=None, created="now()", due="'-infinity'"):
            return [r[0] for r in conn.execute(
                f"INSERT INTO outbox_events (topic, aggregate_id, payload, created_at, processed_at, "
                f"  dead_lettered_at, next_attempt_at, attempts) "
                f"SELECT %s, 'k' || g, '{{}}', {created}, {processed or 'NULL'}, {dead or 'NULL'}, {due}, "
                f"  {1 if dead else 0} FROM generate_series(1, %s) g RETURNING id", (topic, n)).fetchall()]

        old = add(12_000, "old", processed="now() - interval '8 days'", created="now() - interval '9 days'")
        recent = add(10, "recent", processed="now() - interval '167 hours'", created="now() - interval '9 days'")
        dead = add(5, "dead", dead="now() - interval '30 days'", created="now() - interval '30 days'")
        waiting = add(3, "waiting", created="now() - interval '30 days'", due="now() + interval '1 day'")
    keep = set(recent + dead + waiting)

    port = free_port()
    config = ops_config(db, file_sink(workdir / "out.jsonl"), port, retention="168h", retention_interval="1s")
    relay = relays(config)
    line = relay.wait_log("retention deleted processed events", timeout=60)
    assert (line["deleted"], line["batches"], line["passes"], line["batch_size"], line["older_than"]) == (
        12_000, 12, 1, 1000, "7d")
    assert set(r[0] for r in db.query("SELECT id FROM outbox_events")) == keep
    assert [r[0] for r in db.query("SELECT n FROM delete_statements WHERE n > 0 ORDER BY at")] == [1000] * 12
    # Paced: a pause after each batch, 4 times as long as the batch took.
    at = [r[0] for r in db.query("SELECT at FROM delete_statements WHERE n > 0 ORDER BY at")]
    assert (at[-1] - at[0]).total_seconds() > 0.01 * 11
    assert wait_until(lambda: scrape(port).value("outbox_relay_retention_deleted_total") == 12_000,
                      message="retention counter")
    assert not set(old) & set(r[0] for r in db.query("SELECT id FROM outbox_events"))

    # The timer runs again: rows that age past the bound go at the pass after they do (a pass that
    # found nothing waits for the oldest processed row to age, here 3 s); dead letters and pending
    # rows never go.
    soon = [r[0] for r in db.query(
        "INSERT INTO outbox_events (topic, aggregate_id, payload, processed_at) SELECT 'soon', 'k', '{}', "
        "now() - interval '168 hours' + interval '3 seconds' FROM generate_series(1, 4) RETURNING id")]
    inserted = time.monotonic()
    wait_until(lambda: scrape(port).value("outbox_relay_retention_deleted_total") == 12_004, timeout=15,
               message="4 more deleted once they aged past the bound")
    assert time.monotonic() - inserted > 2.0, "deleted before they were 7 days old"
    assert set(r[0] for r in db.query("SELECT id FROM outbox_events")) == keep
    time.sleep(2.5)  # more passes: nothing else goes
    assert set(r[0] for r in db.query("SELECT id FROM outbox_events")) == keep
    assert not set(soon) & set(r[0] for r in db.query("SELECT id FROM outbox_events"))
    assert scrape(port).value("outbox_relay_retention_deleted_total") == 12_004
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE dead_lettered_at IS NOT NULL") == 5
    assert relay.stop() == 0


def test_retention_off_deletes_nothing(db, relays, workdir):
    with db.connect() as conn:
        conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload, processed_at) "
                     "SELECT 't', 'k', '{}', now() - interval '400 days' FROM generate_series(1, 50)")
    port = free_port()
    relay = relays(ops_config(db, file_sink(workdir / "out.jsonl"), port))
    wait_ready(port)
    time.sleep(1.0)
    assert db.scalar("SELECT count(*) FROM outbox_events") == 50
    assert not [l for l in relay.logs() if "retention" in l.get("msg", "")]
    assert relay.stop() == 0


# --- logs ---------------------------------------------------------------------------------------

def test_logs_are_json_lines_and_follow_log_level(db, relays, workdir):
    port = free_port()
    config = ops_config(db, file_sink(workdir / "out.jsonl"), port, retention="1h", retention_interval="1s")
    debug = relays(config, args=("--log-level", "debug"))
    debug.wait_log("retention found nothing to delete")
    assert debug.stop() == 0
    lines = debug.raw_logs().splitlines()
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "msg"} <= set(p) for p in parsed)
    assert {"debug", "info"} <= {p["level"] for p in parsed}
    assert db.url.split(":")[2].split("@")[0] not in debug.raw_logs()  # the password never appears

    quiet = relays(config, args=("--log-level", "warn"))
    wait_ready(port)
    time.sleep(1.5)
    assert quiet.stop() == 0
    assert [json.loads(line)["level"] for line in quiet.raw_logs().splitlines()] == []


# --- 5. packaging ------------------------------------------------------------------------------

CHECK_PACKAGING = ROOT / "tests" / "ops" / "check-packaging.sh"


def test_5_alert_rules_and_compose_file_validate():
    res = subprocess.run(["bash", str(CHECK_PACKAGING)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OUTBOX_RELAY_BIN": str(RELAY_BIN)})
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    if shutil.which("promtool") or (Path.home() / ".cache/outbox-relay/bin/promtool").exists():
        assert re.search(r"^ok: promtool check rules .*alerts\.yml", out, re.M), out
        assert re.search(r"^ok: promtool test rules", out, re.M), out
    else:
        assert re.search(r"^ok: alert rules schema check", out, re.M), out
    assert re.search(r"^ok: docker-compose config", out, re.M), out
    assert "FAIL" not in out


def test_5_packaging_check_rejects_broken_files(tmp_path):
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    broken_rules = tmp_path / "alerts.yml"
    broken_rules.write_text(rules.replace("expr: ", "expr: sum(", 1))
    res = subprocess.run(["bash", str(CHECK_PACKAGING), "rules"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUTBOX_ALERT_RULES": str(broken_rules)})
    assert res.returncode != 0 and "FAIL" in res.stdout, res.stdout + res.stderr

    compose = (ROOT / "docker-compose.yml").read_text()
    broken_compose = tmp_path / "docker-compose.yml"
    broken_compose.write_text(compose.replace("services:", "services:\n  broken:\n    image: [not, a, string]", 1))
    res = subprocess.run(["bash", str(CHECK_PACKAGING), "compose"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUTBOX_COMPOSE_FILE": str(broken_compose)})
    assert res.returncode != 0 and "FAIL" in res.stdout, res.stdout + res.stderr
