"""Redis for the integration tests: a real redis-server (Debian's redis-server package) started on
a free 127.0.0.1 port in a temp dir, with the append-only file fsynced on every write so a
SIGKILL loses nothing Redis acknowledged; and a reader of a stream with redis-py. Import the
fixtures into a test module:

    from redis_fixtures import redis_server, own_redis_server, read_stream, check_order  # noqa: F401
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from conftest import free_port, wait_until

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """One redis-server process in its own directory. start() blocks until it answers PING."""

    def __init__(self, directory: Path, extra_args=(), tls: dict | None = None):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.extra = list(extra_args)
        self.tls = tls  # {"cert", "key", "ca"}: TLS only, clients must present a certificate
        self.proc = None
        self.admin = None  # (username, password) once the default user is turned off

    def args(self):
        a = [REDIS_SERVER, "--bind", "127.0.0.1", "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log"),
             "--daemonize", "no", "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--protected-mode", "no"]
        if self.tls:
            a += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls["cert"],
                  "--tls-key-file", self.tls["key"], "--tls-ca-cert-file", self.tls["ca"], "--tls-auth-clients", "yes"]
        else:
            a += ["--port", str(self.port)]
        return a + self.extra

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> redis.Redis:
        if self.admin:
            kwargs.setdefault("username", self.admin[0])
            kwargs.setdefault("password", self.admin[1])
        if self.tls:
            kwargs.update(ssl=True, ssl_ca_certs=self.tls["ca"], ssl_certfile=self.tls["cert"],
                          ssl_keyfile=self.tls["key"])
        kwargs.setdefault("socket_timeout", 30)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self):
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: "
                                   f"{(self.dir / 'redis.log').read_text()[-2000:]}")
            try:
                with self.client(socket_timeout=1) as c:
                    return c.ping()
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                return False
        wait_until(ready, timeout=30, message="redis-server answers PING")
        return self

    def kill(self):
        """SIGKILL, like a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def restart(self):
        """Starts again on the same port with the same data (the append-only file)."""
        return self.start()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Entry:
    entry_id: str
    fields: dict

    @property
    def outbox_id(self) -> int:
        return int(self.fields["id"])

    @property
    def key(self) -> str:
        return self.fields["key"]


def read_stream(client: redis.Redis, stream: str, page: int = 10_000) -> list[Entry]:
    """Every entry of a stream in stream order, fields decoded as UTF-8."""
    out = []
    start = "-"
    while True:
        chunk = client.xrange(stream, min=start, max="+", count=page)
        for entry_id, fields in chunk:
            out.append(Entry(entry_id.decode(), {k.decode(): v.decode() for k, v in fields.items()}))
        if len(chunk) < page:
            return out
        start = "(" + chunk[-1][0].decode()


def check_order(entries: list[Entry]) -> dict:
    """Per key, the first occurrence of each event id must come in increasing id order (a stream
    has one order, the order every consumer reads). Returns {"duplicates": n, "ids": set(...)}."""
    seen = set()
    last = {}
    duplicates = 0
    for e in entries:
        oid = e.outbox_id
        if oid in seen:
            duplicates += 1
            continue
        seen.add(oid)
        assert oid > last.get(e.key, 0), f"key {e.key}: id {oid} arrived after {last[e.key]}"
        last[e.key] = oid
    return {"duplicates": duplicates, "ids": seen}


def _new_server(**kwargs) -> RedisServer:
    base = Path(tempfile.mkdtemp(prefix="outbox-redis-"))
    return RedisServer(base / "redis", **kwargs)


@pytest.fixture(scope="session")
def redis_server():
    """One server for the whole session. Tests use streams of their own."""
    server = _new_server().start()
    yield server
    server.stop()
    shutil.rmtree(server.dir.parent, ignore_errors=True)


@pytest.fixture
def own_redis_server():
    """Factory for servers of one test, which may kill and restart them: own_redis_server(**kw)."""
    started = []

    def make(**kwargs):
        server = _new_server(**kwargs)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
        shutil.rmtree(server.dir.parent, ignore_errors=True)


def entry_headers(entry: Entry) -> dict:
    return json.loads(entry.fields["headers"])
