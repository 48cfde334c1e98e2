"""Integration harness: a real PostgreSQL cluster started by the test run, a fresh database per
test, and the real outbox-relay binary run as a child process (real signals, real kills)."""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
RELAY_BIN = Path(os.environ.get("OUTBOX_RELAY_BIN", ROOT / "build" / "bin" / "outbox-relay"))
PG_CLUSTER = ROOT / "scripts" / "pg-cluster.sh"


def wait_until(predicate, timeout=30.0, interval=0.05, message="condition"):
    """Polls predicate until it returns a truthy value; fails the test after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value: {last!r})")


def _below_ephemeral_range() -> tuple[int, int]:
    """Ports the kernel never hands to an outgoing connection: below its ephemeral range. A server
    given a port from that range can find it taken by the time it binds (a RabbitMQ node's own
    connection to epmd took its AMQP port once: eaddrinuse)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return (10000, low - 1) if low > 11000 else (low + 20000, 65000)


def free_ports(n: int) -> list[int]:
    """n different free ports below the ephemeral range: each socket stays bound until all are
    chosen, so that no port is handed out twice."""
    lo, hi = _below_ephemeral_range()
    sockets = []
    try:
        while len(sockets) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", random.randint(lo, hi)))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def make_tls_files(directory: Path) -> dict:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=outbox-test-ca")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN=outbox-test-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return {"ca": str(directory / "ca.pem"), "cert": str(directory / "server.pem"), "key": str(directory / "server.key"),
            "client_cert": str(directory / "client.pem"), "client_key": str(directory / "client.key")}


class Cluster:
    """One throwaway PostgreSQL 15 cluster (scripts/pg-cluster.sh)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.url = subprocess.check_output([str(PG_CLUSTER), "start", str(directory)],
                                           env={**os.environ, "PG_FAST": os.environ.get("PG_FAST", "1")},
                                           text=True).strip()

    def url_for(self, dbname: str) -> str:
        return self.url.rsplit("/", 1)[0] + "/" + dbname

    def restart(self):
        subprocess.check_call([str(PG_CLUSTER), "restart", str(self.dir)])

    def stop_server(self):
        subprocess.check_call([str(PG_CLUSTER), "stop", str(self.dir)])

    def start_server(self):
        cmd = ["/usr/lib/postgresql/15/bin/pg_ctl", "-D", str(self.dir / "data"), "-l",
               str(self.dir / "server.log"), "-w", "-t", "60", "start"]
        if os.getuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        subprocess.check_call(cmd, stdout=subprocess.DEVNULL)


class Database:
    """A fresh database in the session's cluster, migrated with `outbox-relay migrate`."""

    def __init__(self, cluster: Cluster, name: str):
        self.cluster = cluster
        self.name = name
        self.url = cluster.url_for(name)

    def connect(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, **kwargs)

    def query(self, sql, params=None):
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def scalar(self, sql, params=None):
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def migrate(self, *extra):
        return run_cli("migrate", *extra, env={"DATABASE_URL": self.url})

    def insert(self, rows, table="outbox_events"):
        """rows: iterable of (topic, key, payload_dict[, headers_dict]). Returns the ids."""
        ids = []
        with self.connect() as conn, conn.transaction():
            for row in rows:
                topic, key, payload = row[:3]
                headers = row[3] if len(row) > 3 else {}
                ids.append(conn.execute(
                    f"INSERT INTO {table} (topic, aggregate_id, payload, headers) VALUES (%s, %s, %s, %s) RETURNING id",
                    (topic, key, json.dumps(payload), json.dumps(headers))).fetchone()[0])
        return ids


def run_cli(*args, env=None, timeout=60, check=True):
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([str(RELAY_BIN), *args], env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"outbox-relay {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def yaml_config(config: dict) -> str:
    # JSON is YAML: no YAML library needed to write configs.
    return json.dumps(config, indent=2)


class Relay:
    """The real binary as a child process. Logs (JSON lines on stderr) go to a file."""

    def __init__(self, config: dict, workdir: Path, env=None, name="relay", args=()):
        self.workdir = workdir
        self.config_path = workdir / f"{name}-{uuid.uuid4().hex[:6]}.yaml"
        self.config_path.write_text(yaml_config(config))
        self.log_path = workdir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self._log = open(self.log_path, "w")
        self.stdout_path = workdir / f"{name}-stdout-{uuid.uuid4().hex[:6]}.jsonl"
        self._stdout = open(self.stdout_path, "w")
        self.proc = subprocess.Popen([str(RELAY_BIN), "run", "--config", str(self.config_path), *args],
                                     env={**os.environ, **(env or {})}, stdout=self._stdout, stderr=self._log)

    def logs(self):
        lines = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                lines.append(json.loads(line))
        return lines

    def raw_logs(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, msg_pattern: str, timeout=30.0):
        regex = re.compile(msg_pattern)
        return wait_until(lambda: next((l for l in self.logs() if regex.search(l.get("msg", ""))), None),
                          timeout=timeout, message=f"log line matching {msg_pattern!r}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self):
        self._log.close()
        self._stdout.close()


@contextlib.contextmanager
def throwaway_cluster(prefix="outbox-it-"):
    """A PostgreSQL cluster in a temp dir, stopped and deleted afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)
    c = Cluster(base / "pg")
    try:
        yield c
    finally:
        subprocess.call([str(PG_CLUSTER), "stop", str(c.dir)])
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    with throwaway_cluster() as c:
        yield c


def run_config(workdir: Path, config: dict, timeout=10) -> subprocess.CompletedProcess:
    """`outbox-relay run` on a config, with a bare environment (no DATABASE_URL to fall back on)."""
    path = workdir / "config-under-test.yaml"
    path.write_text(yaml_config(config))
    return subprocess.run([str(RELAY_BIN), "run", "--config", str(path)], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin"})


@contextlib.contextmanager
def fresh_database(cluster):
    """A new migrated database in the cluster, dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    d = Database(cluster, name)
    d.migrate()
    yield d
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        # The relay of a failed test may still be connected.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        conn.execute(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture
def db(cluster):
    with fresh_database(cluster) as d:
        yield d


@pytest.fixture
def workdir(tmp_path):
    os.chmod(tmp_path, 0o755)
    return tmp_path


@pytest.fixture
def relays(workdir):
    """Factory: relays(config, **kw) starts a relay; all are stopped (killed if stuck) at teardown."""
    started = []

    def start(config, **kwargs):
        r = Relay(config, workdir, **kwargs)
        started.append(r)
        return r

    yield start
    for r in started:
        if r.alive():
            r.kill()


def base_config(db: Database, sinks: list, **relay_overrides) -> dict:
    relay = {"batch_size": 500, "sweep_interval": "30s", "lease": "60s",
             "backoff": {"initial": "100ms", "max": "2s"}, "rebalance_interval": "500ms"}
    relay.update(relay_overrides)
    return {"database": {"url": db.url}, "relay": relay, "http": {"enabled": False}, "sinks": sinks}


def file_sink(path) -> list:
    """A sinks list of one file sink named audit."""
    return [{"name": "audit", "type": "file", "path": str(path)}]


def unique(prefix: str) -> str:
    """prefix plus 8 random hex digits: a topic, stream or key no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"



def http_get(port: int, path: str):
    """(status, body text) of GET http://127.0.0.1:port/path on a relay's HTTP server; a 503 is an
    answer, not an error; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def metric(text: str, name: str):
    """The value of the first sample of `name` in a /metrics exposition (name may carry its labels,
    as exposed: 'x_total{source="notify"}'), or None."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None

def pending(db: Database) -> int:
    """Events neither processed nor dead-lettered."""
    return db.scalar("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_lettered_at IS NULL")


def rows_by_id(db: Database) -> dict:
    """Every row by id: (topic, aggregate_id, payload, headers (both as text), created_at, processed_at,
    attempts, dead_lettered_at, last_error)."""
    return {r[0]: r[1:] for r in db.query(
        "SELECT id, topic, aggregate_id, payload::text, headers::text, created_at, processed_at, attempts, "
        "dead_lettered_at, last_error FROM outbox_events")}


def read_jsonl(path: Path):
    """Complete JSON lines of a file (a line still being written is ignored)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().split("\n")[:-1]:
        out.append(json.loads(line))
    return out


class Writers:
    """Concurrent writer connections inserting events, like an application would."""

    def __init__(self, db: Database, count: int, per_writer: int, keys: int, topic="order.paid", batch=20,
                 pause=0.0, retry_on_error=False):
        self.db, self.count, self.per_writer, self.keys = db, count, per_writer, keys
        self.topic, self.batch, self.pause, self.retry_on_error = topic, batch, pause, retry_on_error
        self.errors = []
        self.inserted = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(count)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        """Ends every writer after its current transaction; per_writer is then only a cap."""
        self._stop.set()
        return self.join()

    def join(self, timeout=300):
        for t in self.threads:
            t.join(timeout)
        assert not self.errors, self.errors[:3]
        return self

    def _run(self, w):
        import random
        rnd = random.Random(w)
        done = 0
        conn = None
        while done < self.per_writer and not self._stop.is_set():
            try:
                if conn is None:
                    conn = self.db.connect()
                n = min(self.batch, self.per_writer - done)
                with conn.transaction():
                    with conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO outbox_events (topic, aggregate_id, payload) VALUES (%s, %s, %s)",
                            [(self.topic, f"key-{rnd.randrange(self.keys)}", json.dumps({"w": w, "n": done + i}))
                             for i in range(n)])
                done += n
                with self._lock:
                    self.inserted += n
                if self.pause:
                    time.sleep(self.pause)
            except psycopg.OperationalError as e:
                if not self.retry_on_error:
                    self.errors.append(repr(e))
                    return
                # The transaction did not commit (or we cannot know): Postgres is restarting.
                # An in-doubt commit is checked by the test through exact id accounting instead.
                conn = None
                time.sleep(0.2)
        if conn is not None:
            conn.close()


def assert_no_dead_letters(db):
    """Nothing dead-lettered; else the count and the reasons, most frequent first."""
    reasons = db.query("SELECT count(*), left(last_error, 300) FROM outbox_events WHERE dead_lettered_at IS NOT NULL "
                       "GROUP BY 2 ORDER BY 1 DESC LIMIT 5")
    assert not reasons, f"{sum(n for n, _ in reasons)}+ events dead-lettered; reasons (count, last_error): {reasons}"


def check_held_keys_caught_up(db, messages, order: dict, ids, held: dict):
    """The end of the pipelined sinks' failure tests (nats, rabbitmq), once nothing is pending:
    nothing dead-lettered, every id once (`order`: the sink's check_order() of `messages`, which
    asserts per-key order), and each held key's events (`held`: key -> ids) all there, in id order."""
    assert_no_dead_letters(db)
    assert order["duplicates"] == 0 and order["ids"] == set(ids)
    for key, key_ids in held.items():
        assert [m.outbox_id for m in messages if m.key == key] == key_ids


def check_failed_events_hold_their_keys(db, held_ids, held2_ids, other_ids, what, error_fragment):
    """The pipelined sinks' failure tests (nats, rabbitmq): once every event of the other keys is
    delivered, the failed events (held_ids[1], held2_ids[0]) have been retried, the held keys'
    later events are not delivered, and the other keys went through at their first attempt."""
    wait_until(lambda: db.scalar("SELECT count(*) FROM outbox_events WHERE id = ANY(%s) AND processed_at IS NOT NULL",
                                 (other_ids,)) == len(other_ids),
               timeout=60, message="every event of the other keys delivered")
    # Two retries at least: the failure was seen again after later batches went in.
    wait_until(lambda: db.scalar("SELECT min(attempts) FROM outbox_events WHERE id = ANY(%s)",
                                 ([held_ids[1], held2_ids[0]],)) >= 2, timeout=30, message=f"the {what} events retried")
    state = {r[0]: r[1:] for r in db.query(
        "SELECT id, processed_at IS NOT NULL, attempts, last_error FROM outbox_events WHERE id = ANY(%s)",
        (held_ids + held2_ids,))}
    assert state[held_ids[0]][0], f"the held key's event before the {what} one is delivered"
    for failed in (held_ids[1], held2_ids[0]):
        assert not state[failed][0], f"the {what} event is being retried"
        assert error_fragment in state[failed][2], state[failed][2]
    for oid in held_ids[2:] + held2_ids[1:]:
        assert not state[oid][0], f"event {oid} of a held key was delivered while an earlier one is retried"
    assert db.scalar("SELECT max(attempts) FROM outbox_events WHERE id = ANY(%s)", (other_ids,)) == 0, \
        "the other keys were delivered at their first attempt"
