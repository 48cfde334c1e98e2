"""NATS for the integration tests: a real nats-server (Debian's package) with JetStream, started by
the test run on a free 127.0.0.1 port with its store in a temp dir, and a reader that takes a
stream back completely with the ecosystem's own client (nats-py). Import into a test module:

    from nats_fixtures import nats_server, own_nats_server, read_stream, check_order  # noqa: F401
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    """One nats-server process with JetStream in its own directory. start() blocks until
    JetStream answers; kill() is SIGKILL; start() again reuses the port and the store."""

    def __init__(self, directory: Path, user: str | None = None, password: str | None = None):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.user, self.password = user, password
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def client_url(self) -> str:
        if self.user:
            return f"nats://{self.user}:{self.password}@127.0.0.1:{self.port}"
        return self.url

    def start(self, timeout=30.0):
        cmd = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.dir / "store"),
               "-l", str(self.dir / "server.log")]
        if self.user:
            cmd += ["--user", self.user, "--pass", self.password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited {self.proc.returncode}: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                self.run(self._account_info())
                return self
            except Exception as e:  # not listening yet, or JetStream not ready yet
                last = e
                time.sleep(0.1)
        raise RuntimeError(f"nats-server did not become ready: {last!r}\n{self.log_tail()}")

    def kill(self):
        """SIGKILL, like a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n=3000) -> str:
        path = self.dir / "server.log"
        return path.read_text()[-n:] if path.exists() else ""

    # -- the ecosystem's own client ------------------------------------------------------------
    @staticmethod
    def run(coro):
        return asyncio.run(coro)

    async def _connect(self):
        async def quiet(_error):
            pass  # failures surface as exceptions of the calls; nats-py would print tracebacks
        return await nats.connect(self.client_url, connect_timeout=2, max_reconnect_attempts=0,
                                  allow_reconnect=False, error_cb=quiet)

    async def _account_info(self):
        nc = await self._connect()
        try:
            return await nc.jetstream().account_info()
        finally:
            await nc.close()

    def add_stream(self, name: str, subjects: list[str], **config):
        async def go():
            nc = await self._connect()
            try:
                await nc.jetstream().add_stream(StreamConfig(name=name, subjects=subjects, **config))
            finally:
                await nc.close()
        self.run(go())

    def publish(self, subject: str, data: bytes):
        """One message through JetStream (waits for its PubAck)."""
        async def go():
            nc = await self._connect()
            try:
                await nc.jetstream().publish(subject, data)
            finally:
                await nc.close()
        self.run(go())

    def purge_stream(self, name: str, subject: str | None = None):
        """Removes the stream's messages (of `subject` only, when given)."""
        async def go():
            nc = await self._connect()
            try:
                await nc.jetstream().purge_stream(name, subject=subject)
            finally:
                await nc.close()
        self.run(go())

    def stream_count(self, name: str) -> int:
        async def go():
            nc = await self._connect()
            try:
                return (await nc.jetstream().stream_info(name)).state.messages
            finally:
                await nc.close()
        return self.run(go())


@dataclass
class Message:
    seq: int  # stream sequence: the order the stream stored it in
    subject: str
    data: bytes
    headers: dict = field(default_factory=dict)

    @property
    def outbox_id(self) -> int:
        return int(self.headers["outbox-id"])

    @property
    def key(self) -> str:
        return self.headers["outbox-key"]


def read_stream(server: NatsServer, stream: str, timeout=120.0) -> list[Message]:
    """Every message of the stream, in stream order, through a pull consumer (nats-py)."""
    async def go():
        nc = await server._connect()
        try:
            js = nc.jetstream()
            total = (await js.stream_info(stream)).state.messages
            sub = await js.pull_subscribe("", durable=None, stream=stream, config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=60.0))
            out = []
            deadline = time.monotonic() + timeout
            while len(out) < total and time.monotonic() < deadline:
                try:
                    batch = await sub.fetch(batch=min(2000, total - len(out)), timeout=5)
                except nats.errors.TimeoutError:
                    continue
                for m in batch:
                    out.append(Message(m.metadata.sequence.stream, m.subject, m.data, dict(m.headers or {})))
            await sub.unsubscribe()
            return sorted(out, key=lambda m: m.seq)
        finally:
            await nc.close()
    return server.run(go())


def check_order(messages: list[Message]) -> dict:
    """Per key, the first copies of events arrive in id order. Returns ids and duplicate count."""
    last = {}
    seen = set()
    duplicates = 0
    for m in messages:
        oid = m.outbox_id
        if oid in seen:
            duplicates += 1
            continue
        seen.add(oid)
        prev = last.get(m.key)
        assert prev is None or oid > prev, f"key {m.key}: event {oid} stored after {prev}"
        last[m.key] = oid
    return {"ids": seen, "duplicates": duplicates}


@pytest.fixture(scope="session")
def nats_server():
    """One server for the tests that do not stop it."""
    base = Path(tempfile.mkdtemp(prefix="outbox-nats-"))
    server = NatsServer(base).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def own_nats_server():
    """A server of the test's own, for tests that kill it."""
    base = Path(tempfile.mkdtemp(prefix="outbox-nats-"))
    server = NatsServer(base).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def nats_server_with_password(user: str, password: str):
    """A context manager: a server that requires user/password."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        base = Path(tempfile.mkdtemp(prefix="outbox-nats-"))
        server = NatsServer(base, user=user, password=password).start()
        try:
            yield server
        finally:
            server.stop()
            shutil.rmtree(base, ignore_errors=True)
    return cm()
