"""Issue 10, defect 7: connection poolers, with a real PgBouncer (Debian's package) started by the
test itself on a free port, with its own ini and userlist in a temp dir.

The relay needs a session of its own (LISTEN, session advisory locks for lanes and membership):
behind a transaction pooler it refuses (exit 2 at start naming database.url; after a reconnect, a
readiness reason) and claims nothing; behind a session pooler it works like a direct connection.
Writers may use any pooler."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from conftest import RELAY_BIN, Database, Writers, base_config, file_sink, free_port, pending, read_jsonl, wait_until
from test_core import assert_per_key_order

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

pytestmark = pytest.mark.skipif(not os.path.exists(PGBOUNCER),
                                reason="pgbouncer is not installed (scripts/install-deps.sh installs it)")


class PgBouncer:
    """One PgBouncer process in front of a test database, in the given pool_mode."""

    def __init__(self, db, directory: Path, mode: str):
        self.db = db
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        user, password, host, pg_port = self._parts(db.url)
        self.user, self.password = user, password
        self.upstream = (host, pg_port)
        (self.dir / "userlist.txt").write_text(f'"{user}" "{password}"\n')
        self._write_ini(mode)
        run_as = {}
        if os.getuid() == 0:  # pgbouncer refuses to run as root
            pg = pwd.getpwnam("postgres")
            for p in [self.dir, *self.dir.iterdir()]:
                os.chown(p, pg.pw_uid, pg.pw_gid)
            run_as = {"user": pg.pw_uid, "group": pg.pw_gid, "extra_groups": []}
        os.chmod(self.dir, 0o700)
        self._stderr = open(self.dir / "stderr.log", "w")
        self.proc = subprocess.Popen([PGBOUNCER, str(self.dir / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, **run_as)
        wait_until(self._listening, timeout=15, message=f"pgbouncer listening on {self.port}")

    @staticmethod
    def _parts(url):
        # postgresql://user:password@host:port/dbname
        rest = url.split("://", 1)[1]
        creds, location = rest.rsplit("@", 1)
        user, password = creds.split(":", 1)
        hostport = location.split("/", 1)[0]
        host, port = hostport.rsplit(":", 1)
        return user, password, host, int(port)

    def _write_ini(self, mode):
        host, pg_port = self.upstream
        self.mode = mode
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
{self.db.name} = host={host} port={pg_port} dbname={self.db.name}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {self.dir / 'userlist.txt'}
pool_mode = {mode}
default_pool_size = 40
max_client_conn = 200
logfile = {self.dir / 'pgbouncer.log'}
""")

    def _listening(self):
        assert self.proc.poll() is None, f"pgbouncer exited: {self.log()}"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def set_mode(self, mode):
        """Changes pool_mode (SIGHUP reloads the ini); connections opened from now on use it."""
        reloads = self.log().count("re-reading config")
        self._write_ini(mode)
        self.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: self.log().count("re-reading config") > reloads, timeout=10, message="pgbouncer reloaded")

    def log(self):
        return "".join(p.read_text() for p in (self.dir / "pgbouncer.log", self.dir / "stderr.log") if p.exists())

    @property
    def url(self):
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.db.name}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


@pytest.fixture
def bouncers(db):
    """Factory: bouncers(mode) starts a PgBouncer in front of the test database; all are stopped
    and their directories deleted. (A temp dir of its own: pytest's is closed to the postgres user.)"""
    base = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-"))
    os.chmod(base, 0o755)
    started = []

    def start(mode):
        b = PgBouncer(db, base / f"{len(started)}-{mode}", mode)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()
    shutil.rmtree(base, ignore_errors=True)


class TransactionPooled(Database):
    def connect(self, **kwargs):
        return super().connect(prepare_threshold=None, **kwargs)


def advisory_locks(db):
    return db.scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except urllib.error.URLError:
        return None, None  # not listening yet


POOLER_MESSAGE = (
    "outbox-relay: config error: database.url leads to a transaction-pooling proxy (such as PgBouncer with "
    "pool_mode = transaction or statement): a session of the relay does not keep a server backend of its own. "
    "The relay needs one for LISTEN and its advisory locks: connect it to PostgreSQL directly or through a "
    "session pool (pool_mode = session); writers may keep using the transaction pool\n")

READY_REASON = "database.url leads to a transaction pooler: the relay needs a direct or session-pooled connection"
NOT_READY = (503, {"ready": False, "reasons": [READY_REASON, "LISTEN session down"]})


@pytest.mark.parametrize("mode", ["transaction", "statement"])
def test_run_behind_a_transaction_pooler_exits_2_naming_database_url_and_claims_nothing(db, bouncers, workdir,
                                                                                       mode):
    tx = bouncers(mode)
    # Writers may use the transaction pool: the outbox INSERT needs nothing from the session.
    with psycopg.connect(tx.url, autocommit=True, prepare_threshold=None) as conn:
        for i in range(20):
            conn.execute("INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES ('order.paid', %s, '{}')",
                         (f"key-{i % 4}",))
    assert pending(db) == 20
    out = workdir / "events.jsonl"
    config = base_config(db, file_sink(out))
    config["database"]["url"] = tx.url
    path = workdir / "relay.yaml"
    path.write_text(json.dumps(config))
    started = time.monotonic()
    proc = subprocess.run([str(RELAY_BIN), "run", "--config", str(path)], capture_output=True, text=True,
                          timeout=20, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - started < 15
    assert proc.stderr.endswith(POOLER_MESSAGE), proc.stderr
    assert tx.password not in proc.stderr
    # Nothing claimed, nothing published, nothing left behind on the pooled server backends.
    assert pending(db) == 20
    assert db.scalar("SELECT count(*) FROM outbox_events WHERE lease_owner IS NOT NULL OR attempts > 0") == 0
    assert read_jsonl(out) == []
    assert advisory_locks(db) == 0
    # The server backends behind the pool are still there (the pool keeps them): the check above
    # counted locks on live sessions, not on closed ones.
    assert db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                     (db.name,)) >= 1


def test_two_relays_behind_a_session_pooler_deliver_every_event_once_in_key_order(db, bouncers, relays, workdir):
    session = bouncers("session")
    tx = bouncers("transaction")
    out_a, out_b = workdir / "a.jsonl", workdir / "b.jsonl"
    config_a, config_b = base_config(db, file_sink(out_a)), base_config(db, file_sink(out_b))
    config_a["database"]["url"] = config_b["database"]["url"] = session.url
    a = relays(config_a, name="a")
    a.wait_log("ordering lanes rebalanced")
    b = relays(config_b, name="b")
    wait_until(lambda: any(l.get("lanes_owned") == 32 for l in b.logs()), timeout=30, message="b owns 32 lanes")
    wait_until(lambda: any(l.get("lanes_owned") == 32 for l in a.logs()), timeout=30, message="a owns 32 lanes")
    # Writers through the transaction pool, as applications behind PgBouncer do (without named
    # prepared statements, which PgBouncer 1.18 does not carry across transactions).
    writer_db = TransactionPooled(db.cluster, db.name)
    writer_db.url = tx.url
    Writers(writer_db, count=4, per_writer=2500, keys=200).start().join()
    wait_until(lambda: pending(db) == 0, timeout=120, message="no pending rows")
    lines_a, lines_b = read_jsonl(out_a), read_jsonl(out_b)
    got = sorted(l["id"] for l in lines_a + lines_b)
    assert got == [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert len(got) == 10_000, "every event exactly once across both relays"
    assert lines_a and lines_b, "both relays took part"
    assert_per_key_order(lines_a)
    assert_per_key_order(lines_b)
    # Two members, each with its lane-groups lock, and 64 lanes: exactly 2 + 2 + 64 advisory
    # locks, none piled up.
    assert advisory_locks(db) == 68
    assert not any(l["level"] in ("warn", "error") for l in a.logs() + b.logs()), \
        [l for l in a.logs() + b.logs() if l["level"] in ("warn", "error")][:3]
    assert a.stop() == 0 and b.stop() == 0
    assert advisory_locks(db) == 0


def test_a_transaction_pooler_after_a_reconnect_is_a_readiness_reason_and_claims_nothing(db, bouncers, relays,
                                                                                       workdir):
    pool = bouncers("session")
    out = workdir / "events.jsonl"
    http_port = free_port()
    config = base_config(db, file_sink(out))
    config["database"]["url"] = pool.url
    config["http"] = {"enabled": True, "listen": f"127.0.0.1:{http_port}"}
    relay = relays(config)
    wait_until(lambda: readyz(http_port)[0] == 200, timeout=30, message="ready through the session pool")
    db.insert([("order.paid", f"key-{i % 3}", {"i": i}) for i in range(5)])
    wait_until(lambda: len(read_jsonl(out)) == 5, timeout=30, message="5 events delivered")
    # ... and marked (a steady stream's marks follow the sink by up to 50 ms).
    wait_until(lambda: pending(db) == 0, timeout=10, message="5 events marked")

    # The pool turns into a transaction pool, and the relay's sessions are cut: it reconnects.
    pool.set_mode("transaction")
    with db.connect() as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                     "AND pid <> pg_backend_pid()", (db.name,))
    wait_until(lambda: readyz(http_port) == NOT_READY, timeout=30, message="not ready, naming the pooler")
    errors = [l for l in relay.logs() if l["level"] == "error"]
    assert [l["msg"] for l in errors] == [
        "refusing to work through a transaction pooler; not claiming until database.url leads to a session of "
        "our own"]
    assert errors[0]["error"].startswith("database.url leads to a transaction-pooling proxy")
    db.insert([("order.paid", f"key-{i % 3}", {"i": i}) for i in range(5, 10)])
    time.sleep(3)  # several reconnect attempts, each refused
    assert relay.alive()
    assert len(read_jsonl(out)) == 5, "nothing claimed through the transaction pool"
    assert pending(db) == 5
    assert advisory_locks(db) == 0, "no lane or membership lock taken on a pooled backend"
    assert readyz(http_port) == NOT_READY
    # The LISTEN session refuses the pooler too (its LISTEN would land on a shared backend).
    assert any(l["msg"] == "LISTEN session lost, will reconnect"
               and l["error"].startswith("database.url leads to a transaction-pooling proxy") for l in relay.logs())

    # Back to a session pool: the next reconnect passes the check and the relay catches up.
    pool.set_mode("session")
    wait_until(lambda: readyz(http_port)[0] == 200, timeout=60, message="ready again")
    wait_until(lambda: len(read_jsonl(out)) == 10, timeout=30, message="all 10 events delivered")
    assert sorted(l["id"] for l in read_jsonl(out)) == [r[0] for r in db.query("SELECT id FROM outbox_events ORDER BY id")]
    assert_per_key_order(read_jsonl(out))
    assert relay.stop() == 0
